/*
 * What a hole costs delivery (BENCHMARKS.md, "Holes"): an event committed
 * just above an id a rolled-back writer left waits for the keeper to settle
 * the hole; one committed with nothing missing below it does not. Both are
 * timed from commit to arrival on an open stream, side by side in one run,
 * with no other writer and then under a background of 8 writers committing
 * in a loop (so that the keeper's census always finds writers in flight).
 *
 * --overlap adds (--overlap-only runs alone) the same measurement under
 * writers that stay open: --writers W (3) background writers, each in a
 * loop BEGIN, insert an event of another run (it draws an id), hold the
 * transaction open --hold-ms T (1500), COMMIT, again at once, started T/W
 * apart, so that writers are always open and one began recently. A hole
 * then waits for the writers open when it was drawn and for those that
 * began while an older one still held the settle mark below it (their late
 * bound, db/sql/keeper.sql). The service as in production but for
 * EVENTS_KEEPER_INTERVAL_MS=100, on the primary of DATABASE_URL, then on a
 * private primary and through its hot standby (test/helpers/standby.ts; the
 * keeper and the writers on the primary, the reads and the stream on the
 * standby; --no-standby leaves the private pair out).
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm run bench:holes
 *   ... npm run bench:holes -- --rounds 50
 *   ... npm run bench:holes -- --quick     (CI's smoke run)
 *   ... npm run bench:holes -- --overlap [--rounds 20] [--writers 3] [--hold-ms 1500] [--no-standby]
 *   ... npm run bench:holes -- --overlap-only --hold-ms 500
 */
import { parseArgs } from 'node:util'
import { performance } from 'node:perf_hooks'
import pg from 'pg'
import { buildApp } from '../app.ts'
import { loadConfig } from '../config.ts'
import { EventSource } from 'eventsource'
import { BENCH_SERVICE_ENV, gitDescription, migratedDatabase, sleep, withDatabase } from './common.ts'
import { migrateToLatest } from '../db/migrate.ts'
import type { Test } from 'tap'
import { standbySkipReason, startReplicatedPostgres } from '../test/helpers/standby.ts'

const { values: args } = parseArgs({
  allowNegative: true,
  options: {
    rounds: { type: 'string' },
    quick: { type: 'boolean', default: false },
    overlap: { type: 'boolean', default: false },
    'overlap-only': { type: 'boolean', default: false },
    writers: { type: 'string', default: '3' },
    'hold-ms': { type: 'string', default: '1500' },
    standby: { type: 'boolean', default: true }
  }
})
const rounds = args.quick ? 3 : Number(args.rounds ?? 30)
const DATABASE = 'ocp_bench_holes'
const BACKGROUND_WRITERS = 8

const quantile = (values: number[], q: number) => [...values].sort((a, b) => a - b)[Math.min(values.length - 1, Math.floor(q * values.length))]!

/** A delivery slower than this fails the run: something is wrong, not slow. */
const DELIVERY_TIMEOUT_MS = 60_000

/**
 * A real EventSource on the measured run of the service at `base`, and a
 * writer on `url`: once() commits an event of that run (after a rolled-back
 * one, with `hole`) and times it from commit to arrival.
 */
async function measuredStream (base: string, url: string, where: string) {
  const stream = new EventSource(`${base}/api/events/stream?run_id=bench-holes`)
  await new Promise((resolve) => { stream.onopen = resolve })
  let arrived: (() => void) | undefined
  stream.onmessage = () => { arrived?.() }
  const writer = new pg.Client({ connectionString: url })
  await writer.connect()
  return {
    async once (hole: boolean): Promise<number> {
      if (hole) {
        await writer.query('begin')
        await writer.query("insert into events (event_type, run_id) values ('rolled_back', 'bench-holes')")
        await writer.query('rollback')
      }
      let timer: NodeJS.Timeout | undefined
      const delivered = new Promise<void>((resolve, reject) => {
        arrived = resolve
        timer = setTimeout(() => { reject(new Error(`${where}: an event ${hole ? 'above a hole' : 'with no hole'} was not delivered within ${DELIVERY_TIMEOUT_MS} ms`)) }, DELIVERY_TIMEOUT_MS)
      })
      const started = performance.now()
      await writer.query("insert into events (event_type, run_id) values ('task_running', 'bench-holes')")
      try {
        await delivered
      } finally {
        clearTimeout(timer)
      }
      return performance.now() - started
    },
    async close (): Promise<void> {
      stream.close()
      await writer.end()
    }
  }
}

/** The existing modes: quiet, then 8 writers committing in a loop; the service's defaults. */
async function shortWriters (): Promise<void> {
  const url = await migratedDatabase(DATABASE)
  const app = await buildApp(loadConfig({ DATABASE_URL: url, LOG_LEVEL: 'silent', ...BENCH_SERVICE_ENV, MIGRATE_ON_START: 'false' }))
  await app.listen({ port: 0, host: '127.0.0.1' })
  const base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`
  const measured = await measuredStream(base, url, 'bench:holes')

  let loading = false
  const background = async () => {
    const client = new pg.Client({ connectionString: url })
    await client.connect()
    while (loading) { // eslint-disable-line no-unmodified-loop-condition -- cleared once the load is measured
      await client.query('begin')
      await client.query("insert into events (event_type, run_id) values ('background', 'bench-other')")
      await client.query('select pg_sleep(0.002)')
      await client.query('commit')
    }
    await client.end()
  }

  const results: Record<string, number[]> = {}
  for (const load of ['quiet', `${BACKGROUND_WRITERS} writers`]) {
    loading = load !== 'quiet'
    const writers = loading ? Array.from({ length: BACKGROUND_WRITERS }, background) : []
    await sleep(200)
    for (const hole of [false, true]) results[`${load}, ${hole ? 'above a hole' : 'no hole'}`] = []
    for (let round = 0; round < rounds; round++) {
      for (const hole of [false, true]) {
        results[`${load}, ${hole ? 'above a hole' : 'no hole'}`]!.push(await measured.once(hole))
        await sleep(50)
      }
    }
    loading = false
    await Promise.all(writers)
  }
  const ticks = app.events.keeper!.ticks
  console.log(`\nbench:holes on ${gitDescription()}, Node ${process.version}, ${rounds} rounds; the keeper ticked ${ticks} times\n`)
  console.log('| background | event | commit to delivery p50 | p90 | max |')
  console.log('|---|---|---:|---:|---:|')
  for (const [name, values] of Object.entries(results)) {
    const [load, kind] = name.split(', ')
    console.log(`| ${load} | ${kind} | ${quantile(values, 0.5).toFixed(1)} ms | ${quantile(values, 0.9).toFixed(1)} ms | ${Math.max(...values).toFixed(1)} ms |`)
  }
  console.log(`figure ${JSON.stringify(results)}`)
  await measured.close()
  await app.close()
}

// --overlap: writers that stay open.

const OVERLAP_DATABASE = 'ocp_bench_holes_overlap'
const KEEPER_INTERVAL_MS = 100
const overlapRounds = args.quick ? 3 : Number(args.rounds ?? 20)
const openWriters = Number(args.writers)
const holdMs = Number(args['hold-ms'])
interface OverlapCase {
  /** Where the service's keeper and the writers are, and where it reads. */
  where: string
  wakeup: 'live' | 'polling'
  ticks: number
  seconds: number
  /** Commit to delivery (ms) by background and event. */
  results: Record<string, number[]>
}

/**
 * The service (the keeper on `url`, reads on `readUrl` when given) and a
 * stream of the measured run; quiet rounds, then rounds under the open
 * writers, an event with no hole and one above a hole in each.
 */
async function overlapCase (where: string, url: string, readUrl: string | undefined, replayed: () => Promise<void>): Promise<OverlapCase> {
  const config = loadConfig({
    DATABASE_URL: url,
    ...(readUrl === undefined ? {} : { DATABASE_READ_URL: readUrl }),
    EVENTS_KEEPER_INTERVAL_MS: String(KEEPER_INTERVAL_MS),
    LOG_LEVEL: 'silent',
    ...BENCH_SERVICE_ENV,
    MIGRATE_ON_START: 'false'
  })
  const app = await buildApp(config)
  await app.listen({ port: 0, host: '127.0.0.1' })
  const startedAt = performance.now()
  const base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`
  const measured = await measuredStream(base, url, where)

  const results: Record<string, number[]> = {}
  const measure = async (load: string, jitterMs: number) => {
    for (const hole of [false, true]) results[`${load}, ${hole ? 'above a hole' : 'no hole'}`] = []
    for (let round = 0; round < overlapRounds; round++) {
      for (const hole of [false, true]) {
        // A random phase against the writers' cycle (it repeats every T/W).
        await sleep(50 + Math.random() * jitterMs)
        results[`${load}, ${hole ? 'above a hole' : 'no hole'}`]!.push(await measured.once(hole))
      }
    }
  }

  await sleep(200)
  await measure('none', 0)

  // W writers, T ms open each, T/W apart: always open, one begun within the last T/W.
  let loading = true
  const loops = Array.from({ length: openWriters }, async (_, i) => {
    const client = new pg.Client({ connectionString: url })
    await client.connect()
    await sleep(i * holdMs / openWriters)
    while (loading) { // eslint-disable-line no-unmodified-loop-condition -- cleared once the load is measured
      await client.query('begin')
      await client.query("insert into events (event_type, run_id) values ('background', 'bench-other')")
      await sleep(holdMs)
      await client.query('commit')
    }
    await client.end()
  })
  await sleep(holdMs + holdMs / openWriters)
  await measure(`${openWriters} writers open ${holdMs} ms`, holdMs / openWriters)
  loading = false
  await Promise.all(loops)

  const wakeup = app.events.hub.wakeupLive ? 'live' : 'polling'
  const ticks = app.events.keeper!.ticks
  const seconds = (performance.now() - startedAt) / 1000
  await measured.close()
  await app.close()
  await replayed()
  return { where, wakeup, ticks, seconds, results }
}

async function overlap (): Promise<void> {
  const cases: OverlapCase[] = []
  const url = await migratedDatabase(OVERLAP_DATABASE)
  cases.push(await overlapCase('primary (DATABASE_URL\'s server)', url, undefined, async () => {}))
  let standbyNote = ''
  const skip = args.standby ? standbySkipReason() : '--no-standby'
  if (skip === false) {
    // The tests' pair, which asks only for somewhere to register its own stop (called below).
    const pair = await startReplicatedPostgres({ teardown: () => {} } as unknown as Test)
    try {
      await pair.createDatabase(OVERLAP_DATABASE)
      const primary = withDatabase(pair.primaryUrl, OVERLAP_DATABASE)
      await migrateToLatest(primary)
      await pair.waitForReplay()
      cases.push(await overlapCase('private primary', primary, undefined, pair.waitForReplay))
      cases.push(await overlapCase('private primary, reads on its hot standby', primary, withDatabase(pair.standbyUrl, OVERLAP_DATABASE), pair.waitForReplay))
    } finally {
      await pair.stop()
    }
  } else {
    standbyNote = ` (no private primary and standby: ${skip})`
  }

  console.log(`\nbench:holes --overlap on ${gitDescription()}, Node ${process.version}, ${overlapRounds} rounds${standbyNote}. ` +
    `The service: EVENTS_KEEPER_INTERVAL_MS ${KEEPER_INTERVAL_MS}, every other setting its default (EVENTS_POLL_INTERVAL_MS 250, EVENTS_WAKEUP auto, EVENTS_WAKEUP_POLL_INTERVAL_MS 1000; MAX_EVENT_LOOP_DELAY_MS 0, as in every bench). ` +
    `Background: W = ${openWriters} writers, each BEGIN, an insert (it draws an id), open T = ${holdMs} ms, COMMIT, again at once; started T/W = ${(holdMs / openWriters).toFixed(0)} ms apart. ` +
    'Each measured event after a random wait of 50 ms to 50 ms + T/W (none when quiet).\n')
  for (const c of cases) console.log(`- ${c.where}: wake-up ${c.wakeup}; the keeper ticked ${c.ticks} times in ${c.seconds.toFixed(1)} s`)
  console.log('\n| database | background | event | commit to delivery p50 | p90 | max |')
  console.log('|---|---|---|---:|---:|---:|')
  for (const c of cases) {
    for (const [name, values] of Object.entries(c.results)) {
      const [load, kind] = name.split(', ')
      console.log(`| ${c.where} | ${load} | ${kind} | ${quantile(values, 0.5).toFixed(1)} ms | ${quantile(values, 0.9).toFixed(1)} ms | ${Math.max(...values).toFixed(1)} ms |`)
    }
  }
  console.log(`figure ${JSON.stringify({ overlap: { rounds: overlapRounds, writers: openWriters, hold_ms: holdMs, keeper_interval_ms: KEEPER_INTERVAL_MS, cases } })}`)
}

if (!args['overlap-only']) await shortWriters()
if (args.overlap || args['overlap-only']) await overlap()
