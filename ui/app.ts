/*
 * The reference client of the API, on ocp-api-client: a runs list (status
 * and "needs an answer" filters, paging), a run page (what failed or waits,
 * the counts, a timeline drawn from its events, the tasks, its activity), a
 * task's story (its attempts and threads), a thread's messages, and the
 * latest activity, each kept live by the client's list-then-watch (it
 * refetches what it shows on events and starts over by itself on 410
 * cursor_expired). This file draws, and signs in when the service needs a
 * token (the end of the file); dom.ts and timeline.ts are what it draws with.
 */
import { backoff, delay, type EventFilter } from '../client/src/client.ts'
import { ApiError, createClient, CursorExpired, MAX_PAGE_LIMIT, type Artifact, type AuthInfo, type BlockedTask, type Event, type Live, type Read, type RunDetailEnvelope, type RunList, type SignIn, type StreamStatus, type Task, type TaskAttempt, type TaskDetailEnvelope, type ThreadDetailEnvelope } from '../client/src/index.ts'
import { follow } from '../client/src/live.ts'
import { age, h, runHref, statusBadge, statusClass, taskHref, threadHref, time } from './dom.ts'
import { Timeline } from './timeline.ts'

// Streams open with a stream token scoped to what they show (when the page holds a token at all): the token the
// user signed in with never goes in a URL.
const client = createClient({ url: location.origin, streamTokens: true })

/**
 * Draws the relative times under `root` again every second (their finest
 * unit), so that "12 s ago" does not stay put between snapshots. One timer
 * for the page shown; the returned function stops it.
 */
function keepTimesCurrent (root: HTMLElement): () => void {
  const timer = setInterval(() => {
    for (const stamp of root.querySelectorAll('time')) {
      const text = age(stamp.dateTime)
      // Only what changed: the rest of the page is left alone (selection, screen readers).
      if (stamp.textContent !== text) stamp.textContent = text
    }
  }, 1000)
  return () => clearInterval(timer)
}

/** Task counts as a compact bar, with the same counts in words beside it. */
function countsBar (counts: Record<string, number>, total: number): HTMLElement {
  const entries = Object.entries(counts).sort(([a], [b]) => a.localeCompare(b))
  const bar = h('div', { class: 'bar', role: 'img', 'aria-label': entries.map(([status, n]) => `${n} ${status}`).join(', ') || 'no tasks' })
  for (const [status, n] of entries) {
    const segment = h('span', { class: `bar-${statusClass(status)}` })
    // Through the CSSOM: a style attribute is an inline style, which the content security policy refuses.
    segment.style.width = `${(100 * n) / Math.max(total, 1)}%`
    bar.append(segment)
  }
  const legend = h('p', { class: 'legend' }, entries.length === 0 ? 'no tasks' : entries.map(([status, n]) => `${n} ${status}`).join(' · '))
  return h('div', {}, bar, legend)
}

function jsonDetails (label: string, value: unknown): HTMLElement {
  return h('details', {}, h('summary', {}, label), h('pre', {}, JSON.stringify(value, null, 2)))
}

function artifactList (artifacts: Artifact[] | undefined): HTMLElement | null {
  if (artifacts === undefined || artifacts.length === 0) return null
  return h('ul', { class: 'artifacts' }, ...artifacts.map((artifact) =>
    h('li', {}, h('span', { class: 'id' }, artifact.path), ' ', `(${artifact.kind})`, jsonDetails('metadata', artifact.metadata_json))))
}

// ---- the runs list ----------------------------------------------------------

/**
 * The run list's address: `#/?status=a,b&blocked=true&cursor=K`, K the
 * page key (the API's `cursor` parameter); the first page without one.
 */
interface RunsView { status: string, blocked: boolean, pageKey?: string }
const RUNS_PAGE_SIZE = 50 // ui/index.html preloads the first page at this size: change both together
function runsHref (view: RunsView): string {
  const query = new URLSearchParams()
  if (view.status !== '') query.set('status', view.status)
  if (view.blocked) query.set('blocked', 'true')
  if (view.pageKey !== undefined) query.set('cursor', view.pageKey)
  const text = query.toString()
  return text === '' ? '#/' : `#/?${text}`
}

function runsFilter (view: RunsView, seen: string[]): HTMLElement {
  // An example from the statuses of the runs shown: never one no run has.
  const input = h('input', { name: 'status', value: view.status, placeholder: seen.length === 0 ? 'one status, or several' : `e.g. ${seen.slice(0, 2).join(',')}`, 'aria-describedby': 'status-hint' }) as HTMLInputElement
  const needsAnswer = h('input', { type: 'checkbox', name: 'blocked' }) as HTMLInputElement
  needsAnswer.checked = view.blocked
  const form = h('form', { class: 'filter', role: 'search' },
    h('label', {}, 'Status ', input), ' ', h('button', { type: 'submit' }, 'Filter'), ' ',
    h('label', { class: 'check' }, needsAnswer, ' Needs an answer'),
    view.status === '' && !view.blocked ? null : h('a', { href: runsHref({ status: '', blocked: false }), class: 'clear' }, 'all runs'),
    h('p', { id: 'status-hint', class: 'legend' }, 'One status or several, separated by commas. On this page: ',
      ...seen.flatMap((status, i) => [i > 0 ? ', ' : '', h('a', { href: runsHref({ status, blocked: view.blocked }) }, status)]),
      '. Needs an answer: runs with a blocked task.'))
  const apply = () => {
    location.hash = runsHref({ status: input.value.split(',').map((item) => item.trim()).filter(Boolean).join(','), blocked: needsAnswer.checked })
  }
  form.addEventListener('submit', (event) => {
    event.preventDefault()
    apply()
  })
  // A checkbox filters at once, as a list's filter chips do.
  needsAnswer.addEventListener('change', apply)
  return form
}

function renderRuns (view: RunsView, data: RunList, next: string | undefined): HTMLElement {
  const seen = [...new Set(data.runs.map((item) => item.run.status))].sort()
  const paging = h('nav', { class: 'paging', 'aria-label': 'Pages' },
    view.pageKey === undefined ? null : h('a', { href: runsHref({ status: view.status, blocked: view.blocked }), rel: 'first' }, '« Newest'),
    next === undefined ? null : h('a', { href: runsHref({ status: view.status, blocked: view.blocked, pageKey: next }), rel: 'next' }, 'Older runs »'))
  const which = [view.status === '' ? '' : view.status.split(',').join(', '), view.blocked ? 'needing an answer' : ''].filter(Boolean).join(', ')
  const title = h('h1', {}, which === '' ? 'Runs' : `Runs: ${which}`)
  if (data.runs.length === 0) {
    const empty = view.blocked ? 'No run is waiting for an answer.' : view.status === '' ? 'No runs yet.' : 'No runs in this status.'
    return h('div', {}, title, runsFilter(view, seen), h('p', { class: 'empty' }, empty), paging)
  }
  return h('div', {},
    title,
    runsFilter(view, seen),
    h('table', {},
      h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Run'), h('th', { scope: 'col' }, 'Status'), h('th', { scope: 'col' }, 'Tasks'),
        h('th', { scope: 'col', class: 'hide-narrow' }, 'Total'), h('th', { scope: 'col', class: 'hide-narrow' }, 'Started'))),
      h('tbody', {}, ...data.runs.map((item) => {
        const waiting = item.task_counts.blocked ?? 0
        return h('tr', { 'data-run': item.run.run_id },
          h('td', {}, h('a', { href: runHref(item.run.run_id) }, item.run.goal || item.run.run_id), h('div', { class: 'id' }, item.run.run_id)),
          h('td', {}, statusBadge(item.run.status)),
          h('td', {}, countsBar(item.task_counts, item.total_tasks), waiting === 0 ? null : h('p', { class: 'waiting' }, `${waiting} waiting for an answer`)),
          h('td', { class: 'hide-narrow' }, item.total_tasks),
          h('td', { class: 'hide-narrow' }, time(item.run.created_at)))
      }))),
    paging)
}

// ---- the run page ----------------------------------------------------------

/** A blocked task's card: its attempt, and the question it waits on, one click from its thread. */
function blockedCard (runId: string, item: BlockedTask): HTMLElement {
  return h('article', { class: 'card', 'data-blocked': item.task.task_id },
    h('h3', {}, h('a', { href: taskHref(runId, item.task.task_id) }, item.task.title), ' ', h('span', { class: 'id' }, item.task.task_id)),
    h('p', { class: 'meta' }, `Attempt ${item.attempt.attempt_no}, assigned to ${item.attempt.assigned_to} · `,
      h('a', { href: threadHref(item.attempt.thread_id) }, 'open the thread')),
    h('div', { class: 'question' },
      h('p', {}, h('strong', {}, 'Question: '), item.question.summary, ' ', h('span', { class: 'meta' }, `from ${item.question.from_agent}, `), time(item.question.created_at)),
      h('details', {}, h('summary', {}, 'full question'), h('pre', {}, item.question.body)),
      artifactList(item.question.artifacts)))
}

/**
 * A task blocked without an attempt or a question yet: the API leaves it
 * out of the blocked list (by contract), but it is blocked, and counted so.
 */
function blockedWithoutQuestionCard (runId: string, task: Task): HTMLElement {
  return h('article', { class: 'card', 'data-blocked': task.task_id },
    h('h3', {}, h('a', { href: taskHref(runId, task.task_id) }, task.title), ' ', h('span', { class: 'id' }, task.task_id)),
    h('p', { class: 'meta' }, statusBadge('blocked'), ' no question yet ', time(task.updated_at)))
}

/** A failed task: what it was, what its last event said, one click from its thread (when its events name it). */
function failedItem (runId: string, task: Task, timeline: Timeline): HTMLElement {
  const latest = timeline.latestPhase(task.task_id)
  const thread = timeline.threadOf(task.task_id)
  return h('li', { class: 'card', 'data-failed': task.task_id },
    h('h3', {}, statusBadge(task.status), ' ', h('a', { href: taskHref(runId, task.task_id) }, task.title), ' ', h('span', { class: 'id' }, task.task_id)),
    task.summary === '' ? null : h('p', {}, task.summary),
    h('p', { class: 'meta' },
      latest?.status === task.status && latest.summary !== '' ? `${latest.summary} · ` : '',
      time(task.updated_at), ' · ',
      thread === undefined ? h('a', { href: taskHref(runId, task.task_id) }, 'open the task') : h('a', { href: threadHref(thread) }, 'open the thread')))
}

/** The top of the run page: the run, what failed and what waits for an answer, and the counts. */
function renderRunHead (data: RunDetailEnvelope, timeline: Timeline): HTMLElement {
  const { run, task_counts: counts, total_tasks: total, tasks, blocked_tasks: blocked } = data.run
  const failed = tasks.filter((task) => task.status === 'failed')
  const withQuestion = new Set(blocked.map((item) => item.task.task_id))
  const withoutQuestion = tasks.filter((task) => task.status === 'blocked' && !withQuestion.has(task.task_id))
  const waiting = blocked.length + withoutQuestion.length
  return h('div', {},
    h('p', { class: 'crumbs' }, h('a', { href: '#/' }, '← All runs')),
    h('h1', {}, run.goal || run.run_id),
    h('p', { class: 'meta' }, 'Status: ', statusBadge(run.status), ' · ', h('span', { class: 'id' }, run.run_id), ' · started ', time(run.created_at), ' · updated ', time(run.updated_at)),
    run.summary ? h('p', {}, run.summary) : null,
    failed.length === 0
      ? null
      : h('section', { class: 'attention', 'aria-labelledby': 'failed-title' },
        h('h2', { id: 'failed-title' }, `Failed (${failed.length})`),
        h('ul', { class: 'cards' }, ...failed.map((task) => failedItem(run.run_id, task, timeline)))),
    h('section', { class: 'attention', 'aria-labelledby': 'blocked-title' },
      h('h2', { id: 'blocked-title' }, `Blocked (${waiting})`),
      waiting === 0
        ? h('p', { class: 'empty' }, 'No task is waiting on a question.')
        : h('div', { class: 'cards' },
          ...blocked.map((item) => blockedCard(run.run_id, item)),
          ...withoutQuestion.map((task) => blockedWithoutQuestionCard(run.run_id, task)))),
    h('h2', {}, `Tasks by status (${total})`),
    countsBar(counts, total))
}

function taskRow (runId: string, task: Task): HTMLElement {
  return h('tr', { 'data-task': task.task_id },
    h('td', {}, h('a', { href: taskHref(runId, task.task_id) }, task.title || task.task_id), h('div', { class: 'id' }, task.task_id)),
    h('td', { class: 'task-status' }, statusBadge(task.status)),
    h('td', { class: 'hide-narrow' }, task.priority),
    h('td', { class: 'hide-narrow' }, task.default_to ?? '—'),
    h('td', { class: 'hide-narrow' }, task.latest_attempt_no ?? '—'),
    h('td', {}, time(task.updated_at)))
}

/**
 * The run's tasks table, drawn again row by row: a read of a 200-task run
 * in which one task changed redraws that task's row, not the table (a live
 * event cost the page at 200 tasks twice the main thread when it did:
 * bench:ui).
 */
function tasksTable (runId: string) {
  const heading = h('h2', {})
  const rows = h('tbody', {})
  const table = h('table', {},
    h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Task'), h('th', { scope: 'col' }, 'Status'), h('th', { scope: 'col', class: 'hide-narrow' }, 'Priority'),
      h('th', { scope: 'col', class: 'hide-narrow' }, 'Default to'), h('th', { scope: 'col', class: 'hide-narrow' }, 'Attempt'), h('th', { scope: 'col' }, 'Updated'))),
    rows)
  const element = h('div', {}, heading)
  /** Each row drawn, with the task it was drawn from (as its JSON). */
  let drawn = new Map<string, { row: HTMLElement, as: string }>()
  return {
    element,
    draw (tasks: Task[]) {
      heading.textContent = `Tasks (${tasks.length})`
      if (tasks.length === 0) {
        element.replaceChildren(heading, h('p', { class: 'empty' }, 'No tasks yet.'))
        drawn = new Map()
        return
      }
      if (table.parentNode !== element) element.replaceChildren(heading, table)
      const next = new Map<string, { row: HTMLElement, as: string }>()
      for (const task of tasks) {
        const as = JSON.stringify(task)
        const kept = drawn.get(task.task_id)
        next.set(task.task_id, kept?.as === as ? kept : { row: taskRow(runId, task), as })
      }
      for (const [taskId, { row }] of drawn) if (next.get(taskId)?.row !== row) row.remove()
      drawn = next
      // In the read's order, moving only the rows out of place.
      let i = 0
      for (const { row } of next.values()) {
        if (rows.children[i] !== row) rows.insertBefore(row, rows.children[i] ?? null)
        i++
      }
    }
  }
}

// ---- events: a run's history, and lists of the latest ----------------------

/**
 * The run's events up to `cursor` (a read's X-Event-Cursor: the stream
 * takes over after it), a page of MAX_PAGE_LIMIT at a time from the first;
 * `startsLater` when the oldest were removed by retention (the first page
 * answers 410: read from the oldest kept). Retries what retrying may fix.
 */
async function runEventsUntil (runId: string, cursor: number, signal: AbortSignal): Promise<{ events: Event[], startsLater: boolean }> {
  for (let attempt = 0; ; attempt++) {
    try {
      let expired = false
      const events: Event[] = []
      for (let after = 0; ;) {
        const page = await client.eventsRead({ run_id: runId, after_event_id: after, limit: MAX_PAGE_LIMIT }, signal).catch((error: unknown) => {
          if (!(error instanceof CursorExpired) || after !== 0) throw error
          expired = true
          return client.eventsRead({ run_id: runId, limit: MAX_PAGE_LIMIT }, signal)
        })
        for (const event of page.body.events) if (event.event_id <= cursor) events.push(event)
        const last = page.body.events.at(-1)
        if (last === undefined || page.body.events.length < MAX_PAGE_LIMIT || last.event_id >= cursor) {
          // A run whose first kept event is its creation lost none of its own.
          return { events, startsLater: expired && events[0]?.event_type !== 'run_created' }
        }
        after = last.event_id
      }
    } catch (error) {
      if (signal.aborted || !(error instanceof ApiError) || error.terminal) throw error
      // A 410 here: the history's floor passed a later page (retention at work), so start over at once; else as the client's own reads do.
      if (!(error instanceof CursorExpired)) await delay(backoff(attempt, 500, 10_000), signal)
    }
  }
}

/** Where an event list is: every run's events, one run's, or one task's (what the page is needs no link). */
type EventsOf = 'all' | 'run' | 'task'

/** How an event reads in a list: its type, what it concerns (linked), its summary, when. */
function eventItem (event: Event, on: EventsOf): HTMLElement {
  const concerns = event.thread_id !== ''
    ? h('a', { href: threadHref(event.thread_id) }, `thread ${event.thread_id}`)
    : event.task_id !== '' && event.run_id !== '' && on !== 'task'
      ? h('a', { href: taskHref(event.run_id, event.task_id) }, `task ${event.task_id}`)
      : on === 'all' && event.run_id !== '' ? h('a', { href: runHref(event.run_id) }, `run ${event.run_id}`) : null
  const inRun = on === 'all' && event.run_id !== '' && (event.thread_id !== '' || event.task_id !== '')
  return h('li', { 'data-event': String(event.event_id) },
    h('span', { class: 'id' }, `#${event.event_id}`), ' ', h('strong', {}, event.event_type), ' ',
    concerns, inRun ? h('span', { class: 'meta' }, ' in ', h('a', { href: runHref(event.run_id) }, `run ${event.run_id}`)) : null,
    event.summary === '' ? null : h('span', {}, ` · ${event.summary}`), ' ', time(event.created_at))
}

/** A list of the latest `size` events, newest first: `show` adds (ascending) events on top. */
function latestEvents (size: number, on: EventsOf) {
  const element = h('ol', { class: 'activity', reversed: '' })
  return {
    element,
    show (events: Event[]) {
      for (const event of events.slice(-size)) element.prepend(eventItem(event, on))
      while (element.childElementCount > size) element.lastElementChild!.remove()
    },
    clear () { element.replaceChildren() }
  }
}

// ---- pages kept live by list-then-watch ---------------------------------------

interface FollowedPage<T> {
  /** What the page shows, as one read (its X-Event-Cursor starts the stream). */
  read: (signal?: AbortSignal) => Promise<Read<T>>
  filter: EventFilter
  /** Each new body read (a body equal to the last is not drawn again). */
  draw: (body: T) => void
  /** After the first read and each read after a 410, before the stream starts from its cursor: what else the page loads up to there. */
  caughtUp?: (cursor: number, signal: AbortSignal) => Promise<void>
  /** Each event of the filter, in order; true when it may change the read, which is then read again. Default: every event may. */
  onEvent?: (event: Event) => boolean
}

/**
 * A page on the client's list-then-watch (follow): the read, then each
 * event, reading again (one read at a time; events meanwhile cause one
 * more) when an event may change what it shows. Starts over on a 410; ends
 * on a refusal retrying cannot fix, through onError.
 */
function followPage<T> (page: FollowedPage<T>, onStatus: (status: StreamStatus) => void, onError: (error: ApiError) => void): Live {
  const controller = new AbortController()
  const { signal } = controller
  let drawn: T | undefined
  const show = (body: T) => {
    if (body === drawn) return // the client hands back the body it kept when the service answers 304
    drawn = body
    page.draw(body)
  }
  const fail = (error: unknown) => {
    if (signal.aborted) return
    controller.abort()
    onError(error instanceof ApiError ? error : new ApiError(0, 'internal', `the page stopped: ${(error as Error).message}`, client.url))
  }
  let reading = false
  let again = false
  async function readAgain () {
    if (reading) {
      again = true
      return
    }
    reading = true
    try {
      for (let attempt = 0; !signal.aborted;) {
        again = false
        try {
          show((await page.read(signal)).body)
          attempt = 0
        } catch (error) {
          if (signal.aborted || !(error instanceof ApiError) || error.terminal) throw error
          // Out of reach for now: the stream says so in the header; read again once it may answer.
          await delay(backoff(attempt++, 500, 10_000), signal)
          again = true
        }
        if (!again) break
      }
    } catch (error) {
      fail(error)
    } finally {
      reading = false
    }
  }
  void (async () => {
    for await (const item of follow(client, page.read, page.filter, { signal, onStatus })) {
      if (item.kind === 'read') {
        show(item.body)
        await page.caughtUp?.(item.read.eventCursor ?? 0, signal)
      } else if (page.onEvent?.(item.event) ?? true) {
        void readAgain()
      }
    }
  })().catch(fail)
  return { close: () => controller.abort() }
}

/** How many of a run's (or a task's) latest events its page lists. */
const RUN_ACTIVITY_SIZE = 20

/**
 * A page's timeline and activity, fed from its run's events (those `shows`
 * keeps): the history up to the read, then each event once, in order. Its
 * caughtUp and onEvent are the page's own (FollowedPage).
 */
function runEventsFeed (runId: string, timeline: Timeline, activity: ReturnType<typeof latestEvents>, updated: () => void, shows: (event: Event) => boolean = () => true) {
  /** The highest event drawn: the stream resumes after the history, and never repeats one. */
  let lastEventId = 0
  return {
    caughtUp: async (cursor: number, signal: AbortSignal) => {
      const { events, startsLater } = await runEventsUntil(runId, cursor, signal)
      lastEventId = cursor
      const shown = events.filter(shows)
      timeline.reset(shown, startsLater)
      activity.clear()
      activity.show(shown)
    },
    onEvent: (event: Event) => {
      if (event.event_id <= lastEventId || !shows(event)) return false
      lastEventId = event.event_id
      timeline.add(event)
      activity.show([event])
      updated()
      return true
    }
  }
}

/**
 * The run page: its head and its tasks drawn from each read of the run;
 * its timeline and its activity from its events (the history up to the
 * read, then each event as it arrives), on one stream.
 */
function mountRun (main: HTMLElement, runId: string, onStatus: (status: StreamStatus) => void, onError: (error: ApiError) => void, updated: () => void): Live {
  const timeline = new Timeline((taskId) => taskHref(runId, taskId))
  const activity = latestEvents(RUN_ACTIVITY_SIZE, 'run')
  const head = h('div', {}, h('p', {}, 'Loading…'))
  const tasks = tasksTable(runId)
  main.replaceChildren(h('div', {}, head,
    h('section', { 'aria-labelledby': 'timeline-title' }, h('h2', { id: 'timeline-title' }, 'Timeline'), timeline.element),
    tasks.element,
    h('section', { 'aria-labelledby': 'activity-title' }, h('h2', { id: 'activity-title' }, 'Activity'),
      h('p', { class: 'meta' }, `The run's latest ${RUN_ACTIVITY_SIZE} events, newest first, live.`), activity.element)))
  let latest: RunDetailEnvelope | undefined
  const drawRun = (body: RunDetailEnvelope) => {
    latest = body
    head.replaceChildren(renderRunHead(body, timeline))
    tasks.draw(body.run.tasks)
    timeline.setTasks(body.run.tasks)
    updated()
  }
  const feed = runEventsFeed(runId, timeline, activity, updated)
  return followPage<RunDetailEnvelope>({
    read: (signal) => client.runRead(runId, signal),
    filter: { run_id: runId },
    draw: drawRun,
    caughtUp: async (cursor, signal) => {
      await feed.caughtUp(cursor, signal)
      // The failed tasks' threads are named by their events, now known.
      if (latest !== undefined) drawRun(latest)
    },
    onEvent: feed.onEvent
  }, onStatus, onError)
}

// ---- a task's story ----------------------------------------------------------

/** What an attempt was: who, on which branch from which base, what it produced, and when. */
function attemptCard (attempt: TaskAttempt): HTMLElement {
  const fact = (label: string, value: unknown) => value === undefined || value === '' ? null : h('div', {}, h('dt', {}, label), h('dd', {}, String(value)))
  return h('li', { class: 'card', 'data-attempt': String(attempt.attempt_no) },
    h('h3', {}, `Attempt ${attempt.attempt_no} `, statusBadge(attempt.status)),
    h('dl', { class: 'facts' },
      fact('Assigned to', attempt.assigned_to),
      fact('Branch', attempt.branch_name),
      fact('Base', [attempt.base_ref, attempt.base_commit].filter(Boolean).join(' at ') || undefined),
      fact('Result commit', attempt.result_commit),
      fact('Workspace', [attempt.workspace_status, attempt.worktree_path].filter(Boolean).join(', ') || undefined),
      h('div', {}, h('dt', {}, 'Started'), h('dd', {}, time(attempt.created_at))),
      h('div', {}, h('dt', {}, 'Updated'), h('dd', {}, time(attempt.updated_at)))),
    h('p', { class: 'meta' }, h('a', { href: threadHref(attempt.thread_id) }, 'open its thread'), ` (${attempt.thread_id})`))
}

function renderTask (data: TaskDetailEnvelope): HTMLElement {
  const task = data.task
  return h('div', {},
    h('p', { class: 'crumbs' }, h('a', { href: runHref(task.run_id) }, `← Run ${task.run_id}`)),
    h('h1', {}, task.title || task.task_id),
    h('p', { class: 'meta' }, 'Status: ', statusBadge(task.status), ' · ', h('span', { class: 'id' }, task.task_id), ` · priority ${task.priority}`,
      task.default_to === undefined ? '' : ` · default to ${task.default_to}`, ' · updated ', time(task.updated_at)),
    task.summary === '' ? null : h('p', {}, task.summary),
    jsonDetails('acceptance criteria', task.acceptance_json),
    h('h2', {}, `Attempts (${task.attempts.length})`),
    task.attempts.length === 0
      ? h('p', { class: 'empty' }, 'Not dispatched yet.')
      : h('ol', { class: 'cards attempts' }, ...task.attempts.map(attemptCard)),
    h('h2', {}, `Threads (${task.threads.length})`),
    task.threads.length === 0
      ? h('p', { class: 'empty' }, 'No threads yet.')
      : h('ul', { class: 'threads' }, ...task.threads.map((thread) => h('li', { 'data-thread': thread.thread_id },
        h('a', { href: threadHref(thread.thread_id) }, thread.subject || thread.thread_id), ' ', statusBadge(thread.status),
        h('span', { class: 'meta' }, ` ${thread.created_by} → ${thread.assigned_to} · priority ${thread.priority} · updated `), time(thread.updated_at)))))
}

/** A task's page: its story from each read of it, and its own lane and events from the run's. */
function mountTask (main: HTMLElement, runId: string, taskId: string, onStatus: (status: StreamStatus) => void, onError: (error: ApiError) => void, updated: () => void): Live {
  const timeline = new Timeline((id) => taskHref(runId, id), 'this task')
  const activity = latestEvents(RUN_ACTIVITY_SIZE, 'task')
  const story = h('div', {}, h('p', {}, 'Loading…'))
  main.replaceChildren(h('div', {}, story,
    h('section', { 'aria-labelledby': 'phases-title' }, h('h2', { id: 'phases-title' }, 'Phases'), timeline.element),
    h('section', { 'aria-labelledby': 'activity-title' }, h('h2', { id: 'activity-title' }, 'Activity'),
      h('p', { class: 'meta' }, `The task's latest ${RUN_ACTIVITY_SIZE} events, newest first, live.`), activity.element)))
  const feed = runEventsFeed(runId, timeline, activity, updated, (event) => event.task_id === taskId)
  return followPage<TaskDetailEnvelope>({
    read: (signal) => client.taskRead(runId, taskId, signal),
    filter: { run_id: runId },
    draw: (body) => {
      story.replaceChildren(renderTask(body))
      timeline.setTasks([body.task])
      updated()
    },
    ...feed
  }, onStatus, onError)
}

// ---- a thread ------------------------------------------------------------------

function renderThread (data: ThreadDetailEnvelope): HTMLElement {
  const { thread, messages } = data.thread
  return h('div', {},
    h('p', { class: 'crumbs' }, h('a', { href: runHref(thread.run_id) }, `← Run ${thread.run_id}`), ' · ', h('a', { href: taskHref(thread.run_id, thread.task_id) }, `task ${thread.task_id}`)),
    h('h1', {}, thread.subject || thread.thread_id),
    h('p', { class: 'meta' }, 'Status: ', statusBadge(thread.status), ` · task ${thread.task_id} · ${thread.created_by} → ${thread.assigned_to} · priority ${thread.priority}`),
    h('h2', {}, `Messages (${messages.length})`),
    messages.length === 0
      ? h('p', { class: 'empty' }, 'No messages yet.')
      : h('ol', { class: 'timeline' }, ...messages.map((message) => h('li', { class: 'card message', 'data-message': message.message_id },
        h('header', {}, h('strong', {}, `${message.from_agent} → ${message.to_agent}`), h('span', { class: 'status status-other' }, message.kind), time(message.created_at)),
        h('p', { class: 'summary' }, message.summary),
        h('details', {}, h('summary', {}, 'body'), h('pre', {}, message.body)),
        jsonDetails('payload', message.payload_json),
        artifactList(message.artifacts)))))
}

// ---- the activity page: the latest events across all runs, live ----------

const ACTIVITY_SIZE = 100

/** The latest events (newest first), then each new one as it commits; on 410, starts over. `onDrawn` after each. */
function mountActivity (main: HTMLElement, onStatus: (status: StreamStatus) => void, onDrawn: () => void): Live {
  const controller = new AbortController()
  const { signal } = controller
  const list = latestEvents(ACTIVITY_SIZE, 'all')
  main.replaceChildren(h('div', {}, h('h1', {}, 'Activity'), h('p', { class: 'meta' }, `The latest ${ACTIVITY_SIZE} events across all runs, newest first, live.`), list.element))
  const show = (events: Event[]) => {
    list.show(events)
    onDrawn()
  }
  async function start (): Promise<void> {
    while (!signal.aborted) {
      try {
        // The position now (any read carries it), then the events just before it.
        const now = (await client.runsRead({ limit: 1 }, signal)).eventCursor ?? 0
        const recent = await client.eventsRead({ after_event_id: Math.max(0, now - ACTIVITY_SIZE), limit: ACTIVITY_SIZE }, signal)
          .catch((error: unknown) => { if (error instanceof CursorExpired) return client.eventsRead({ limit: ACTIVITY_SIZE }, signal); throw error })
        list.clear()
        show(recent.body.events)
        const after = recent.body.events.at(-1)?.event_id ?? now
        for await (const event of client.watch({}, { after: Math.max(after, recent.eventCursor ?? 0), signal, onStatus })) show([event])
      } catch (error) {
        if (signal.aborted) return
        if (error instanceof ApiError && error.status === 401) {
          refused(error)
          return
        }
        if (!(error instanceof CursorExpired)) {
          main.querySelector('.error')?.remove()
          main.append(h('p', { class: 'error' }, (error as Error).message))
          await new Promise((resolve) => setTimeout(resolve, 2000))
        }
      }
    }
  }
  void start()
  return { close: () => controller.abort() }
}

// ---- routing: the address is the page --------------------------------------

const live = document.getElementById('live')!
/** The header's word on the page's connection; `stopped`: the page reads no more (an unknown run, say), and says why. */
function showLive (status: StreamStatus | { state: 'down' | 'stopped', text: string }) {
  const text = 'text' in status
    ? status.text
    : status.state === 'live'
      ? `Live · updated ${new Date().toLocaleTimeString()}`
      : status.state === 'connecting'
        ? 'Connecting…'
        : status.error === undefined ? 'Reconnecting…' : `Offline · retrying… (${status.error.detail})`
  live.textContent = text
  live.className = `live${status.state === 'live' ? ' is-live' : status.state === 'retrying' || status.state === 'down' ? ' is-down' : status.state === 'stopped' ? ' is-stopped' : ''}`
}

/** Shows the page of `hash` and keeps it current; returns how to stop. */
function mount (hash: string): Live {
  const main = document.getElementById('app')!
  // Once an attempt has failed, the next is a reconnection: the header keeps saying what the last one met
  // (Reconnecting…, Offline · retrying…) until the page is live again, not "Connecting…" between retries.
  const onStatus = (status: StreamStatus) => {
    if (status.state !== 'connecting' || !live.classList.contains('is-down')) showLive(status)
  }
  const onError = (error: ApiError) => {
    if (error.status === 401) {
      refused(error)
      return
    }
    // The page reads no more: the header says so, rather than connecting for good.
    showLive({ state: 'stopped', text: error.status === 404 ? 'Not found · not live' : `Stopped · ${error.detail}` })
    main.replaceChildren(h('p', { class: 'crumbs' }, h('a', { href: '#/' }, '← All runs')), h('h1', {}, document.title.split(' · ')[0]!), h('p', { class: 'error' }, error.detail))
  }
  // Each new snapshot (or event, on the activity page) is drawn at once; the indicator says when it was read.
  const updated = () => { if (live.classList.contains('is-live')) showLive({ state: 'live' }) }
  const drawn = (element: HTMLElement) => {
    main.replaceChildren(element)
    updated()
  }
  const [, taskRun, taskId] = /^#\/runs\/([^/]+)\/tasks\/(.+)$/.exec(hash) ?? []
  if (taskRun !== undefined && taskId !== undefined) {
    const [runId, id] = [decodeURIComponent(taskRun), decodeURIComponent(taskId)]
    document.title = `Task ${id} · Control plane`
    return mountTask(main, runId, id, onStatus, onError, updated)
  }
  const [, kind, rawId] = /^#\/(runs|threads)\/(.+)$/.exec(hash) ?? []
  if (kind !== undefined && rawId !== undefined) {
    const id = decodeURIComponent(rawId)
    document.title = `${kind === 'runs' ? 'Run' : 'Thread'} ${id} · Control plane`
    return kind === 'runs'
      ? mountRun(main, id, onStatus, onError, updated)
      : client.liveThread(id, (body) => drawn(renderThread(body)), { onStatus, onError })
  }
  if (hash === '#/activity') {
    document.title = 'Activity · Control plane'
    return mountActivity(main, onStatus, updated)
  }
  const params = new URLSearchParams(hash.replace(/^#\/?\??/, ''))
  const view: RunsView = { status: params.get('status') ?? '', blocked: params.get('blocked') === 'true', ...(params.get('cursor') ? { pageKey: params.get('cursor')! } : {}) }
  document.title = 'Runs · Control plane'
  return client.liveRuns({ status: view.status, limit: RUNS_PAGE_SIZE, ...(view.blocked ? { blocked: true } : {}), ...(view.pageKey === undefined ? {} : { cursor: view.pageKey }) },
    (body, read) => drawn(renderRuns(view, body, read.next)), { onStatus, onError })
}

let current: Live | undefined
function route () {
  current?.close()
  if (signedOut) return
  showLive({ state: 'connecting' })
  const main = document.getElementById('app')!
  const page = mount(location.hash)
  const stopTimes = keepTimesCurrent(main)
  current = { close: () => { page.close(); stopTimes() } }
  main.focus({ preventScroll: true })
}
window.addEventListener('hashchange', route)

// ---- signing in: only when the service needs a token (GET /api/auth) ------

/** The token, for this tab's session only: gone when the tab closes, or on "Sign out". */
const TOKEN_KEY = 'ocp-api.token'
/** The sign-in under way with the identity provider: what checks and completes its answer. */
const SIGN_IN_KEY = 'ocp-api.sign-in'

interface PendingSignIn { verifier: string, state: string, nonce: string, tokenEndpoint: string, clientId: string, redirectUri: string, hash: string }

/** What the service said of authentication; the sign-in page needs it. */
let authInfo: AuthInfo = { required: false, sign_in: null }
/** The sign-in page is shown: no page is mounted, none reads. */
let signedOut = false

const base64url = (bytes: Uint8Array) => btoa(String.fromCharCode(...bytes)).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '')
const randomText = () => base64url(crypto.getRandomValues(new Uint8Array(32)))

/** A JWT's claims, unchecked (the service checks the signature; this only names who signed in); undefined for a static token. */
function claimsOf (token: string): Record<string, unknown> | undefined {
  const [, payload] = token.split('.')
  if (payload === undefined) return undefined
  try {
    const text = atob(payload.replace(/-/g, '+').replace(/_/g, '/'))
    const claims: unknown = JSON.parse(new TextDecoder().decode(Uint8Array.from(text, (char) => char.charCodeAt(0))))
    return typeof claims === 'object' && claims !== null ? claims as Record<string, unknown> : undefined
  } catch {
    return undefined
  }
}

/** The header's "who, and Sign out", while signed in to a service that needs a token. */
const account = h('div', { class: 'account' })
function showAccount (token: string | undefined) {
  if (token === undefined) {
    account.remove()
    return
  }
  const claims = claimsOf(token)
  const who = [claims?.email, claims?.preferred_username, claims?.sub].find((value) => typeof value === 'string' && value !== '') as string | undefined
  const button = h('button', { type: 'button', class: 'sign-out' }, 'Sign out')
  button.addEventListener('click', () => signOut())
  account.replaceChildren(h('span', { class: 'who' }, who === undefined ? 'Signed in with a token' : `Signed in as ${who}`), ' ', button)
  document.querySelector('header.top')!.append(account)
}

/** Shows the pages, reading with `token` (none when the service needs none). */
function signIn (token: string | undefined) {
  signedOut = false
  client.setToken(token)
  showAccount(token)
  route()
}

/**
 * Forgets the token and shows the sign-in page, saying `message` (why) when
 * given; first the service's GET /api/auth/sign-out has the browser clear
 * this origin's cache (answers read with the token) and storage
 * (Clear-Site-Data), so that a sign-in on the page cannot be cleared by it.
 */
function signOut (message?: string) {
  signedOut = true
  current?.close()
  current = undefined
  sessionStorage.removeItem(TOKEN_KEY)
  client.setToken(undefined)
  showAccount(undefined)
  void fetch('/api/auth/sign-out', { cache: 'no-store' }).catch(() => undefined).then(() => {
    if (signedOut) showSignInPage(message)
  })
}

/** A read or a stream refused the token (401): back to the sign-in page, saying the service's reason. */
function refused (error: ApiError) {
  if (signedOut) return
  void (async () => {
    // Authentication was off when the page loaded, or /api/auth was out of reach: what it says now, for the page.
    if (!authInfo.required) authInfo = await client.auth().catch(() => ({ required: true, sign_in: null }))
    signOut(`Your token was refused: ${error.detail.replace(/\.$/, '')}. Sign in again.`)
  })()
}

function showSignInPage (message?: string) {
  const main = document.getElementById('app')!
  document.title = 'Sign in · Control plane'
  live.textContent = 'Not signed in'
  live.className = 'live'
  const input = h('input', { id: 'token', name: 'token', type: 'password', autocomplete: 'off', spellcheck: 'false', required: '' }) as HTMLInputElement
  const form = h('form', { class: 'sign-in-token' },
    h('label', { for: 'token' }, 'API token or identity-provider token (JWT)'),
    h('div', { class: 'row' }, input, ' ', h('button', { type: 'submit' }, 'Sign in')))
  form.addEventListener('submit', (event) => {
    event.preventDefault()
    const token = input.value.trim()
    if (token === '') return
    sessionStorage.setItem(TOKEN_KEY, token)
    signIn(token)
  })
  const provider = authInfo.sign_in
  let providerPart: HTMLElement | null = null
  if (provider !== null) {
    const button = h('button', { type: 'button', class: 'sign-in-provider' }, `Sign in with ${new URL(provider.issuer).host}`)
    button.addEventListener('click', () => {
      beginProviderSignIn(provider).catch((error: unknown) => showSignInPage(`Signing in failed: ${(error as Error).message}`))
    })
    providerPart = h('div', { class: 'provider' }, button, h('p', { class: 'legend' }, 'Or paste a token:'))
  }
  main.replaceChildren(h('section', { class: 'sign-in', 'aria-labelledby': 'sign-in-title' },
    h('h1', { id: 'sign-in-title' }, 'Sign in'),
    message === undefined ? null : h('p', { class: 'error', role: 'alert' }, message),
    h('p', {}, 'This service needs a token to show its runs.'),
    providerPart,
    form,
    h('p', { class: 'legend' }, 'The token is kept in this tab only, until you sign out or close it.')))
  if (provider === null || message !== undefined) input.focus()
}

/** To the identity provider's sign-in (authorization code with PKCE, S256); it sends the browser back here with a code. */
async function beginProviderSignIn (provider: SignIn) {
  // crypto.subtle exists only on a secure page: https, or this machine.
  if (globalThis.crypto?.subtle === undefined) throw new Error('signing in with an identity provider needs the page served over https')
  const pending: PendingSignIn = {
    verifier: randomText(),
    state: randomText(),
    nonce: randomText(),
    tokenEndpoint: provider.token_endpoint,
    clientId: provider.client_id,
    redirectUri: location.origin + location.pathname,
    hash: location.hash
  }
  const challenge = base64url(new Uint8Array(await crypto.subtle.digest('SHA-256', new TextEncoder().encode(pending.verifier))))
  sessionStorage.setItem(SIGN_IN_KEY, JSON.stringify(pending))
  const target = new URL(provider.authorization_endpoint)
  const params = { response_type: 'code', client_id: provider.client_id, redirect_uri: pending.redirectUri, scope: provider.scope, state: pending.state, code_challenge: challenge, code_challenge_method: 'S256', nonce: pending.nonce }
  for (const [name, value] of Object.entries(params)) target.searchParams.set(name, value)
  location.assign(target.href)
}

/**
 * The identity provider's answer, when this load is one (?code=&state=, or
 * ?error=): checks it against the sign-in this tab started, trades the code
 * for tokens, and returns the ID token. The address loses the answer
 * either way. Undefined when this load is not an answer.
 */
async function finishProviderSignIn (): Promise<string | undefined> {
  const answer = new URLSearchParams(location.search)
  if (!answer.has('code') && !answer.has('error')) return undefined
  const kept = sessionStorage.getItem(SIGN_IN_KEY)
  sessionStorage.removeItem(SIGN_IN_KEY)
  const pending = kept === null ? undefined : JSON.parse(kept) as PendingSignIn
  history.replaceState(null, '', `${location.pathname}${pending?.hash ?? location.hash}`)
  if (pending === undefined || answer.get('state') !== pending.state) throw new Error('the identity provider\'s answer is not for a sign-in this tab started')
  if (answer.has('error')) throw new Error(`the identity provider said: ${answer.get('error_description') || answer.get('error')}`)
  let response: Response
  try {
    response = await fetch(pending.tokenEndpoint, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded', accept: 'application/json' },
      body: new URLSearchParams({ grant_type: 'authorization_code', code: answer.get('code')!, redirect_uri: pending.redirectUri, client_id: pending.clientId, code_verifier: pending.verifier })
    })
  } catch {
    throw new Error('the identity provider could not be reached')
  }
  const tokens = await response.json().catch(() => ({})) as { id_token?: unknown, error?: unknown, error_description?: unknown }
  if (!response.ok || typeof tokens.id_token !== 'string') {
    throw new Error(`the identity provider gave no token (${String(tokens.error_description ?? tokens.error ?? `HTTP ${response.status}`)})`)
  }
  if (claimsOf(tokens.id_token)?.nonce !== pending.nonce) throw new Error('the identity provider\'s token is not for this sign-in (its nonce)')
  return tokens.id_token
}

async function start () {
  let failure: string | undefined
  try {
    const token = await finishProviderSignIn()
    if (token !== undefined) sessionStorage.setItem(TOKEN_KEY, token)
  } catch (error) {
    failure = `Signing in failed: ${(error as Error).message}.`
  }
  // Out of reach, or a service from before authentication: go on without; a refusal brings the sign-in page later.
  authInfo = await client.auth().catch(() => authInfo)
  if (!authInfo.required) {
    signIn(undefined)
    return
  }
  const token = sessionStorage.getItem(TOKEN_KEY)
  if (token === null || failure !== undefined) signOut(failure)
  else signIn(token)
}
void start()
