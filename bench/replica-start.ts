/*
 * A replica starting while an event writer is open, over a small history
 * and a large one with holes, side by side in one run (BENCHMARKS.md,
 * "A replica's start"): how long until it answers /ready, its first
 * X-Event-Cursor against the running replica's, and how long its first
 * read takes (the settling of the order included). The start must not
 * grow with the history.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm run bench:replica-start
 *   ... npm run bench:replica-start -- --events 10000000 --rounds 3
 *   ... npm run bench:replica-start -- --quick     (CI's smoke run)
 *
 * Each history is written straight into a database of its own (triggers
 * off, as a bulk load is): ids with a rolled-back hole every 1,000, and a
 * jump of the sequence the size of a range the retention closes (1,000,000
 * ids) in the middle. A running replica settles it; then a writer inserts
 * an event and keeps its transaction open, and a new replica is started
 * and timed, `--rounds` times.
 */
import { parseArgs } from 'node:util'
import { performance } from 'node:perf_hooks'
import pg from 'pg'
import { buildApp } from '../app.ts'
import { loadConfig } from '../config.ts'
import { BENCH_SERVICE_ENV, formatInt, gitDescription, median, migratedDatabase, sleep } from './common.ts'

const { values: args } = parseArgs({
  options: {
    events: { type: 'string', default: '10000000' },
    small: { type: 'string', default: '10000' },
    rounds: { type: 'string', default: '3' },
    quick: { type: 'boolean', default: false }
  }
})
const large = args.quick ? 20_000 : Number(args.events)
const small = Number(args.small)
const rounds = args.quick ? 1 : Number(args.rounds)
const RANGE_JUMP = 1_000_000

async function query (url: string, text: string, values: unknown[] = []) {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    return (await client.query(text, values)).rows
  } finally {
    await client.end()
  }
}

/** A database holding `events` events with holes, migrated; returns its URL and the top id. */
async function history (name: string, events: number): Promise<{ url: string, top: number }> {
  const url = await migratedDatabase(name)
  const started = performance.now()
  const half = Math.floor(events / 2)
  // Every 1,000th id a hole; past the first half, the ids jump as a closed range makes them.
  await query(url, `set session_replication_role = replica;
    insert into events (event_id, event_type, run_id, summary, payload, created_at)
    select case when i <= ${half} then i else i + ${RANGE_JUMP} end, 'task_running', 'run-' || (i % 100), 'history', '{}', now()
    from generate_series(1, ${Math.ceil(events * 1000 / 999)}) i where i % 1000 <> 0;
    select setval('events_event_id_seq', (select max(event_id) from events))`)
  // As autovacuum would leave it, before anything is timed (a vacuum running meanwhile would be timed too).
  await query(url, 'vacuum (analyze) events')
  const top = Number((await query(url, 'select max(event_id)::text as top from events'))[0]!.top)
  console.log(`  ${name}: ${formatInt(events)} events up to id ${formatInt(top)}, written in ${((performance.now() - started) / 1000).toFixed(1)} s`)
  return { url, top }
}

async function serve (url: string) {
  const config = loadConfig({ DATABASE_URL: url, LOG_LEVEL: 'silent', ...BENCH_SERVICE_ENV, MIGRATE_ON_START: 'false' })
  const app = await buildApp(config)
  await app.listen({ port: 0, host: '127.0.0.1' })
  return { app, base: `http://127.0.0.1:${(app.server.address() as { port: number }).port}` }
}

const cursorOf = async (base: string) => Number((await fetch(`${base}/api/runs`)).headers.get('x-event-cursor'))

interface Start { readyMs: number, firstReadMs: number, firstCursor: number, runningCursor: number, held: number }

async function measure (name: string, events: number): Promise<Start[]> {
  const { url, top } = await history(name, events)
  const running = await serve(url)
  for (;;) {
    if (await cursorOf(running.base) >= top) break
    await sleep(50)
  }
  const results: Start[] = []
  for (let round = 0; round < rounds; round++) {
    const writer = new pg.Client({ connectionString: url })
    await writer.connect()
    await writer.query('begin')
    const held = Number((await writer.query("insert into events (event_type) values ('held_open') returning event_id")).rows[0].event_id)
    await sleep(1500) // open across ticks of the keeper
    const runningCursor = await cursorOf(running.base)
    const started = performance.now()
    const starting = await serve(url)
    while ((await fetch(`${starting.base}/ready`)).status !== 200) await sleep(5)
    const readyMs = performance.now() - started
    // The first read that carries a position: the replica settles the log's order for the first time.
    const reading = performance.now()
    const firstCursor = await cursorOf(starting.base)
    const firstReadMs = performance.now() - reading
    await starting.app.close()
    await writer.query('commit')
    await writer.end()
    results.push({ readyMs, firstReadMs, firstCursor, runningCursor, held })
    console.log(`  ${name} round ${round + 1}: ready in ${readyMs.toFixed(0)} ms, first read in ${firstReadMs.toFixed(1)} ms; its X-Event-Cursor ${formatInt(firstCursor)}, the running replica's ${formatInt(runningCursor)} (writer open at ${formatInt(held)})`)
  }
  await running.app.close()
  return results
}

console.log(`bench:replica-start on ${gitDescription()}, Node ${process.version}: a replica started while a writer is open, ${formatInt(small)} and ${formatInt(large)} events, ${rounds} round(s) each`)
const smallRuns = await measure('ocp_bench_start_small', small)
const largeRuns = await measure('ocp_bench_start_large', large)
const row = (label: string, runs: Start[]) => `| ${label} | ${median(runs.map((r) => r.readyMs)).toFixed(0)} ms | ${median(runs.map((r) => r.firstReadMs)).toFixed(1)} ms | ${runs.every((r) => r.firstCursor === r.runningCursor && r.firstCursor === r.held - 1) ? 'yes' : 'NO'} |`
console.log('\n| history | time to /ready (median) | its first read (median) | first X-Event-Cursor = the running replica\'s = the open writer\'s id - 1 |')
console.log('|---|---:|---:|---|')
console.log(row(`${formatInt(small)} events`, smallRuns))
console.log(row(`${formatInt(large)} events, holes and a range jump`, largeRuns))
console.log(`figure ${JSON.stringify({ small: { events: small, runs: smallRuns }, large: { events: large, runs: largeRuns } })}`)
if (![...smallRuns, ...largeRuns].every((r) => r.firstCursor === r.runningCursor)) process.exitCode = 1
