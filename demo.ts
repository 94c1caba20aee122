import pg from 'pg'
import { basename, dirname, join } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { buildApp } from './app.ts'
import { ConfigError, listenFailure, loadConfig, loadDemoConfig } from './config.ts'
import { loadFixtureFile } from './db/fixtures.ts'
import { migrateToLatest } from './db/migrate.ts'
import { createDb } from './db/pool.ts'
import {
  addTask, answerQuestion, blockOnQuestion, createRun, dispatchTask, postMessage, recordChange, setRunStatus, setTaskStatus, type Writer
} from './db/writer.ts'

/*
 * `npm run demo`: the service, plus a simulated orchestrator that keeps the
 * control plane busy through db/writer.ts: runs are created, their tasks
 * move through ready, dispatched and running, some get blocked on a question
 * and answered, workers post updates and results with artifacts, and a
 * council tallies each finished run. Every event type of docs/reference.md, "Event types"
 * appears. Watch http://localhost:8080/ or `curl -N localhost:8080/api/events/stream`.
 */

type Stage = 'added' | 'ready' | 'dispatched' | 'running' | 'blocked' | 'done' | 'failed'
interface DemoTask { id: string, title: string, stage: Stage, attempt: number, thread?: string }
interface DemoRun { id: string, tasks: DemoTask[] }

const GOALS = [
  'Migrate billing to the new ledger', 'Add SSO to the admin console', 'Cut p99 latency of search in half',
  'Ship the mobile offline mode', 'Rotate every service credential', 'Upgrade the data pipeline to Postgres 17'
]
const TASKS = [
  'Write the design note', 'Add the schema migration', 'Backfill historical data', 'Port the API handlers', 'Write integration tests',
  'Benchmark the hot path', 'Update the runbook', 'Review security impact', 'Roll out behind a flag', 'Clean up the old code path'
]
const WORKERS = ['worker-ada', 'worker-grace', 'worker-linus', 'worker-barbara']
const QUESTIONS = [
  ['Which time zone should reports use?', 'The legacy jobs use server-local time; the new ledger stores UTC. Convert at read time or at write time?'],
  ['May I drop the old index?', 'It is unused in the last 30 days of query stats, but a monthly job might still need it.'],
  ['What is the rollout order?', 'Canary region first, or internal tenants first?']
]

/** A small seeded generator, so the tests can replay a simulation exactly. */
export function seededRandom (seed: number): () => number {
  let state = seed >>> 0
  return () => {
    state = (state + 0x6D2B79F5) >>> 0
    let value = Math.imul(state ^ (state >>> 15), 1 | state)
    value ^= value + Math.imul(value ^ (value >>> 7), 61 | value)
    return ((value ^ (value >>> 14)) >>> 0) / 4294967296
  }
}

export class DemoOrchestrator {
  readonly #runs: DemoRun[] = []
  #sequence = 0
  readonly #prefix: string
  readonly db: Writer
  readonly random: () => number

  constructor (db: Writer, random: () => number = Math.random, prefix = Date.now().toString(36)) {
    this.db = db
    this.random = random
    this.#prefix = prefix
  }

  #pick<T> (items: readonly T[]): T {
    return items[Math.floor(this.random() * items.length)]!
  }

  #id (kind: string) {
    return `${kind}-${this.#prefix}-${++this.#sequence}`
  }

  /** Advances the simulation by one change (or a few, for a new run); says what it did. */
  async step (): Promise<string> {
    const active = this.#runs.filter((run) => run.tasks.some((task) => task.stage !== 'done' && task.stage !== 'failed'))
    if (active.length < 2 || (active.length < 4 && this.random() < 0.05)) return this.#startRun()
    const finished = this.#runs.find((run) => !active.includes(run))
    if (finished !== undefined) return this.#closeRun(finished)
    const run = this.#pick(active)
    return this.#advance(run, this.#pick(run.tasks.filter((task) => task.stage !== 'done' && task.stage !== 'failed')))
  }

  async #startRun (): Promise<string> {
    const run: DemoRun = { id: this.#id('run'), tasks: [] }
    const goal = this.#pick(GOALS)
    await createRun(this.db, { run_id: run.id, goal, summary: 'Planning', status: 'running' })
    const count = 3 + Math.floor(this.random() * 4)
    for (let i = 0; i < count; i++) {
      const task: DemoTask = { id: `task-${i + 1}`, title: TASKS[(i + this.#sequence) % TASKS.length]!, stage: 'added', attempt: 0 }
      await addTask(this.db, {
        run_id: run.id,
        task_id: task.id,
        title: task.title,
        summary: `Part ${i + 1} of "${goal}"`,
        status: 'added',
        priority: this.#pick(['high', 'normal', 'low']),
        default_to: this.random() < 0.5 ? this.#pick(WORKERS) : null,
        acceptance_json: JSON.stringify(this.random() < 0.5 ? { criteria: ['tests pass', 'reviewed'] } : ['documented', { coverage: 0.9 }])
      })
      run.tasks.push(task)
    }
    this.#runs.push(run)
    return `started ${run.id}: ${goal} (${count} tasks)`
  }

  async #closeRun (run: DemoRun): Promise<string> {
    this.#runs.splice(this.#runs.indexOf(run), 1)
    const done = run.tasks.filter((task) => task.stage === 'done').length
    await recordChange(this.db, {
      event_type: 'council_tallied',
      run_id: run.id,
      summary: `${done} of ${run.tasks.length} tasks accepted`,
      payload: { approve: done, reject: run.tasks.length - done }
    })
    await recordChange(this.db, {
      event_type: 'council_report_persisted', run_id: run.id, summary: 'Council report saved', payload: { path: `reports/${run.id}.md` }
    })
    await setRunStatus(this.db, run.id, done === run.tasks.length ? 'done' : 'failed', `Finished: ${done}/${run.tasks.length} tasks done`)
    return `closed ${run.id}`
  }

  async #advance (run: DemoRun, task: DemoTask): Promise<string> {
    const where = { run_id: run.id, task_id: task.id }
    const message = (kind: string, summary: string, body: string, payload: unknown = {}) => ({
      message_id: this.#id('msg'),
      thread_id: task.thread!,
      from_agent: kind === 'answer' ? 'orchestrator' : 'worker',
      to_agent: kind === 'answer' ? 'worker' : 'orchestrator',
      kind,
      summary,
      body,
      payload_json: JSON.stringify(payload)
    })
    switch (task.stage) {
      case 'added':
        await setTaskStatus(this.db, run.id, task.id, 'ready', 'Ready to dispatch')
        task.stage = 'ready'
        break
      case 'ready':
      case 'failed': {
        task.attempt++
        task.thread = this.#id('thread')
        const worker = this.#pick(WORKERS)
        await dispatchTask(this.db,
          {
            run_id: run.id,
            task_id: task.id,
            attempt_no: task.attempt,
            assigned_to: worker,
            thread_id: task.thread,
            status: 'running',
            base_ref: 'main',
            branch_name: `task/${task.id}-${task.attempt}`,
            workspace_status: 'clean'
          },
          { subject: task.title, created_by: 'orchestrator', assigned_to: worker, status: 'open', priority: 'normal' })
        task.stage = 'dispatched'
        break
      }
      case 'dispatched':
        await setTaskStatus(this.db, run.id, task.id, 'running', 'Work started')
        task.stage = 'running'
        break
      case 'blocked': {
        await answerQuestion(this.db, where, message('answer', 'Answered: go ahead with the first option', 'Use the first option; note it in the ' +
          'runbook.', { decision: 'first' }))
        task.stage = 'running'
        break
      }
      case 'running': {
        const roll = this.random()
        if (roll < 0.25) {
          const [summary, body] = this.#pick(QUESTIONS)
          await blockOnQuestion(this.db, where, message('question', summary!, body!, { options: ['first', 'second'] }))
          task.stage = 'blocked'
        } else if (roll < 0.4) {
          await postMessage(this.db, where, message('update', 'Progress: halfway there', 'The first half of the work is done.', { progress: 0.5 }))
        } else if (roll < 0.5) {
          await setTaskStatus(this.db, run.id, task.id, 'failed', 'Tests failed; will retry')
          task.stage = 'failed'
        } else {
          const result = message('result', 'Done: all checks green', 'Pushed the branch; every check passed.', { checks: 12, failed: 0 })
          await postMessage(this.db, where, result, [
            {
              artifact_id: this.#id('artifact'),
              message_id: result.message_id,
              path: `reports/${task.id}.md`,
              kind: 'report',
              metadata_json: JSON.stringify({ lines: 120 })
            }
          ])
          await setTaskStatus(this.db, run.id, task.id, 'done', 'Accepted')
          task.stage = 'done'
        }
        break
      }
    }
    return `${run.id}/${task.id}: ${task.stage}`
  }
}

/* c8 ignore start: the command-line entry, run by `npm run demo` */
if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const main = async () => {
    const config = loadConfig()
    const { DEMO_INTERVAL_MS: interval } = loadDemoConfig()
    const app = await buildApp(config)
    await migrateToLatest(app.databaseUrl)
    // Taken since `npm run demo` checked it (scripts/check-settings.ts), or never checked (`node dist/demo.js`).
    await app.listen({ host: config.HOST, port: config.PORT }).catch((err: unknown) => { throw listenFailure(err, config) })
    const pool = new pg.Pool({ connectionString: app.databaseUrl, max: 2, application_name: 'ocp-demo-orchestrator' })
    pool.on('error', () => {})
    const writer = createDb(pool)
    // Known data first (idempotent: loading it again changes nothing), then live activity.
    const here = dirname(fileURLToPath(import.meta.url))
    const { inserted } = await loadFixtureFile(writer, join(basename(here) === 'dist' ? dirname(here) : here, 'fixtures/demo.json'))
    app.log.info({ inserted }, 'demo: fixtures/demo.json loaded')
    const orchestrator = new DemoOrchestrator(writer)
    app.log.info(`demo: a simulated orchestrator writes every ${interval} ms; open http://localhost:${config.PORT}/`)
    let stopping = false
    const stop = async () => {
      if (stopping) return
      stopping = true
      await pool.end()
      await app.close() // after the writer's pool: it may close the embedded database
    }
    process.once('SIGINT', () => { void stop() })
    process.once('SIGTERM', () => { void stop() })
    while (!stopping) { // eslint-disable-line no-unmodified-loop-condition -- set by stop(), on a signal
      try {
        app.log.info(`demo: ${await orchestrator.step()}`)
      } catch (err) {
        app.log.warn({ err }, 'demo: step failed, carrying on')
      }
      await new Promise((resolve) => setTimeout(resolve, interval))
    }
  }
  main().catch((err: unknown) => {
    console.error(err instanceof ConfigError ? err.message : `demo failed: ${(err as Error).message}`)
    process.exit(1)
  })
}
/* c8 ignore stop */
