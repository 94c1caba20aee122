/*
 * What a hole costs delivery (BENCHMARKS.md, "Holes"): an event committed
 * just above an id a rolled-back writer left waits for the keeper to settle
 * the hole; one committed with nothing missing below it does not. Both are
 * timed from commit to arrival on an open stream, side by side in one run,
 * with no other writer and then under a background of 8 writers committing
 * in a loop (so that the keeper's census always finds writers in flight).
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm run bench:holes
 *   ... npm run bench:holes -- --rounds 50
 *   ... npm run bench:holes -- --quick     (CI's smoke run)
 */
import { parseArgs } from 'node:util'
import { performance } from 'node:perf_hooks'
import pg from 'pg'
import { buildApp } from '../app.js'
import { loadConfig } from '../config.js'
import { EventSource } from 'eventsource'
import { gitDescription, migratedDatabase, sleep } from './common.js'

const { values: args } = parseArgs({ options: { rounds: { type: 'string', default: '30' }, quick: { type: 'boolean', default: false } } })
const rounds = args.quick ? 3 : Number(args.rounds)
const DATABASE = 'ocp_bench_holes'
const BACKGROUND_WRITERS = 8

const url = await migratedDatabase(DATABASE)
const app = await buildApp(loadConfig({ DATABASE_URL: url, LOG_LEVEL: 'silent', MAX_EVENT_LOOP_DELAY_MS: '0', MIGRATE_ON_START: 'false' }))
await app.listen({ port: 0, host: '127.0.0.1' })
const base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`
// A real EventSource on the measured run; each event it gets resolves the wait for it.
const stream = new EventSource(`${base}/api/events/stream?run_id=bench-holes`)
await new Promise((resolve) => { stream.onopen = resolve })
let arrived: (() => void) | undefined
stream.onmessage = () => { arrived?.() }

const writer = new pg.Client({ connectionString: url })
await writer.connect()

/** Commits an event of the measured run (after a rolled-back one, with `hole`) and times its arrival. */
async function once (hole: boolean): Promise<number> {
  if (hole) {
    await writer.query('begin')
    await writer.query(`insert into events (event_type, run_id) values ('rolled_back', 'bench-holes')`)
    await writer.query('rollback')
  }
  const delivered = new Promise<void>((resolve) => { arrived = resolve })
  const started = performance.now()
  await writer.query(`insert into events (event_type, run_id) values ('task_running', 'bench-holes')`)
  await delivered
  return performance.now() - started
}

let loading = false
const background = async () => {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  while (loading) {
    await client.query('begin')
    await client.query(`insert into events (event_type, run_id) values ('background', 'bench-other')`)
    await client.query('select pg_sleep(0.002)')
    await client.query('commit')
  }
  await client.end()
}

const quantile = (values: number[], q: number) => [...values].sort((a, b) => a - b)[Math.min(values.length - 1, Math.floor(q * values.length))]!
const results: Record<string, number[]> = {}
for (const load of ['quiet', `${BACKGROUND_WRITERS} writers`]) {
  loading = load !== 'quiet'
  const writers = loading ? Array.from({ length: BACKGROUND_WRITERS }, background) : []
  await sleep(200)
  for (const hole of [false, true]) results[`${load}, ${hole ? 'above a hole' : 'no hole'}`] = []
  for (let round = 0; round < rounds; round++) {
    for (const hole of [false, true]) {
      results[`${load}, ${hole ? 'above a hole' : 'no hole'}`]!.push(await once(hole))
      await sleep(50)
    }
  }
  loading = false
  await Promise.all(writers)
}
const ticks = app.events.upkeep!.ticks
console.log(`\nbench:holes on ${gitDescription()}, Node ${process.version}, ${rounds} rounds; the keeper ticked ${ticks} times\n`)
console.log('| background | event | commit to delivery p50 | p90 | max |')
console.log('|---|---|---:|---:|---:|')
for (const [name, values] of Object.entries(results)) {
  const [load, kind] = name.split(', ')
  console.log(`| ${load} | ${kind} | ${quantile(values, 0.5).toFixed(1)} ms | ${quantile(values, 0.9).toFixed(1)} ms | ${Math.max(...values).toFixed(1)} ms |`)
}
console.log(`figure ${JSON.stringify(results)}`)
stream.close()
await writer.end()
await app.close()
