/*
 * The reference client of the API: a runs list, a run detail and a thread
 * timeline, kept live by the event stream. It never patches data from
 * events (no local reducers): an event only says "something changed", and
 * the page refetches what it shows. It subscribes from the X-Event-Cursor
 * of the fetch it rendered, so nothing between fetch and subscribe is lost;
 * when the service refuses that cursor (410 cursor_expired: older than the
 * history kept), it fetches and subscribes again.
 */

// ---- API types (the parts the pages show) -------------------------------

interface Run { run_id: string, goal: string, summary: string, status: string, created_at: string, updated_at: string }
interface RunListItem { run: Run, task_counts: Record<string, number>, total_tasks: number }
interface Task { run_id: string, task_id: string, title: string, summary: string, status: string, default_to?: string, priority: string, latest_attempt_no?: number, created_at: string, updated_at: string }
interface Attempt { attempt_no: number, assigned_to: string, thread_id: string, status: string, branch_name?: string }
interface Artifact { artifact_id: string, path: string, kind: string, metadata_json: unknown }
interface Message { message_id: string, from_agent: string, to_agent: string, kind: string, summary: string, body: string, payload_json: unknown, created_at: string, artifacts?: Artifact[] }
interface BlockedTask { task: Task, attempt: Attempt, question: Message }
interface RunDetail extends RunListItem { tasks: Task[], blocked_tasks: BlockedTask[] }
interface Thread { thread_id: string, run_id: string, task_id: string, subject: string, created_by: string, assigned_to: string, status: string, priority: string, created_at: string }
interface ThreadDetail { thread: Thread, messages: Message[] }

// ---- DOM helpers: text only, never HTML from data ---------------------------

type Child = Node | string | number | null | undefined | false
function h (tag: string, attributes: Record<string, string> = {}, ...children: Child[]): HTMLElement {
  const element = document.createElement(tag)
  for (const [name, value] of Object.entries(attributes)) element.setAttribute(name, value)
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue
    element.append(typeof child === 'number' ? String(child) : child)
  }
  return element
}

const KNOWN_STATUSES = new Set(['done', 'running', 'blocked', 'failed', 'ready'])
const statusClass = (status: string) => KNOWN_STATUSES.has(status) ? status : 'other'
/** A status as text (colour only repeats it). */
const statusBadge = (status: string) => h('span', { class: `status status-${statusClass(status)}` }, status)

function age (iso: string): string {
  const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000)
  if (seconds < 60) return `${Math.floor(seconds)} s ago`
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`
  if (seconds < 86_400) return `${Math.floor(seconds / 3600)} h ago`
  return `${Math.floor(seconds / 86_400)} d ago`
}
const time = (iso: string) => h('time', { datetime: iso, title: iso }, age(iso))

const runHref = (runId: string) => `#/runs/${encodeURIComponent(runId)}`
const threadHref = (threadId: string) => `#/threads/${encodeURIComponent(threadId)}`

/** Task counts as a compact bar, with the same counts in words beside it. */
function countsBar (counts: Record<string, number>, total: number): HTMLElement {
  const entries = Object.entries(counts).sort(([a], [b]) => a.localeCompare(b))
  const bar = h('div', { class: 'bar', role: 'img', 'aria-label': entries.map(([status, n]) => `${n} ${status}`).join(', ') || 'no tasks' })
  for (const [status, n] of entries) bar.append(h('span', { class: `bar-${statusClass(status)}`, style: `width: ${(100 * n) / Math.max(total, 1)}%` }))
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

// ---- pages ---------------------------------------------------------------

function renderRuns (data: { runs: RunListItem[] }): HTMLElement {
  if (data.runs.length === 0) return h('div', {}, h('h1', {}, 'Runs'), h('p', { class: 'empty' }, 'No runs yet.'))
  return h('div', {},
    h('h1', {}, 'Runs'),
    h('table', {},
      h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Run'), h('th', { scope: 'col' }, 'Status'), h('th', { scope: 'col' }, 'Tasks'),
        h('th', { scope: 'col', class: 'hide-narrow' }, 'Total'), h('th', { scope: 'col', class: 'hide-narrow' }, 'Started'))),
      h('tbody', {}, ...data.runs.map((item) => h('tr', { 'data-run': item.run.run_id },
        h('td', {}, h('a', { href: runHref(item.run.run_id) }, item.run.goal || item.run.run_id), h('div', { class: 'id' }, item.run.run_id)),
        h('td', {}, statusBadge(item.run.status)),
        h('td', {}, countsBar(item.task_counts, item.total_tasks)),
        h('td', { class: 'hide-narrow' }, item.total_tasks),
        h('td', { class: 'hide-narrow' }, time(item.run.created_at))
      )))))
}

function renderRun (data: { run: RunDetail }): HTMLElement {
  const { run, task_counts: counts, total_tasks: total, tasks, blocked_tasks: blocked } = data.run
  return h('div', {},
    h('p', { class: 'crumbs' }, h('a', { href: '#/' }, '← All runs')),
    h('h1', {}, run.goal || run.run_id),
    h('p', { class: 'meta' }, 'Status: ', statusBadge(run.status), ' · ', h('span', { class: 'id' }, run.run_id), ' · started ', time(run.created_at), ' · updated ', time(run.updated_at)),
    run.summary ? h('p', {}, run.summary) : null,
    h('h2', {}, `Tasks by status (${total})`),
    countsBar(counts, total),
    h('h2', {}, `Blocked (${blocked.length})`),
    blocked.length === 0
      ? h('p', { class: 'empty' }, 'No task is waiting on a question.')
      : h('div', { class: 'cards' }, ...blocked.map((item) => h('article', { class: 'card', 'data-blocked': item.task.task_id },
        h('h3', {}, item.task.title, ' ', h('span', { class: 'id' }, item.task.task_id)),
        h('p', { class: 'meta' }, `Attempt ${item.attempt.attempt_no}, assigned to ${item.attempt.assigned_to} · `,
          h('a', { href: threadHref(item.attempt.thread_id) }, 'open the thread')),
        h('div', { class: 'question' },
          h('p', {}, h('strong', {}, 'Question: '), item.question.summary, ' ', h('span', { class: 'meta' }, `from ${item.question.from_agent}, `), time(item.question.created_at)),
          h('details', {}, h('summary', {}, 'full question'), h('pre', {}, item.question.body)),
          artifactList(item.question.artifacts))))),
    h('h2', {}, `Tasks (${tasks.length})`),
    tasks.length === 0
      ? h('p', { class: 'empty' }, 'No tasks yet.')
      : h('table', {},
        h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Task'), h('th', { scope: 'col' }, 'Status'), h('th', { scope: 'col', class: 'hide-narrow' }, 'Priority'),
          h('th', { scope: 'col', class: 'hide-narrow' }, 'Default to'), h('th', { scope: 'col', class: 'hide-narrow' }, 'Attempt'), h('th', { scope: 'col' }, 'Updated'))),
        h('tbody', {}, ...tasks.map((task) => h('tr', { 'data-task': task.task_id },
          h('td', {}, task.title, h('div', { class: 'id' }, task.task_id)),
          h('td', { class: 'task-status' }, statusBadge(task.status)),
          h('td', { class: 'hide-narrow' }, task.priority),
          h('td', { class: 'hide-narrow' }, task.default_to ?? '—'),
          h('td', { class: 'hide-narrow' }, task.latest_attempt_no ?? '—'),
          h('td', {}, time(task.updated_at)))))))
}

function renderThread (data: { thread: ThreadDetail }): HTMLElement {
  const { thread, messages } = data.thread
  return h('div', {},
    h('p', { class: 'crumbs' }, h('a', { href: runHref(thread.run_id) }, `← Run ${thread.run_id}`)),
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

// ---- live data: fetch, render, subscribe, refetch on events ----------------

const live = document.getElementById('live')!
function showLive (state: 'connecting' | 'live' | 'down', text: string) {
  live.textContent = text
  live.className = `live${state === 'live' ? ' is-live' : state === 'down' ? ' is-down' : ''}`
}

interface Page { title: string, dataUrl: string, stream: string, render: (data: never) => HTMLElement }

/** The least time between two starts of a page (fetch, then subscribe) after its stream was refused. */
const RESTART_MS = 2000

/** Shows a page and keeps it current until stop() is called. */
function mount (page: Page): () => void {
  const main = document.getElementById('app')!
  let source: EventSource | undefined
  let refetchTimer: ReturnType<typeof setTimeout> | undefined
  let retryTimer: ReturnType<typeof setTimeout> | undefined
  let stopped = false
  let loading: Promise<string | undefined> | undefined
  let startedAt = 0

  /** Fetches and renders; returns the X-Event-Cursor the body was read at. */
  async function load (): Promise<string | undefined> {
    const response = await fetch(page.dataUrl, { headers: { accept: 'application/json' } })
    const body = await response.json() as { error?: { message: string } }
    if (stopped) return undefined
    if (!response.ok) {
      main.replaceChildren(h('p', { class: 'crumbs' }, h('a', { href: '#/' }, '← All runs')), h('h1', {}, page.title), h('p', { class: 'error' }, body.error?.message ?? `Error ${response.status}`))
      return response.status === 404 ? response.headers.get('x-event-cursor') ?? '0' : undefined
    }
    main.replaceChildren(page.render(body as never))
    showLive(source?.readyState === EventSource.OPEN ? 'live' : 'connecting', source?.readyState === EventSource.OPEN ? `Live · updated ${new Date().toLocaleTimeString()}` : 'Connecting…')
    return response.headers.get('x-event-cursor') ?? undefined
  }

  /** Coalesces bursts of events into one refetch. */
  function refetchSoon () {
    clearTimeout(refetchTimer)
    refetchTimer = setTimeout(() => { void refresh() }, 100)
  }
  async function refresh () {
    loading ??= load().finally(() => { loading = undefined })
    try { await loading } catch { showLive('down', 'Offline · retrying…') }
  }

  function subscribe (cursor: string) {
    const separator = page.stream.includes('?') ? '&' : '?'
    source = new EventSource(`${page.stream}${separator}after_event_id=${encodeURIComponent(cursor)}`)
    let dropped = false
    source.onopen = () => {
      showLive('live', `Live · updated ${new Date().toLocaleTimeString()}`)
      if (dropped) refetchSoon() // back after a drop: catch up on anything the stream cannot say
      dropped = false
    }
    source.onmessage = () => refetchSoon()
    source.onerror = () => {
      dropped = true
      if (source?.readyState === EventSource.CLOSED) {
        // The browser gave up for good: the service answered something else
        // than a stream. Most often 410 cursor_expired: the history kept
        // (EVENTS_RETENTION) has moved past this page's cursor while it was
        // away. Start over: refetch what the page shows and subscribe from
        // that read's X-Event-Cursor. At once, unless the last start was
        // moments ago (then in 2 s, so that a refusal that persists, a 401
        // say, does not loop).
        showLive('connecting', 'Catching up…')
        clearTimeout(retryTimer)
        retryTimer = setTimeout(() => { void start() }, Date.now() - startedAt < RESTART_MS ? RESTART_MS : 0)
      } else {
        showLive('connecting', 'Reconnecting…')
      }
    }
  }

  async function start () {
    startedAt = Date.now()
    source?.close()
    try {
      const cursor = await load()
      if (!stopped && cursor !== undefined) subscribe(cursor)
      else if (!stopped) retryTimer = setTimeout(() => { void start() }, RESTART_MS)
    } catch {
      if (stopped) return
      showLive('down', 'Offline · retrying…')
      retryTimer = setTimeout(() => { void start() }, RESTART_MS)
    }
  }

  document.title = `${page.title} · Control plane`
  showLive('connecting', 'Connecting…')
  void start()
  return () => {
    stopped = true
    source?.close()
    clearTimeout(refetchTimer)
    clearTimeout(retryTimer)
  }
}

// ---- routing: the address is the page (#/, #/runs/<id>, #/threads/<id>) ----

function pageFor (hash: string): Page {
  const [, kind, rawId] = /^#\/(runs|threads)\/(.+)$/.exec(hash) ?? []
  if (kind !== undefined && rawId !== undefined) {
    const id = decodeURIComponent(rawId)
    const path = encodeURIComponent(id)
    return kind === 'runs'
      ? { title: `Run ${id}`, dataUrl: `/api/runs/${path}`, stream: `/api/events/stream?run_id=${path}`, render: renderRun }
      : { title: `Thread ${id}`, dataUrl: `/api/threads/${path}`, stream: `/api/events/stream?thread_id=${path}`, render: renderThread }
  }
  return { title: 'Runs', dataUrl: '/api/runs', stream: '/api/events/stream', render: renderRuns }
}

let stopCurrent: (() => void) | undefined
function route () {
  stopCurrent?.()
  stopCurrent = mount(pageFor(location.hash))
  document.getElementById('app')?.focus({ preventScroll: true })
}
window.addEventListener('hashchange', route)
route()
