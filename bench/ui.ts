/*
 * npm run bench:ui: what the web UI's run page costs in Chromium, on a run
 * of 200 tasks with 3,000 events (their attempts and threads beside).
 *
 * - First render, each round in a fresh browser context: from navigation
 *   to the task table drawn (every row), and to the timeline drawn (every
 *   event), on the page's own clock.
 * - The timeline alone (ui/timeline.ts, imported by the page): drawing the
 *   3,000 events from scratch, then one live event at a time, each with
 *   the layout it causes; most fall inside the span drawn, and one in ten
 *   past it (the lanes rescaled).
 * - The whole page per live event: events committed one at a time, each
 *   with its task's change of status, as an orchestrator writes them;
 *   the page's main-thread time (Chrome's TaskDuration) per event, less its
 *   idle time over as long, which includes reading the run again and
 *   drawing its head and its table.
 *
 *   DATABASE_URL=postgres://... npm run bench:ui -- [--tasks 200] [--events 3000] [--rounds 3] [--live 50]
 *   ... npm run bench:ui -- --quick       (20 tasks, 300 events, one round: CI's smoke run)
 *   ... --no-build                        (ui/build as it is: CI builds it once, and tests read it meanwhile)
 */
import { spawnSync } from 'node:child_process'
import { existsSync } from 'node:fs'
import { parseArgs } from 'node:util'
import type { Insertable } from 'kysely'
import pg from 'pg'
import { chromium, type Page } from 'playwright-core'
import { buildApp } from '../app.ts'
import { loadConfig } from '../config.ts'
import { createDb } from '../db/pool.ts'
import type { EventsTable, TasksTable } from '../db/schema.ts'
import { BENCH_SERVICE_ENV, gitDescription, median, migratedDatabase, root, sleep } from './common.ts'

const { values: args } = parseArgs({
  options: {
    tasks: { type: 'string', default: '200' },
    events: { type: 'string', default: '3000' },
    rounds: { type: 'string', default: '3' },
    live: { type: 'string', default: '50' },
    quick: { type: 'boolean', default: false },
    'no-build': { type: 'boolean', default: false }
  }
})
const TASKS = args.quick ? 20 : Number(args.tasks)
const EVENTS = args.quick ? 300 : Number(args.events)
const ROUNDS = args.quick ? 1 : Number(args.rounds)
const LIVE = args.quick ? 5 : Number(args.live)
const DATABASE = 'ocp_bench_ui'
const RUN = 'run-bench'
const CHROMIUM = process.env.CHROMIUM_BIN ?? '/usr/bin/chromium'
/** Apart enough that each live event is drawn on its own (the page coalesces those that arrive during a read). */
const LIVE_PACE_MS = 200

/** A task's phases, then its messages: EVENTS / TASKS events each, over the run's hour, deterministically. */
function history (start: number) {
  const perTask = Math.max(6, Math.round(EVENTS / TASKS))
  const tasks: Array<Insertable<TasksTable>> = []
  const events: Array<Insertable<EventsTable> & { created_at: Date }> = []
  for (let i = 0; i < TASKS; i++) {
    const id = `task-${String(i).padStart(3, '0')}`
    const thread = `thread-${id}`
    const retried = i % 7 === 3
    const blocked = i % 4 === 1
    const unfinished = i % 10 === 9
    const final = unfinished ? 'running' : i % 13 === 5 ? 'failed' : 'done'
    const steps: Array<{ type: string, status?: string, thread?: boolean, summary: string }> = [
      { type: 'task_added', summary: `Task ${i}` },
      { type: 'task_ready', status: 'ready', summary: 'Ready to dispatch' },
      { type: 'task_dispatched', thread: true, summary: 'attempt 1 to worker-ada' },
      { type: 'thread_claim', thread: true, summary: 'worker-ada claimed the thread' },
      { type: 'task_running', status: 'running', summary: 'Work started' }
    ]
    if (retried) steps.push({ type: 'task_failed', status: 'failed', summary: 'Tests failed; will retry' }, { type: 'task_dispatched', thread: true, summary: 'attempt 2 to worker-grace' }, { type: 'task_running', status: 'running', summary: 'Work started' })
    if (blocked) steps.push({ type: 'thread_update', thread: true, summary: 'Which time zone should reports use?' }, { type: 'task_blocked', status: 'blocked', summary: 'Which time zone should reports use?' }, { type: 'thread_reply', thread: true, summary: 'UTC' }, { type: 'task_answered', thread: true, summary: 'UTC' })
    const ending = unfinished ? [] : [{ type: 'thread_result', thread: true, summary: 'Done: all checks green' }, { type: `task_${final}`, status: final, summary: final === 'done' ? 'Accepted' : 'Checks failed' }]
    while (steps.length + ending.length < perTask) steps.push({ type: 'thread_update', thread: true, summary: 'Progress' })
    steps.push(...ending)
    // Each task in its own stretch of the hour, its events in order within it.
    const begin = start + ((i * 1_800_000) / TASKS)
    const length = 600_000 + ((i * 7919) % 1_200_000)
    steps.forEach((step, n) => events.push({
      event_type: step.type,
      run_id: RUN,
      task_id: id,
      thread_id: step.thread ? thread : '',
      summary: step.summary,
      payload: JSON.stringify(step.status === undefined ? {} : { status: step.status }),
      created_at: new Date(begin + (n * length) / steps.length)
    }))
    tasks.push({ run_id: RUN, task_id: id, title: `Task ${i}: port module ${i}`, summary: `Part ${i} of the port`, status: final, priority: 'normal', acceptance_json: '{}', latest_attempt_no: 1, created_at: new Date(begin), updated_at: new Date(begin + length) })
  }
  events.sort((a, b) => a.created_at.getTime() - b.created_at.getTime())
  return { tasks, events }
}

/** The run, its tasks (each with an attempt and a thread) and its history, written as an orchestrator would. */
async function seed (databaseUrl: string): Promise<number> {
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 2 })
  const db = createDb(pool)
  try {
    const start = Date.now() - 3_600_000
    const { tasks, events } = history(start)
    await db.insertInto('runs').values({ run_id: RUN, goal: 'Port the billing service', summary: 'Running', status: 'running', created_at: new Date(start), updated_at: new Date(start) }).execute()
    await db.insertInto('tasks').values(tasks).execute()
    await db.insertInto('threads').values(tasks.map((task) => ({ thread_id: `thread-${task.task_id}`, run_id: RUN, task_id: task.task_id, subject: task.title, created_by: 'orchestrator', assigned_to: 'worker-ada', status: 'claimed', priority: 'normal', created_at: task.created_at, updated_at: task.updated_at }))).execute()
    await db.insertInto('task_attempts').values(tasks.map((task) => ({ run_id: RUN, task_id: task.task_id, attempt_no: 1, assigned_to: 'worker-ada', thread_id: `thread-${task.task_id}`, status: 'running', branch_name: `task/${task.task_id}-1`, base_ref: 'main', workspace_status: 'clean', created_at: task.created_at, updated_at: task.updated_at }))).execute()
    for (let i = 0; i < events.length; i += 1000) await db.insertInto('events').values(events.slice(i, i + 1000)).execute()
    return events.length
  } finally {
    await db.destroy()
  }
}

/** In the page, before its scripts: when the task table has every row, and when the timeline has drawn every event (the page's clock). */
const FIRST_RENDER_CLOCK = (tasks: number, events: number) => `
  window.drawn = {}
  new MutationObserver((records, observer) => {
    if (window.drawn.table === undefined && document.querySelectorAll('tr[data-task]').length >= ${tasks}) window.drawn.table = performance.now()
    if (window.drawn.timeline === undefined && document.querySelector('.timeline')?.dataset.events === '${events}') window.drawn.timeline = performance.now()
    if (window.drawn.table !== undefined && window.drawn.timeline !== undefined) observer.disconnect()
  }).observe(document, { childList: true, subtree: true, attributes: true, attributeFilter: ['data-events'] })`

/** In the page: ui/timeline.ts alone, on the run's events as the API lists them; what a reset and each live event cost. */
const TIMELINE_ALONE = (live: number) => `(async () => {
  const { Timeline } = await import('/ui/build/ui/timeline.js')
  const events = []
  for (let after = 0; ;) {
    const page = await (await fetch('/api/events?run_id=${RUN}&limit=1000&after_event_id=' + after)).json()
    events.push(...page.events)
    if (page.events.length < 1000) break
    after = page.events.at(-1).event_id
  }
  const host = document.createElement('section')
  document.querySelector('main').append(host)
  const timeline = new Timeline((id) => '#' + id)
  host.append(timeline.element)
  let began = performance.now()
  timeline.reset(events, false)
  timeline.element.getBoundingClientRect()
  const reset = performance.now() - began
  const last = events.at(-1)
  const tasks = [...new Set(events.map((event) => event.task_id))]
  const phases = ['running', 'blocked', 'running', 'done']
  const inside = []
  const past = []
  let at = Date.parse(last.created_at)
  for (let i = 0; i < ${live}; i++) {
    // One in ten far past the span drawn: the lanes rescale.
    const rescales = i % 10 === 9
    at += rescales ? 3_600_000 : 1000
    const event = { ...last, event_id: last.event_id + 1 + i, event_type: 'task_' + phases[i % 4], task_id: tasks[(i * 37) % tasks.length], payload: { status: phases[i % 4] }, created_at: new Date(at).toISOString() }
    began = performance.now()
    timeline.add(event)
    timeline.element.getBoundingClientRect() // the style and layout it causes
    ;(rescales ? past : inside).push(performance.now() - began)
  }
  host.remove()
  return { events: events.length, reset, inside, past }
})()`

/** Polls `expression` in the page until it holds (waitForFunction would eval it, which the page's policy refuses). */
async function until (page: Page, expression: string, timeoutMs = 60_000) {
  const deadline = Date.now() + timeoutMs
  while (!await page.evaluate<boolean>(expression)) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${expression}`)
    await sleep(20)
  }
}

const round1 = (value: number) => Math.round(value * 10) / 10
const ms = (values: number[]) => values.map((value) => `${Math.round(value)}`).join(', ')

async function main () {
  if (!existsSync(CHROMIUM)) throw new Error(`chromium not found at ${CHROMIUM}: apt-get install chromium (or set CHROMIUM_BIN)`)
  if (!args['no-build']) {
    const build = spawnSync('npm', ['run', '--silent', 'build:ui'], { cwd: root, stdio: 'inherit' })
    if (build.status !== 0) throw new Error('npm run build:ui failed')
  }
  const databaseUrl = await migratedDatabase(DATABASE)
  const events = await seed(databaseUrl)
  // No load shedding, as in every bench: Chromium beside the service on a busy machine delays its event loop, and a
  // page answered 503 never draws.
  const app = await buildApp(loadConfig({ DATABASE_URL: databaseUrl, LOG_LEVEL: 'warn', LOG_FORMAT: 'json', ...BENCH_SERVICE_ENV }))
  await app.listen({ port: 0, host: '127.0.0.1' })
  const url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`
  const browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--no-first-run', '--disable-sync'] })
  const writer = new pg.Pool({ connectionString: databaseUrl, max: 1 })
  try {
    const version = browser.version()
    console.log(`bench:ui, ${gitDescription()}, node ${process.version}, Chromium ${version}: a run of ${TASKS} tasks and ${events} events, ${ROUNDS} round(s)`)

    const tables: number[] = []
    const timelines: number[] = []
    let page: Page | undefined
    for (let round = 1; round <= ROUNDS; round++) {
      await page?.context().close()
      const context = await browser.newContext({ viewport: { width: 1100, height: 900 } })
      page = await context.newPage()
      await page.addInitScript({ content: FIRST_RENDER_CLOCK(TASKS, events) })
      await page.goto(`${url}/#/runs/${RUN}`)
      await until(page, 'window.drawn.table !== undefined && window.drawn.timeline !== undefined')
      const drawn = await page.evaluate<{ table: number, timeline: number }>('window.drawn')
      tables.push(drawn.table)
      timelines.push(drawn.timeline)
      console.log(`round ${round}: the task table drawn at ${Math.round(drawn.table)} ms, the timeline at ${Math.round(drawn.timeline)} ms after navigation began`)
    }
    console.log(`first render, median of ${ROUNDS}: the task table at ${Math.round(median(tables))} ms (${ms(tables)}), the timeline at ${Math.round(median(timelines))} ms (${ms(timelines)})`)

    const alone = await page!.evaluate<{ events: number, reset: number, inside: number[], past: number[] }>(TIMELINE_ALONE(Math.max(LIVE, 10)))
    console.log(`the timeline alone: ${alone.events} events drawn from scratch in ${round1(alone.reset)} ms; a live event ${round1(median(alone.inside))} ms (median of ${alone.inside.length}, max ${round1(Math.max(...alone.inside))}), ${round1(median(alone.past))} ms when it rescales the lanes (median of ${alone.past.length})`)

    // The whole page, as events arrive: Chrome's main-thread time for the page's tab, before and after.
    const session = await page!.context().newCDPSession(page!)
    await session.send('Performance.enable')
    const MEASURES = ['TaskDuration', 'ScriptDuration', 'RecalcStyleDuration', 'LayoutDuration'] as const
    /** The page's main-thread seconds so far: in all, running script, computing style, laying out. */
    const measures = async () => {
      const { metrics } = await session.send('Performance.getMetrics')
      return MEASURES.map((name) => metrics.find((metric) => metric.name === name)!.value)
    }
    await sleep(1000) // what the page still had to do settles
    // Its idle cost (the relative times redrawn each second), over as long as the live events take: subtracted.
    const idleMs = LIVE * LIVE_PACE_MS + 1000
    const idleStart = await measures()
    await sleep(idleMs)
    const idle = (await measures()).map((value, i) => value - idleStart[i]!)
    const before = await measures()
    const began = Date.now()
    const statuses = ['running', 'blocked', 'running', 'done']
    for (let i = 0; i < LIVE; i++) {
      const task = `task-${String((i * 37) % TASKS).padStart(3, '0')}`
      const status = statuses[i % statuses.length]!
      const client = await writer.connect()
      try {
        await client.query('begin')
        await client.query('update tasks set status = $1, updated_at = now() where run_id = $2 and task_id = $3', [status, RUN, task])
        await client.query('insert into events (event_type, run_id, task_id, summary, payload) values ($1, $2, $3, $4, $5)', [`task_${status}`, RUN, task, 'live', JSON.stringify({ status })])
        await client.query('commit')
      } finally {
        client.release()
      }
      await sleep(LIVE_PACE_MS)
    }
    await until(page!, `document.querySelector('.timeline').dataset.events === '${events + LIVE}'`)
    await sleep(Math.max(0, began + idleMs - Date.now()))
    // Less the idle time, a part may come out below zero by the noise of its idle reading: none is shown below zero.
    const [all, script, style, layout] = (await measures()).map((value, i) => round1(Math.max(0, (value - before[i]! - idle[i]!) * 1000 / LIVE)))
    console.log(`the whole page, per live event (${LIVE} events ${LIVE_PACE_MS} ms apart, each changing its task's status): ${all} ms of main-thread time (script ${script}, style ${style}, layout ${layout}): the run read again, its head, table and timeline drawn`)
  } finally {
    await browser.close()
    await writer.end()
    await app.close()
  }
}

await main()
