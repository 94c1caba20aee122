/*
 * Up to date under load (BENCHMARKS.md, "Up to date means up to date"): 16
 * writers commit a run's events out of order (each holds its transaction
 * open a random few milliseconds, then pauses up to 200 ms; one transaction
 * in 50 appends a burst of 100 to 300 events; one in 20 rolls back), while
 * 100 readers loop Durable Streams catch-up reads of that run, each from
 * the tail (offset=now) on, from the offset its last answer gave.
 * Afterwards, against the table: every answer marked up to date must hold
 * every event committed before its request began (with the reader's earlier
 * answers), and each reader must have received every committed event up to
 * its last offset, once, in order. Prints the share of answers marked up to
 * date, and the reads' latency.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm run bench:up-to-date
 *   ... npm run bench:up-to-date -- --seconds 20 --writers 16 --readers 100
 *   ... npm run bench:up-to-date -- --quick                  (CI's smoke run)
 *   ... npm run bench:up-to-date -- --url http://127.0.0.1:8080 --database postgres://.../db
 *       (a service already running, another build say, over the database given)
 */
import { parseArgs } from 'node:util'
import { performance } from 'node:perf_hooks'
import pg from 'pg'
import { buildApp } from '../app.ts'
import { loadConfig } from '../config.ts'
import { BENCH_SERVICE_ENV, gitDescription, migratedDatabase, sleep } from './common.ts'

const { values: args } = parseArgs({
  options: {
    seconds: { type: 'string', default: '10' },
    writers: { type: 'string', default: '16' },
    readers: { type: 'string', default: '100' },
    quick: { type: 'boolean', default: false },
    url: { type: 'string' },
    database: { type: 'string' }
  }
})
const seconds = args.quick ? 2 : Number(args.seconds)
const writerCount = args.quick ? 4 : Number(args.writers)
const readerCount = args.quick ? 10 : Number(args.readers)
const DATABASE = 'ocp_bench_up_to_date'
const RUN = `bench-up-to-date-${Date.now()}`

let url: string
let base: string
let close = async () => {}
if (args.url !== undefined) {
  if (args.database === undefined) throw new Error('--url needs --database: the database that service reads')
  url = args.database
  base = args.url
} else {
  url = await migratedDatabase(DATABASE)
  const app = await buildApp(loadConfig({ DATABASE_URL: url, LOG_LEVEL: 'silent', ...BENCH_SERVICE_ENV, MIGRATE_ON_START: 'false' }))
  await app.listen({ port: 0, host: '127.0.0.1' })
  base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`
  close = () => app.close()
}

const setup = new pg.Client({ connectionString: url })
await setup.connect()
await setup.query("insert into runs (run_id, goal, summary, status) values ($1, 'bench', '', 'running')", [RUN])

interface Commit { ids: number[], at: number }
const commits: Commit[] = []
let rolledBack = 0
let running = true

async function writer (): Promise<void> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  while (running) { // eslint-disable-line no-unmodified-loop-condition -- cleared once the run's time is up
    const burst = Math.random() < 0.02
    const count = burst ? 100 + Math.floor(Math.random() * 200) : 1 + Math.floor(Math.random() * 5)
    await client.query('begin')
    const { rows } = await client.query<{ event_id: string }>(`insert into events (event_type, run_id, summary)
      select 'bench', $1, 'up to date' from generate_series(1, $2) returning event_id`, [RUN, count])
    // Held open a while: the writers commit out of the order they drew their ids.
    await sleep(Math.random() * 10)
    if (Math.random() < 0.05) {
      await client.query('rollback')
      rolledBack++
    } else {
      await client.query('commit')
      commits.push({ ids: rows.map((row) => Number(row.event_id)), at: performance.now() })
    }
    await sleep(Math.random() * 200)
  }
  await client.end()
}

interface Answer { reader: number, began: number, tookMs: number, next: number, upToDate: boolean, ids: number[] }
const answers: Answer[] = []
const received: number[][] = Array.from({ length: readerCount }, () => [])
const starts: number[] = Array.from({ length: readerCount }, () => 0)
let errors = 0

async function reader (index: number): Promise<void> {
  // From the tail, as a live page starts: what it checks is what commits meanwhile.
  let offset = (await fetch(`${base}/api/streams/runs/${RUN}?offset=now`)).headers.get('stream-next-offset')!
  starts[index] = parseInt(offset, 36)
  while (running) { // eslint-disable-line no-unmodified-loop-condition -- cleared once the run's time is up
    const began = performance.now()
    try {
      const response = await fetch(`${base}/api/streams/runs/${RUN}?offset=${offset}`)
      const events = await response.json() as Array<{ event_id: number }>
      if (response.status !== 200) throw new Error(`status ${response.status}`)
      const next = response.headers.get('stream-next-offset')!
      const ids = events.map((event) => event.event_id)
      answers.push({ reader: index, began, tookMs: performance.now() - began, next: parseInt(next, 36), upToDate: response.headers.get('stream-up-to-date') === 'true', ids })
      received[index]!.push(...ids)
      offset = next
    } catch {
      errors++
      await sleep(50)
    }
  }
}

const writing = Array.from({ length: writerCount }, writer)
await sleep(500)
const reading = Array.from({ length: readerCount }, (_, index) => reader(index))
await sleep(seconds * 1000)
running = false
await Promise.all([...writing, ...reading])

// Against the table.
const { rows } = await setup.query<{ event_id: string }>('select event_id from events where run_id = $1 order by event_id', [RUN])
const table = rows.map((row) => Number(row.event_id))
await setup.end()
await close()

const committedIds = commits.flatMap((commit) => commit.ids).sort((a, b) => a - b)
const tableMatches = committedIds.length === table.length && committedIds.every((id, index) => id === table[index])
// Commits in the order they were acknowledged, for each answer's "committed before it began".
commits.sort((a, b) => a.at - b.at)
let missing = 0
let upToDate = 0
for (const answer of answers) {
  if (!answer.upToDate) continue
  upToDate++
  const before = commits.filter((commit) => commit.at < answer.began).flatMap((commit) => commit.ids)
  if (before.some((id) => id > answer.next)) missing++
}
let readersWrong = 0
for (let index = 0; index < readerCount; index++) {
  const last = answers.filter((answer) => answer.reader === index).at(-1)?.next ?? starts[index]!
  const expected = table.filter((id) => id > starts[index]! && id <= last)
  const got = received[index]!
  if (got.length !== expected.length || got.some((id, at) => id !== expected[at])) readersWrong++
}
const took = answers.map((answer) => answer.tookMs).sort((a, b) => a - b)
const quantile = (q: number) => took[Math.min(took.length - 1, Math.floor(q * took.length))] ?? 0

console.log(`\nbench:up-to-date on ${args.url === undefined ? gitDescription() : args.url}, Node ${process.version}: ${writerCount} writers, ${readerCount} readers, ${seconds} s\n`)
console.log('| figure | value |')
console.log('|---|---:|')
console.log(`| events committed (transactions; rolled back) | ${table.length} (${commits.length}; ${rolledBack}) |`)
console.log(`| catch-up answers (per second; errors) | ${answers.length} (${Math.round(answers.length / seconds)}; ${errors}) |`)
console.log(`| answers marked up to date | ${upToDate} (${(100 * upToDate / Math.max(1, answers.length)).toFixed(1)} %) |`)
console.log(`| of those, missing an event committed before the request began | ${missing} |`)
console.log(`| readers whose events differ from the table's, from their start to their last offset | ${readersWrong} of ${readerCount} |`)
console.log(`| the table holds exactly the events whose commit was acknowledged | ${tableMatches ? 'yes' : 'NO'} |`)
console.log(`| read latency p50 / p99 / max | ${quantile(0.5).toFixed(1)} / ${quantile(0.99).toFixed(1)} / ${(took.at(-1) ?? 0).toFixed(1)} ms |`)
console.log(`figure ${JSON.stringify({ events: table.length, answers: answers.length, upToDate, missing, readersWrong, tableMatches, errors, p50: quantile(0.5), p99: quantile(0.99) })}`)
if (missing > 0 || readersWrong > 0 || !tableMatches) process.exitCode = 1
