import type { Page } from 'playwright-core'
import { sql } from 'kysely'
import t from 'tap'
import { serve } from './helpers/app.ts'
import { openPage, READY_MS, screenshot } from './helpers/browser.ts'
import { insertGraph, json, makeAttempt, makeMessage, makeRun, makeTask, makeThread, writer } from './helpers/fixtures.ts'
import { insertEvents } from './helpers/sse.ts'

// The run page a team lives in, in Chromium: what failed and what waits at
// the top, one click from its thread; each task's story (its attempts and
// threads) on a page of its own; the run's timeline drawn from its events,
// live; the status colours; and a page for something unknown that says so
// and stops.

const LIVE_WITHIN_MS = 2000
const RUN = 'run-team'
const config = { EVENTS_POLL_INTERVAL_MS: 50, SSE_RETRY_MS: 300 }

/** The run's history, a second apart from a fixed start: each task's phases, the threads' messages. */
const BASE = Date.parse('2026-03-02T09:00:00Z')
let second = 0
const event = (eventType: string, taskId: string, fields: { thread_id?: string, summary?: string, status?: string } = {}) => ({
  event_type: eventType,
  run_id: RUN,
  task_id: taskId,
  thread_id: fields.thread_id ?? '',
  summary: fields.summary ?? '',
  payload: json(fields.status === undefined ? {} : { status: fields.status }),
  created_at: new Date(BASE + 1000 * second++)
})

t.before(async () => {
  await insertGraph({
    runs: [makeRun({ run_id: RUN, goal: 'Ship release 4.2', summary: 'Stopped: the integration tests failed', status: 'failed' })],
    tasks: [
      makeTask({ run_id: RUN, task_id: 'task-build', title: 'Build the artifacts', status: 'done', latest_attempt_no: 1 }),
      makeTask({ run_id: RUN, task_id: 'task-tests', title: 'Run the integration tests', summary: 'The whole suite against staging', status: 'failed', latest_attempt_no: 2, default_to: 'worker-ada' }),
      makeTask({ run_id: RUN, task_id: 'task-notes', title: 'Write the release notes', status: 'blocked', latest_attempt_no: 1 }),
      makeTask({ run_id: RUN, task_id: 'task-sign', title: 'Sign the release', status: 'blocked' }),
      makeTask({ run_id: RUN, task_id: 'task-deploy', title: 'Deploy to production', status: 'ready' })
    ],
    task_attempts: [
      makeAttempt({ run_id: RUN, task_id: 'task-build', thread_id: 'thread-build-1', assigned_to: 'worker-grace', status: 'done' }),
      makeAttempt({ run_id: RUN, task_id: 'task-tests', attempt_no: 1, thread_id: 'thread-tests-1', assigned_to: 'worker-ada', status: 'failed', branch_name: 'task/tests-1', base_ref: 'main', base_commit: 'a1b2c3d', workspace_status: 'dirty' }),
      makeAttempt({ run_id: RUN, task_id: 'task-tests', attempt_no: 2, thread_id: 'thread-tests-2', assigned_to: 'worker-linus', status: 'failed', branch_name: 'task/tests-2', base_ref: 'main', base_commit: 'a1b2c3d', result_commit: 'e4f5a6b', workspace_status: 'clean', worktree_path: '/work/tests-2' }),
      makeAttempt({ run_id: RUN, task_id: 'task-notes', thread_id: 'thread-notes-1', assigned_to: 'worker-barbara' })
    ],
    threads: [
      makeThread({ run_id: RUN, task_id: 'task-build', thread_id: 'thread-build-1', subject: 'Build', status: 'claimed' }),
      makeThread({ run_id: RUN, task_id: 'task-tests', thread_id: 'thread-tests-1', subject: 'Integration tests, first try', status: 'claimed' }),
      makeThread({ run_id: RUN, task_id: 'task-tests', thread_id: 'thread-tests-2', subject: 'Integration tests, second try', status: 'claimed' }),
      makeThread({ run_id: RUN, task_id: 'task-notes', thread_id: 'thread-notes-1', subject: 'Release notes' })
    ],
    messages: [
      makeMessage({ thread_id: 'thread-tests-2', message_id: 'msg-tests-result', kind: 'result', summary: '3 of 120 tests failed' }),
      makeMessage({ thread_id: 'thread-notes-1', message_id: 'msg-notes-question', kind: 'question', summary: 'Which changes go in the highlights?' })
    ]
  })
  await insertEvents(
    event('run_created', ''),
    ...['task-build', 'task-tests', 'task-notes', 'task-sign', 'task-deploy'].map((task) => event('task_added', task)),
    event('task_ready', 'task-build', { status: 'ready' }),
    event('task_dispatched', 'task-build', { thread_id: 'thread-build-1' }),
    event('task_running', 'task-build', { status: 'running' }),
    event('task_done', 'task-build', { status: 'done', summary: 'Accepted' }),
    event('task_ready', 'task-tests', { status: 'ready' }),
    event('task_dispatched', 'task-tests', { thread_id: 'thread-tests-1' }),
    event('task_running', 'task-tests', { status: 'running' }),
    event('task_failed', 'task-tests', { status: 'failed', summary: 'Tests failed; will retry' }),
    event('task_ready', 'task-notes', { status: 'ready' }),
    event('task_dispatched', 'task-notes', { thread_id: 'thread-notes-1' }),
    event('task_dispatched', 'task-tests', { thread_id: 'thread-tests-2' }),
    event('task_running', 'task-notes'), // the type says the status when the payload does not
    event('task_running', 'task-tests', { status: 'running' }),
    event('thread_update', 'task-notes', { thread_id: 'thread-notes-1', summary: 'Which changes go in the highlights?' }),
    event('task_blocked', 'task-notes', { status: 'blocked', summary: 'Which changes go in the highlights?' }),
    event('thread_result', 'task-tests', { thread_id: 'thread-tests-2', summary: '3 of 120 tests failed' }),
    event('task_failed', 'task-tests', { status: 'failed', summary: '3 of 120 tests failed' }),
    event('task_blocked', 'task-sign', { status: 'blocked' }),
    event('task_ready', 'task-deploy', { status: 'ready' }),
    event('run_status', '', { status: 'failed', summary: 'Stopped: the integration tests failed' }))
})

/** The phases a task's lane draws, in order. */
const phases = (page: Page, taskId: string) => page.locator(`li[data-lane="${taskId}"] rect[data-phase]`).evaluateAll((rects) => rects.map((rect) => rect.getAttribute('data-phase')))

t.test('a failed run says at the top which tasks failed and which wait, each one click from its thread', async (t) => {
  const { url } = await serve(t, config)
  const page = await openPage(t, `${url}/#/runs/${RUN}`)
  const failed = page.locator('[data-failed="task-tests"]')
  await failed.waitFor()
  t.equal(await page.locator('[data-failed]').count(), 1, 'the one failed task')
  t.match(await failed.textContent(), /Run the integration tests/)
  t.match(await failed.textContent(), /The whole suite against staging/, 'with its summary')
  await page.locator('[data-failed="task-tests"] a', { hasText: 'open the thread' }).waitFor() // once the run's events name its thread
  t.match(await failed.textContent(), /3 of 120 tests failed/, 'and what its last event said')
  // In the page (its own types are the DOM's, not this file's): whether each comes after the failed task.
  const above = await page.evaluate<boolean[]>(`['[data-blocked]', '.timeline', 'tr[data-task]'].map((selector) =>
    Boolean(document.querySelector('[data-failed]').compareDocumentPosition(document.querySelector(selector)) & Node.DOCUMENT_POSITION_FOLLOWING))`)
  t.same(above, [true, true, true], 'above the blocked tasks, the timeline and the tasks table')

  t.equal(await page.locator('#blocked-title').textContent(), 'Blocked (2)', 'both blocked tasks, as the counts say')
  t.match(await page.locator('.legend').first().textContent(), /2 blocked/)
  t.match(await page.locator('[data-blocked="task-notes"]').textContent(), /Question: Which changes go in the highlights\?/)
  t.match(await page.locator('[data-blocked="task-sign"]').textContent(), /blocked no question yet/, 'a task blocked with no attempt yet: no question yet')
  t.equal(await page.locator('[data-blocked="task-sign"] a').first().getAttribute('href'), `#/runs/${RUN}/tasks/task-sign`)
  await screenshot(page, 'run-failed')

  await page.locator('[data-failed="task-tests"] a', { hasText: 'open the thread' }).click()
  await page.locator('h1', { hasText: 'Integration tests, second try' }).waitFor()
  t.match(page.url(), /#\/threads\/thread-tests-2$/, 'one click: the thread of its latest attempt')
  t.match(await page.locator('[data-message="msg-tests-result"]').textContent(), /3 of 120 tests failed/)
  await page.locator('.crumbs a', { hasText: 'task task-tests' }).click()
  await page.locator('h1', { hasText: 'Run the integration tests' }).waitFor()
  t.pass('and the thread links back to its task')
})

t.test('every task row opens its story: each attempt, each thread; reload and back keep it', async (t) => {
  const { url } = await serve(t, config)
  const page = await openPage(t, `${url}/#/runs/${RUN}`)
  await page.locator('tr[data-task="task-tests"] a').click()
  await page.locator('h1', { hasText: 'Run the integration tests' }).waitFor()
  t.match(page.url(), new RegExp(`#/runs/${RUN}/tasks/task-tests$`), 'the address is the task\'s')
  t.match(await page.locator('main .meta').first().textContent(), /failed · task-tests · priority normal · default to worker-ada/)
  t.same(await page.locator('[data-attempt]').evaluateAll((items) => items.map((item) => item.getAttribute('data-attempt'))), ['2', '1'], 'its attempts, newest first')
  const second = await page.locator('[data-attempt="2"]').textContent()
  for (const fact of ['Attempt 2', 'failed', 'worker-linus', 'task/tests-2', 'main at a1b2c3d', 'e4f5a6b', 'clean, /work/tests-2', 'Started', 'Updated']) {
    t.ok(second!.includes(fact), `attempt 2 says ${fact}`)
  }
  t.match(await page.locator('[data-attempt="1"]').textContent(), /dirty/)
  t.same(await page.locator('[data-thread] a').evaluateAll((links) => links.map((link) => link.getAttribute('href'))), ['#/threads/thread-tests-2', '#/threads/thread-tests-1'], 'its threads, newest first, each linking to its page')
  t.same(await phases(page, 'task-tests'), ['added', 'ready', 'dispatched', 'running', 'failed', 'dispatched', 'running', 'failed'], 'its phases, from the run\'s events')
  t.match(await page.locator('ol.activity li').first().textContent(), /task_failed.*3 of 120 tests failed/, 'its latest event on top')
  t.equal(await page.locator('ol.activity li').count(), 9, 'its events only')
  await screenshot(page, 'task')

  await page.reload()
  await page.locator('[data-attempt="2"]').waitFor()
  t.pass('reload shows the task again')
  await page.locator('[data-thread="thread-tests-1"] a').click()
  await page.locator('h1', { hasText: 'Integration tests, first try' }).waitFor()
  await page.goBack()
  await page.locator('[data-attempt="2"]').waitFor()
  await page.goBack()
  await page.locator('tr[data-task="task-tests"]').waitFor()
  t.match(page.url(), new RegExp(`#/runs/${RUN}$`), 'back returns to the run')

  await page.goto(`${url}/#/runs/${RUN}/tasks/task-deploy`)
  await page.locator('h1', { hasText: 'Deploy to production' }).waitFor()
  t.equal(await page.locator('main .empty').first().textContent(), 'Not dispatched yet.', 'a task without attempts says so')
})

t.test('the timeline: a lane per task with its phases and times, updated live as events arrive', async (t) => {
  const { url } = await serve(t, config)
  const page = await openPage(t, `${url}/#/runs/${RUN}`)
  const timeline = page.locator('.timeline')
  await page.locator('.timeline[data-events="26"]').waitFor()
  t.same(await page.locator('li[data-lane]').evaluateAll((lanes) => lanes.map((lane) => lane.getAttribute('data-lane'))),
    ['task-build', 'task-tests', 'task-notes', 'task-sign', 'task-deploy'], 'a lane per task, in the run\'s order')
  t.same(await phases(page, 'task-build'), ['added', 'ready', 'dispatched', 'running', 'done'])
  t.same(await phases(page, 'task-notes'), ['added', 'ready', 'dispatched', 'running', 'blocked'], 'a task event without a status in its payload: its type says it')
  t.match(await page.locator('li[data-lane="task-build"] .lane-now').textContent(), /^done /, 'its latest phase in words')
  t.match(await page.locator('li[data-lane="task-build"] rect[data-phase="running"] title').textContent(), /^running from .+ to .+ \(1 s\)$/, 'each phase\'s times, in its tooltip')
  t.match(await page.locator('li[data-lane="task-build"] svg').getAttribute('aria-label'), /^added .+, ready .+, dispatched .+, running .+, done .+$/, 'and every phase in words, for a screen reader')
  t.match(await timeline.locator('p.meta').textContent(), /^26 events, from .+ to .+ \(25 s\)\.$/)
  t.ok(await page.locator('.timeline .notice').isHidden(), 'nothing is missing from its start')
  t.match(await page.locator('li[data-lane="task-tests"] a').getAttribute('href'), /#\/runs\/run-team\/tasks\/task-tests$/, 'a lane\'s name opens the task')
  t.match(await page.locator('ol.activity li').first().textContent(), /run_status/, 'the run\'s own activity, newest first')
  await screenshot(page, 'timeline')

  const started = Date.now()
  const [running] = await insertEvents({ event_type: 'task_dispatched', run_id: RUN, task_id: 'task-deploy', thread_id: 'thread-deploy-1', summary: 'attempt 1 to worker-ada' })
  await page.locator('li[data-lane="task-deploy"] rect[data-phase="dispatched"]').waitFor({ timeout: LIVE_WITHIN_MS })
  t.ok(Date.now() - started <= LIVE_WITHIN_MS, `drawn after ${Date.now() - started} ms`)
  t.same(await phases(page, 'task-deploy'), ['added', 'ready', 'dispatched'])
  t.match(await page.locator('li[data-lane="task-deploy"] .lane-now').textContent(), /^dispatched /)
  t.equal(await page.locator('ol.activity li').first().getAttribute('data-event'), String(running), 'and on top of the activity')
  t.equal(await timeline.getAttribute('data-events'), '27')

  // A task the run's read has not listed yet: its lane comes with its first event, and keeps its place once the read lists it.
  await insertEvents({ event_type: 'task_added', run_id: RUN, task_id: 'task-late', summary: 'Announce the release' })
  await page.locator('li[data-lane="task-late"] rect[data-phase="added"]').waitFor({ timeout: LIVE_WITHIN_MS })
  t.equal(await page.locator('li[data-lane]').last().getAttribute('data-lane'), 'task-late')
})

t.test('a timeline whose oldest events are no longer kept says it starts later', async (t) => {
  const db = await writer()
  const firstOfTests = await db.selectFrom('events').select('event_id').where('run_id', '=', RUN).where('event_type', '=', 'task_ready').orderBy('event_id').limit(1).executeTakeFirstOrThrow()
  // As EVENTS_RETENTION leaves it: the history's floor past the run's first events.
  await sql`update event_log_state set history_floor = ${Number(firstOfTests.event_id) - 1}`.execute(db)
  t.teardown(() => sql`update event_log_state set history_floor = 0`.execute(db))
  const { url } = await serve(t, config)
  const page = await openPage(t, `${url}/#/runs/${RUN}`, { expectedConsole: [/status of 410 .*\/api\/events\?after_event_id=0&run_id=run-team&/] })
  const notice = page.locator('.timeline .notice')
  await notice.waitFor()
  t.match(await notice.textContent(), /^Older events of this run are no longer kept: the timeline starts later, at .+\.$/)
  t.same(await phases(page, 'task-build'), ['ready', 'dispatched', 'running', 'done'], 'the lanes begin where the history kept does')
})

/** The hue (degrees) of a CSS rgb() colour. */
function hue (rgb: string): number {
  const [r, g, b] = rgb.match(/\d+/g)!.slice(0, 3).map((part) => Number(part) / 255) as [number, number, number]
  const max = Math.max(r, g, b)
  const spread = max - Math.min(r, g, b)
  if (spread === 0) return 0
  const degrees = max === r ? 60 * (((g - b) / spread) % 6) : max === g ? 60 * ((b - r) / spread + 2) : 60 * ((r - g) / spread + 4)
  return (degrees + 360) % 360
}

/** How far a CSS rgb() colour is from grey: 0 for a grey, 1 for a pure hue. */
function chroma (rgb: string): number {
  const parts = rgb.match(/\d+/g)!.slice(0, 3).map((part) => Number(part) / 255)
  return Math.max(...parts) - Math.min(...parts)
}

/** WCAG's contrast ratio of two CSS rgb() colours. */
function contrast (one: string, other: string): number {
  const luminance = (rgb: string) => {
    const [r, g, b] = rgb.match(/\d+/g)!.slice(0, 3).map((part) => {
      const value = Number(part) / 255
      return value <= 0.03928 ? value / 12.92 : ((value + 0.055) / 1.055) ** 2.4
    }) as [number, number, number]
    return 0.2126 * r + 0.7152 * g + 0.0722 * b
  }
  const [light, dark] = [luminance(one), luminance(other)].sort((a, b) => b - a) as [number, number]
  return (light + 0.05) / (dark + 0.05)
}

t.test('status colours as CI pages use them, each known status its own, every word readable on its badge', async (t) => {
  const { url } = await serve(t, config)
  const page = await openPage(t, `${url}/#/runs/${RUN}`)
  await page.locator('li[data-lane="task-tests"] rect[data-phase="failed"]').first().waitFor()
  /** The colours the page computes for the first element `selector` finds. */
  const styleOf = (selector: string) => page.evaluate<{ color: string, background: string, fill: string, text: string }>(`(() => {
    const element = document.querySelector(${JSON.stringify(selector)})
    const style = getComputedStyle(element)
    return { color: style.color, background: style.backgroundColor, fill: style.fill, text: element.textContent }
  })()`)
  const failed = await styleOf('tr[data-task="task-tests"] .status')
  const blocked = await styleOf('tr[data-task="task-notes"] .status')
  const done = await styleOf('tr[data-task="task-build"] .status')
  t.equal(failed.text, 'failed', 'the word beside its colour')
  const near = (value: number, target: number, within: number) => Math.min(Math.abs(value - target), 360 - Math.abs(value - target)) <= within
  t.ok(near(hue(failed.color), 0, 15) && near(hue(failed.background), 0, 15), `failed is red (${failed.color} on ${failed.background})`)
  t.ok(near(hue(blocked.color), 42, 12) && near(hue(blocked.background), 45, 12), `blocked is amber (${blocked.color} on ${blocked.background})`)
  t.ok(near(hue(done.color), 135, 25), `done is green (${done.color})`)
  const runningFill = await styleOf('li[data-lane="task-build"] rect[data-phase="running"]')
  t.ok(near(hue(runningFill.fill), 215, 20), `a running phase is blue (${runningFill.fill})`)
  const failedFill = await styleOf('li[data-lane="task-tests"] rect[data-phase="failed"]')
  t.ok(near(hue(failedFill.fill), 0, 15), `a failed phase is red (${failedFill.fill})`)

  // Every status the runs, tasks, attempts and threads of the demo use, and one nobody knows.
  const known = ['added', 'ready', 'dispatched', 'running', 'blocked', 'done', 'failed', 'open', 'claimed']
  const badges = await page.evaluate<Array<{ status: string, color: string, background: string }>>(`${JSON.stringify([...known, 'other'])}.map((status) => {
    const badge = document.createElement('span')
    badge.className = 'status status-' + status
    badge.textContent = status
    document.querySelector('main').append(badge)
    const style = getComputedStyle(badge)
    return { status, color: style.color, background: style.backgroundColor }
  })`)
  for (const { status, color, background } of badges) {
    t.ok(contrast(color, background) >= 4.5, `${status}: ${color} on ${background}, ${contrast(color, background).toFixed(1)}:1 (WCAG AA: 4.5)`)
  }
  t.equal(new Set(badges.map((badge) => badge.background)).size, badges.length, 'each status its own colour, none the unknown\'s grey')
  const grey = badges.at(-1)!
  t.ok(chroma(grey.color) < 0.1 && chroma(grey.background) < 0.05, `an unknown status: neutral grey (${grey.color} on ${grey.background})`)
})

t.test('an unknown run, task or thread: the page says so, and stops connecting', async (t) => {
  const { url } = await serve(t, config)
  for (const [path, said] of [['#/runs/run-nobody', /run not found/i], [`#/runs/${RUN}/tasks/task-nobody`, /task not found/i], ['#/threads/thread-nobody', /thread not found/i]] as const) {
    const requests: string[] = []
    const page = await openPage(t, `${url}/${path}`, {
      readySelector: 'main .error',
      expectedConsole: [/status of 404/],
      beforeGoto: (page) => page.on('request', (request) => { requests.push(request.url()) })
    })
    t.match(await page.locator('main .error').textContent(), said, `${path}: says what is unknown`)
    await page.locator('.live.is-stopped').waitFor({ timeout: READY_MS })
    t.equal(await page.locator('.live').textContent(), 'Not found · not live', `${path}: the header no longer says Connecting…`)
    const asked = requests.length
    await page.waitForTimeout(1500)
    t.equal(requests.length, asked, `${path}: and nothing more is asked for`)
  }
})
