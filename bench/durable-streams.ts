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
 */
import { spawn, type ChildProcess } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { Agent, request } from 'node:http'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import pg from 'pg'
import { migrateToLatest } from '../db/migrate.js'
import { adminUrl as serverUrl, freePort, root, sleep, withDatabase } from './common.js'

const { values: args } = parseArgs({
  options: {
    sizes: { type: 'string', default: '10,1000' },
    runs: { type: 'string', default: '50' },
    rate: { type: 'string', default: '10' },
    seconds: { type: 'string', default: '10' },
    'settle-ms': { type: 'string', default: '11000' }
  }
})
const sizes = args.sizes.split(',').map(Number)
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

async function rssKb (pid: number): Promise<number> {
  for (let round = 0; round < 3; round++) {
    process.kill(pid, 'SIGWINCH') // bench/gc-on-signal.ts: full collections
    await sleep(300)
  }
  return Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1])
}

async function startService (port: number): Promise<ChildProcess> {
  const child = spawn(process.execPath, ['--expose-gc', '--import', 'tsx', '--import', join(root, 'bench/gc-on-signal.ts'), join(root, 'server.ts')], {
    cwd: root,
    env: { ...process.env, DATABASE_URL: databaseUrl, PORT: String(port), HOST: '127.0.0.1', LOG_LEVEL: 'warn', MIGRATE_ON_START: 'false', MAX_EVENT_LOOP_DELAY_MS: '0', SSE_MAX_STREAMS: '1000000' },
    stdio: ['ignore', 'inherit', 'inherit']
  })
  for (let attempt = 0; attempt < 300; attempt++) {
    try { if ((await fetch(`http://127.0.0.1:${port}/ready`)).ok) return child } catch {}
    await sleep(100)
  }
  throw new Error('the service did not start')
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
  await writer.query(`insert into runs (run_id, goal, summary, status, created_at, updated_at) values ($1, 'bench', '', 'running', now(), now())`, [runId(i)])
}
const port = await freePort()
const service = await startService(port)
const agent = new Agent({ keepAlive: true, maxSockets: Infinity })
const idleRss = await rssKb(service.pid!)
const metrics = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text()
const wakeup = /^event_wakeup_live 1$/m.test(metrics) ? 'live (WAL streaming)' : 'not live (polling alone: the server refuses replication connections)'
const os = await import('node:os')
console.log(`machine: ${os.cpus().length} cores, load average ${os.loadavg().map((load) => load.toFixed(2)).join(' ')}, node ${process.version}`)
console.log(`durable streams long-poll: ${runs} runs, ${rate} events/s for ${seconds} s, STREAMS_LONG_POLL_MS default (20 s), EVENTS_POLL_INTERVAL_MS default (250 ms); the wake-up: ${wakeup}`)
console.log('waiters  statements/s  RSS/waiter  p50 ms  p99 ms  deliveries')
const results: Array<{ size: number, perSecond: number }> = []
for (const size of sizes) {
  const latencies: number[] = []
  // From the tail: the events of an earlier size are not this one's.
  const tail = (await fetch(`http://127.0.0.1:${port}/api/streams/events?offset=now`)).headers.get('stream-next-offset')!
  const pollers = Array.from({ length: size }, (_, i) => poller(port, agent, runId(i), tail, latencies))
  while (pollers.reduce((sum, p) => sum + p.waiting(), 0) < size) await sleep(100)
  await sleep(500)
  const rss = await rssKb(service.pid!)
  await sleep(STATS_SETTLE_MS)
  const before = await transactions(admin)
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
  await sleep(STATS_SETTLE_MS)
  const statements = await transactions(admin) - before - written
  const perSecond = statements / (elapsed + 2 + STATS_SETTLE_MS / 1000)
  for (const p of pollers) p.stop()
  const sorted = latencies.sort((a, b) => a - b)
  results.push({ size, perSecond })
  console.log(`${String(size).padStart(7)}  ${perSecond.toFixed(1).padStart(12)}  ${(((rss - idleRss) * 1024) / size).toFixed(0).padStart(8)} B  ${String(percentile(sorted, 0.5)).padStart(6)}  ${String(percentile(sorted, 0.99)).padStart(6)}  ${sorted.length}`)
  // Let the stopped pollers' last requests end (at most a long-poll timeout) before the next size.
  await writer.query("insert into events (event_type, run_id) select 'wake', run_id from runs")
  await sleep(1500)
}
if (results.length >= 2) {
  const [first, last] = [results[0]!, results.at(-1)!]
  console.log(`statements per second at ${last.size} waiters / at ${first.size}: ${(last.perSecond / first.perSecond).toFixed(2)} (target <= 1.2)`)
}
agent.destroy()
service.kill('SIGTERM')
await writer.end()
await admin.end()
