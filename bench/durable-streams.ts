/*
 * Durable Streams long-pollers (BENCHMARKS.md, "Durable Streams long-poll").
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm run bench:streams
 *   ... npm run bench:streams -- --sizes 10,1000 --runs 50 --rate 10 --seconds 10
 *
 * Starts the service as a child process on a database of its own
 * (ocp_bench_ds, recreated), then for each size: that many long-pollers
 * (live=long-poll, each echoing its offset and cursor, as the official
 * client does) spread over --runs runs, straight to the one replica; a
 * writer commits events at --rate per second round-robin over the runs.
 * Measures the statements per second the service ran (pg_stat_database
 * transactions, the writer's own taken out), the resident memory per
 * waiter, and commit-to-delivery latency at every poller.
 *
 *   ... npm run bench:streams -- --sizes 5000 --rounds 3     (issue 33: three runs, each on a fresh service)
 *   ... npm run bench:streams -- --sizes 5000 --service-flags=--max-semi-space-size=16 --forced-gc
 *
 * The service runs on the bench's node (put the Node to measure first on
 * PATH), with bench/service-probe.ts preloaded (bench/probe.ts): resident
 * memory is read as a container sees it (VmRSS, the median of three
 * readings a second apart, no forced collection; --forced-gc adds, labelled,
 * the figure after full collections), taken apart (heap, external, native),
 * and the GC pauses, the event loop's longest delay and the service's CPU
 * during the writing window are printed.
 */
import { spawn, type ChildProcess } from 'node:child_process'
import { Agent, request } from 'node:http'
import { parseArgs } from 'node:util'
import pg from 'pg'
import { migrateToLatest } from '../db/migrate.ts'
import { adminUrl as serverUrl, BENCH_SERVICE_ENV, freePort, root, sleep, untilAnswering, withDatabase } from './common.ts'
import { ask, breakdown, medianRssKb, pausesLine, rssKb, serviceArgs, startFlags } from './probe.ts'

const { values: args } = parseArgs({
  options: {
    sizes: { type: 'string', default: '10,1000' },
    runs: { type: 'string', default: '50' },
    rate: { type: 'string', default: '10' },
    seconds: { type: 'string', default: '10' },
    'settle-ms': { type: 'string', default: '11000' },
    rounds: { type: 'string', default: '1' },
    entry: { type: 'string', default: 'tsx' },
    'service-flags': { type: 'string' },
    'forced-gc': { type: 'boolean', default: false }
  }
})
const sizes = args.sizes.split(',').map(Number)
/** The service's node flags: --service-flags, else npm start's. */
const serviceFlags = args['service-flags'] ?? startFlags()
const runs = Number(args.runs)
const rate = Number(args.rate)
const seconds = Number(args.seconds)
/** Postgres publishes a backend's statistics up to 10 s after it goes idle: wait that long between phases. */
const STATS_SETTLE_MS = Number(args['settle-ms'])
const DATABASE = 'ocp_bench_ds'

const adminUrl = serverUrl()
const databaseUrl = withDatabase(adminUrl, DATABASE)
const percentile = (sorted: number[], p: number) => sorted.length === 0 ? Number.NaN : sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * p))]!
const runId = (i: number) => `bench-ds-${i % runs}`

async function startService (port: number): Promise<ChildProcess> {
  const child = spawn(process.execPath, serviceArgs(args.entry, serviceFlags), {
    cwd: root,
    env: { ...process.env, DATABASE_URL: databaseUrl, PORT: String(port), HOST: '127.0.0.1', LOG_LEVEL: 'warn', MIGRATE_ON_START: 'false', ...BENCH_SERVICE_ENV, SSE_MAX_STREAMS: '1000000', DURABLE_STREAMS_MAX_LONG_POLLS: '1000000', DURABLE_STREAMS_MAX_LONG_POLLS_PER_CALLER: '1000000' },
    stdio: ['ignore', 'inherit', 'inherit', 'ipc']
  })
  await untilAnswering(child, `http://127.0.0.1:${port}/ready`, 'the service')
  return child
}

/** When each event's insert was sent (a conservative start for commit-to-delivery), by id. */
const sentAt = new Map<number, number>()

/** One long-poller of `run`: polls until stopped, recording each event's delivery latency. */
function poller (port: number, agent: Agent, run: string, offset: string, latencies: number[]) {
  let stopped = false
  let cursor: string | undefined
  let waiting = 0
  const poll = () => {
    if (stopped) return
    const query = new URLSearchParams({ ...(cursor === undefined ? {} : { cursor }), live: 'long-poll', offset })
    const req = request({ host: '127.0.0.1', port, path: `/api/streams/runs/${run}?${query.toString()}`, agent }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (chunk: string) => { body += chunk })
      res.on('end', () => {
        const now = Date.now()
        offset = String(res.headers['stream-next-offset'] ?? offset)
        cursor = res.headers['stream-cursor'] as string | undefined
        if (res.statusCode === 200) {
          for (const event of JSON.parse(body) as Array<{ event_id: number }>) {
            const sent = sentAt.get(event.event_id)
            if (sent !== undefined) latencies.push(now - sent)
          }
        }
        waiting--
        poll()
      })
    })
    waiting++
    req.on('error', () => { waiting--; if (!stopped) setTimeout(poll, 100) })
    req.end()
  }
  poll()
  return { stop: () => { stopped = true }, waiting: () => waiting }
}

async function transactions (admin: pg.Client): Promise<number> {
  return Number((await admin.query('select xact_commit + xact_rollback as n from pg_stat_database where datname = $1', [DATABASE])).rows[0].n)
}

const admin = new pg.Client({ connectionString: adminUrl })
await admin.connect()
await admin.query(`drop database if exists ${DATABASE} with (force)`)
await admin.query(`create database ${DATABASE}`)
await migrateToLatest(databaseUrl)
const writer = new pg.Client({ connectionString: databaseUrl })
await writer.connect()
for (let i = 0; i < runs; i++) {
  await writer.query("insert into runs (run_id, goal, summary, status, created_at, updated_at) values ($1, 'bench', '', 'running', now(), now())", [runId(i)])
}
const os = await import('node:os')
console.log(`machine: ${os.cpus().length} cores, load average ${os.loadavg().map((load) => load.toFixed(2)).join(' ')}, node ${process.version} (the service runs on the same node); ` +
  `service ${args.entry === 'dist' ? 'dist/server.js (as npm start)' : 'server.ts through tsx'}, its node flags: ${serviceFlags === '' ? 'none (Node\'s defaults)' : serviceFlags}${args['service-flags'] === undefined ? ' (npm start\'s)' : ''}${process.env.NODE_OPTIONS ? `, NODE_OPTIONS=${process.env.NODE_OPTIONS}` : ''}; ` +
  `memory: VmRSS, median of three readings 1 s apart, no forced collection${args['forced-gc'] ? ' (then, labelled, after forced full collections)' : ''}`)
const results: Array<{ size: number, perSecond: number }> = []
const rounds = Number(args.rounds)
let agent = new Agent({ keepAlive: true, maxSockets: Infinity })
for (let round = 1; round <= rounds; round++) {
  const port = await freePort()
  const service = await startService(port)
  agent = new Agent({ keepAlive: true, maxSockets: Infinity })
  await sleep(2000)
  const version = (await ask(service, 'report')).node
  const metrics = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text()
  const wakeup = /^event_wakeup_live 1$/m.test(metrics) ? 'live (WAL streaming)' : 'not live (polling alone: the server refuses replication connections)'
  console.log(`${rounds > 1 ? `round ${round} of ${rounds}: ` : ''}durable streams long-poll on node ${version}: ${runs} runs, ${rate} events/s for ${seconds} s, DURABLE_STREAMS_LONG_POLL_MS default (20 s), EVENTS_POLL_INTERVAL_MS default (250 ms); the wake-up: ${wakeup}`)
  console.log('waiters  statements/s  RSS/waiter  p50 ms  p99 ms  deliveries')
  for (const size of sizes) {
    const latencies: number[] = []
    const idle = await medianRssKb(service.pid!)
    const idleReport = await ask(service, 'report')
    let idleForced: number | undefined
    if (args['forced-gc']) {
      await ask(service, 'gc')
      idleForced = rssKb(service.pid!)
    }
    // From the tail: the events of an earlier size are not this one's.
    const tail = (await fetch(`http://127.0.0.1:${port}/api/streams/events?offset=now`)).headers.get('stream-next-offset')!
    const pollers = Array.from({ length: size }, (_, i) => poller(port, agent, runId(i), tail, latencies))
    while (pollers.reduce((sum, p) => sum + p.waiting(), 0) < size) await sleep(100)
    // Every long-poll waiting in the service (its own gauge), not just sent: then memory is read.
    for (const deadline = Date.now() + 30_000; Date.now() < deadline; await sleep(200)) {
      const gauge = /^event_long_polls_waiting (\d+)$/m.exec(await (await fetch(`http://127.0.0.1:${port}/metrics`)).text())
      if (Number(gauge?.[1]) >= size) break
    }
    await sleep(1000)
    const waiting = await medianRssKb(service.pid!)
    const waitingReport = await ask(service, 'report')
    let waitingForced: number | undefined
    if (args['forced-gc']) {
      await ask(service, 'gc')
      waitingForced = rssKb(service.pid!)
    }
    await sleep(STATS_SETTLE_MS)
    const before = await transactions(admin)
    await ask(service, 'reset') // GC pauses, loop delay and CPU: the writing window's only
    const started = Date.now()
    let written = 0
    while (Date.now() - started < seconds * 1000) {
      const sent = Date.now()
      const { rows } = await writer.query("insert into events (event_type, run_id, summary, payload) values ('task_running', $1, 'bench', '{}') returning event_id", [runId(written)])
      sentAt.set(Number(rows[0].event_id), sent)
      written++
      await sleep(Math.max(0, started + written * (1000 / rate) - Date.now()))
    }
    const elapsed = (Date.now() - started) / 1000
    await sleep(2000) // the last deliveries
    const during = await ask(service, 'report')
    await sleep(STATS_SETTLE_MS)
    const statements = await transactions(admin) - before - written
    const perSecond = statements / (elapsed + 2 + STATS_SETTLE_MS / 1000)
    for (const p of pollers) p.stop()
    const sorted = latencies.sort((a, b) => a - b)
    results.push({ size, perSecond })
    console.log(`${String(size).padStart(7)}  ${perSecond.toFixed(1).padStart(12)}  ${(((waiting.median - idle.median) * 1024) / size).toFixed(0).padStart(8)} B  ${String(percentile(sorted, 0.5)).padStart(6)}  ${String(percentile(sorted, 0.99)).padStart(6)}  ${sorted.length}`)
    console.log(`    memory (no forced GC): RSS ${idle.median} -> ${waiting.median} kB (readings ${idle.readings.join('/')} -> ${waiting.readings.join('/')}) = ${((waiting.median - idle.median) / size).toFixed(1)} kB per waiter; ` +
      `per waiter: ${breakdown(idleReport, idle.median, waitingReport, waiting.median, size)}`)
    if (args['forced-gc']) console.log(`    forced full GC (labelled; not what a container sees): ${idleForced} -> ${waitingForced} kB = ${((waitingForced! - idleForced!) / size).toFixed(1)} kB per waiter`)
    console.log(`    during the writing window and 2 s after: ${pausesLine(during)}`)
    // Let the stopped pollers' last requests end (at most a long-poll timeout) before the next size.
    await writer.query("insert into events (event_type, run_id) select 'wake', run_id from runs")
    await sleep(1500)
  }
  agent.destroy()
  service.kill('SIGTERM')
  await new Promise((resolve) => service.once('exit', resolve))
}
if (sizes.length >= 2) {
  const [first, last] = [results[0]!, results[sizes.length - 1]!]
  console.log(`statements per second at ${last.size} waiters / at ${first.size}: ${(last.perSecond / first.perSecond).toFixed(2)} (target <= 1.2)`)
}
await writer.end()
await admin.end()
