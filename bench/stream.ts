/*
 * The event stream under many subscribers (BENCHMARKS.md, "Event stream").
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm run bench:stream
 *   ... npm run bench:stream -- --sizes 10,1000 --rate 10 --seconds 5     (smaller)
 *   ... npm run bench:stream -- --sizes 5 --seconds 1 --settle-ms 500     (CI's smoke run: figures not meaningful)
 *
 * Starts the service as a child process on a database of its own
 * (ocp_bench_stream, recreated), then for each size: opens that many SSE
 * subscribers on loopback, measures the server's resident memory per idle
 * subscriber, has a writer commit events at a steady rate, and measures
 * commit-to-delivery latency at every subscriber and the queries per second
 * the service ran meanwhile (from pg_stat_database). Prints figures, and the
 * ratios the targets are about, from this one run.
 */
import { spawn, type ChildProcess } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { request, Agent } from 'node:http'
import { createServer } from 'node:net'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import pg from 'pg'
import { migrateToLatest } from '../db/migrate.js'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const { values: args } = parseArgs({
  options: {
    sizes: { type: 'string', default: '10,1000,10000' },
    rate: { type: 'string', default: '10' },
    seconds: { type: 'string', default: '10' },
    'poll-ms': { type: 'string', default: '250' },
    'settle-ms': { type: 'string', default: '11000' }
  }
})
const sizes = args.sizes.split(',').map(Number)
const rate = Number(args.rate)
const seconds = Number(args.seconds)
const pollMs = Number(args['poll-ms'])
const DATABASE = 'ocp_bench_stream'

const adminUrl = process.env.DATABASE_URL
if (adminUrl === undefined || adminUrl === '') {
  console.error('bench: set DATABASE_URL (e.g. postgres://postgres@127.0.0.1:5432/postgres)')
  process.exit(2)
}
const databaseUrl = (() => { const url = new URL(adminUrl); url.pathname = `/${DATABASE}`; return url.toString() })()

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))
const percentile = (sorted: number[], p: number) => sorted.length === 0 ? Number.NaN : sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * p))]!

/** The service's resident memory after full garbage collections (bench/gc-on-signal.ts). */
async function settledRssKb (pid: number): Promise<number> {
  for (let round = 0; round < 3; round++) {
    process.kill(pid, 'SIGWINCH')
    await sleep(300)
  }
  const match = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))
  return Number(match?.[1])
}

/**
 * Postgres backends publish their statistics lazily: up to 10 s after going
 * idle (PGSTAT_IDLE_INTERVAL). Waiting that long keeps the queries of one
 * phase (opening the streams) out of the next one's count.
 */
const STATS_SETTLE_MS = Number(args['settle-ms'])

function freePort (): Promise<number> {
  return new Promise((resolve) => {
    const server = createServer().listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number }
      server.close(() => resolve(port))
    })
  })
}

async function startService (port: number): Promise<ChildProcess> {
  const child = spawn(process.execPath, ['--expose-gc', '--import', 'tsx', '--import', join(root, 'bench/gc-on-signal.ts'), join(root, 'server.ts')], {
    cwd: root,
    env: {
      ...process.env,
      DATABASE_URL: databaseUrl,
      PORT: String(port),
      HOST: '127.0.0.1',
      LOG_LEVEL: 'warn',
      MIGRATE_ON_START: 'false',
      EVENTS_POLL_INTERVAL_MS: String(pollMs)
    },
    stdio: ['ignore', 'inherit', 'inherit']
  })
  for (let attempt = 0; attempt < 100; attempt++) {
    try {
      const res = await fetch(`http://127.0.0.1:${port}/health`)
      if (res.ok) return child
    } catch {}
    await sleep(100)
  }
  throw new Error('the service did not start')
}

/** Commit time of each event, by id: taken just before COMMIT is sent (a conservative start). */
const committedAt = new Map<number, number>()

interface Subscriber { received: number, close: () => void }

function subscribe (port: number, agent: Agent, latencies: number[]): Promise<Subscriber> {
  return new Promise((resolve, reject) => {
    const subscriber: Subscriber = { received: 0, close: () => req.destroy() }
    const req = request({ host: '127.0.0.1', port, path: '/api/events/stream', agent, headers: { accept: 'text/event-stream' } }, (res) => {
      res.setEncoding('utf8')
      let opened = false
      res.on('data', (chunk: string) => {
        const now = Date.now()
        if (!opened) { opened = true; resolve(subscriber) }
        for (const match of chunk.matchAll(/^id: (\d+)\ndata:/gm)) {
          const sent = committedAt.get(Number(match[1]))
          if (sent !== undefined) latencies.push(now - sent)
          subscriber.received++
        }
      })
      res.on('error', () => {})
    })
    req.on('error', reject)
    req.end()
  })
}

async function transactionsOf (admin: pg.Client): Promise<number> {
  const result = await admin.query('select xact_commit + xact_rollback as n from pg_stat_database where datname = $1', [DATABASE])
  return Number(result.rows[0].n)
}

async function main () {
  const admin = new pg.Client({ connectionString: adminUrl })
  await admin.connect()
  await admin.query(`drop database if exists ${DATABASE} with (force)`)
  await admin.query(`create database ${DATABASE}`)
  await migrateToLatest(databaseUrl!)
  const writer = new pg.Client({ connectionString: databaseUrl })
  await writer.connect()

  const port = await freePort()
  const service = await startService(port)
  const agent = new Agent({ keepAlive: false, maxSockets: Infinity })
  console.log(`machine: ${(await import('node:os')).cpus().length} cores, node ${process.version}; poll interval ${pollMs} ms; writer ${rate} events/s for ${seconds} s\n`)

  const results: Array<{ size: number, p50: number, p99: number, qps: number, memoryPerSubscriberKb: number, delivered: number, expected: number }> = []
  for (const size of sizes) {
    await sleep(1500)
    const baseline = await settledRssKb(service.pid!)
    const latencies: number[] = []
    const subscribers: Subscriber[] = []
    for (let opened = 0; opened < size; opened += 250) {
      subscribers.push(...await Promise.all(Array.from({ length: Math.min(250, size - opened) }, () => subscribe(port, agent, latencies))))
    }
    await sleep(1000)
    const idle = await settledRssKb(service.pid!)

    await sleep(STATS_SETTLE_MS) // the connection phase's queries land in the statistics first
    const transactionsBefore = await transactionsOf(admin)
    const started = Date.now()
    const events = rate * seconds
    for (let i = 0; i < events; i++) {
      const due = started + (i * 1000) / rate
      if (due > Date.now()) await sleep(due - Date.now())
      await writer.query('begin')
      const inserted = await writer.query(
        "insert into events (event_type, run_id, summary, payload) values ('task_running', 'bench-run', 'bench', '{}') returning event_id"
      )
      committedAt.set(Number(inserted.rows[0].event_id), Date.now())
      await writer.query('commit')
    }
    const deadline = Date.now() + 30_000
    while (subscribers.some((subscriber) => subscriber.received < events) && Date.now() < deadline) await sleep(50)
    await sleep(STATS_SETTLE_MS)
    const elapsed = (Date.now() - started) / 1000
    // The writer's own transactions (begin/insert/commit: one each) are not the stream's.
    const streamTransactions = (await transactionsOf(admin)) - transactionsBefore - events
    for (const subscriber of subscribers) subscriber.close()

    latencies.sort((a, b) => a - b)
    results.push({
      size,
      p50: percentile(latencies, 0.5),
      p99: percentile(latencies, 0.99),
      qps: streamTransactions / elapsed,
      memoryPerSubscriberKb: (idle - baseline) / size,
      delivered: subscribers.reduce((sum, subscriber) => sum + subscriber.received, 0),
      expected: size * events
    })
    const row = results[results.length - 1]!
    console.log(`${String(size).padStart(6)} subscribers: delivered ${row.delivered}/${row.expected}; commit-to-delivery p50 ${row.p50} ms, p99 ${row.p99} ms; ` +
      `stream queries ${row.qps.toFixed(2)}/s; server RSS ${baseline} -> ${idle} kB idle = ${row.memoryPerSubscriberKb.toFixed(1)} kB per subscriber`)
    committedAt.clear()
  }

  const bySize = new Map(results.map((row) => [row.size, row]))
  const smallest = results[0]!
  const largest = results[results.length - 1]!
  console.log('\nTargets')
  console.log(`  queries/s at ${largest.size} vs ${smallest.size} subscribers: ${(largest.qps / smallest.qps).toFixed(2)}x (target <= 1.2x)`)
  const thousand = bySize.get(1000)
  if (thousand !== undefined) console.log(`  p99 latency at 1000 subscribers: ${thousand.p99} ms (target <= poll interval + 50 = ${pollMs + 50} ms)`)
  console.log(`  memory per idle subscriber at ${largest.size}: ${largest.memoryPerSubscriberKb.toFixed(1)} kB (target <= 20 kB)`)
  const lost = results.filter((row) => row.delivered !== row.expected)
  console.log(`  events lost or repeated: ${lost.length === 0 ? 0 : lost.map((row) => `${row.size}: ${row.delivered}/${row.expected}`).join(', ')}`)

  service.kill('SIGTERM')
  await writer.end()
  await admin.query(`drop database if exists ${DATABASE} with (force)`)
  await admin.end()
  agent.destroy()
}

main().catch((err: unknown) => {
  console.error(err)
  process.exit(1)
})
