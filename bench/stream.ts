/*
 * The event stream under many subscribers (BENCHMARKS.md, "Event stream").
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm run bench:stream
 *   ... npm run bench:stream -- --sizes 10,1000 --rate 10 --seconds 5     (smaller)
 *   ... npm run bench:stream -- --sizes 5 --seconds 1 --settle-ms 500 --storm 50 --idle-seconds 1   (CI's smoke run: figures not meaningful)
 *   ... npm run bench:stream -- --wakeup wal,off --sizes 10,1000,5000     (the wake-up on and off, side by side)
 *   ... npm run bench:stream -- --on-run all     (every stream unfiltered: every event to every stream)
 *   ... npm run bench:stream -- --wakeup wal,floor --storm 0     (the service against the machine's floor, bench/fanout-floor.ts)
 *   ... npm run bench:stream -- --wakeup wal --sizes 5000,10000 --storm 0 --idle-seconds 0 --fresh --service-flags=--max-semi-space-size=8
 *       (memory per stream, each size on a fresh service, with node flags for the service only: by default
 *       npm start's, package.json's start script; --service-flags= for none, Node's defaults)
 *   ... npm run bench:stream -- --wakeup wal,floor --sizes 5000 --storm 0 --idle-seconds 0 --rounds 3   (issue 33's three runs against the floor)
 *       (each size's timed window follows --warmup-events, 20 by default, written and delivered untimed:
 *       --warmup-events 0 times a fresh server's first fan-outs too)
 *
 * The service runs on the bench's own node (process.execPath: put the Node
 * to measure first on PATH), through tsx (--entry tsx) or compiled as `npm
 * start` runs it (--entry dist, after npm run build), with
 * bench/service-probe.ts preloaded: the GC pauses (perf_hooks 'gc'
 * entries), the event loop's delay and the CPU of the service during the
 * writing window, and its memory taken apart, are read inside it. Memory
 * is read as a container sees it: VmRSS, the median of three readings a
 * second apart, no forced collection; --forced-gc adds the figure after
 * full collections, labelled (and collects before the streams open too).
 *
 * Starts the service as a child process on a database of its own
 * (ocp_bench_stream, recreated), then for each size: opens that many SSE
 * subscribers on loopback (--on-run, default 0.5, of them filtered on the
 * written run, the rest on another run that hears nothing: issue 14's "half
 * of them on the written run"; `all` opens them unfiltered), measures the server's resident memory per idle
 * subscriber, has a writer commit events at a steady rate, and measures
 * commit-to-delivery latency at every subscriber and the queries per second
 * the service ran meanwhile (from pg_stat_database). Then a reconnect storm:
 * --storm streams (3000) resume at once from cursors among the last events
 * written, as after a replica's restart; it counts the database reads they
 * cost beyond the polling and checks that each got exactly the events after
 * its cursor. Prints figures, and the ratios the targets are about, from
 * this one run.
 *
 * --wakeup lists EVENTS_WAKEUP modes (default `auto,off`): the whole run
 * (idle cost, then every size) is made once per mode, each on a fresh
 * service, the storm with the first mode only. The wake-up needs a server
 * whose pg_hba.conf allows `replication` connections from loopback (initdb's
 * default does; a server that refuses leaves `auto` polling, and the run
 * says so). The mode `floor` runs bench/fanout-floor.ts instead of the
 * service: a bare server handed each event the moment it is committed,
 * writing it to the same streams with nothing else in the way (no idle
 * figure and no storm for it).
 */
import { spawn, type ChildProcess } from 'node:child_process'
import { request, Agent } from 'node:http'
import { connect } from 'node:net'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import pg from 'pg'
import { migrateToLatest } from '../db/migrate.ts'
import { adminUrl, BENCH_SERVICE_ENV, freePort, root, sleep, untilAnswering, withDatabase } from './common.ts'
import { ask, breakdown, medianRssKb, pausesLine, PROBE, rssKb, serviceArgs, startFlags, type ProbeReport } from './probe.ts'

const { values: args } = parseArgs({
  options: {
    sizes: { type: 'string', default: '10,1000,10000' },
    rate: { type: 'string', default: '10' },
    seconds: { type: 'string', default: '10' },
    'warmup-events': { type: 'string', default: '20' },
    'poll-ms': { type: 'string', default: '250' },
    'settle-ms': { type: 'string', default: '11000' },
    storm: { type: 'string', default: '3000' },
    wakeup: { type: 'string', default: 'auto,off' },
    'idle-seconds': { type: 'string', default: '10' },
    'on-run': { type: 'string', default: '0.5' },
    entry: { type: 'string', default: 'tsx' },
    'service-flags': { type: 'string' },
    'forced-gc': { type: 'boolean', default: false },
    fresh: { type: 'boolean', default: false },
    rounds: { type: 'string', default: '1' }
  }
})
const sizes = args.sizes.split(',').map(Number)
/** The service's node flags: --service-flags, else npm start's. */
const serviceFlags = args['service-flags'] ?? startFlags()
const rate = Number(args.rate)
const seconds = Number(args.seconds)
const pollMs = Number(args['poll-ms'])
const unfiltered = args['on-run'] === 'all'
const onRunShare = unfiltered ? 1 : Number(args['on-run'])
const WRITTEN_RUN = 'bench-run'
const DATABASE = 'ocp_bench_stream'

const serverUrl = adminUrl()
const databaseUrl = withDatabase(serverUrl, DATABASE)

const percentile = (sorted: number[], p: number) => sorted.length === 0 ? Number.NaN : sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * p))]!

/**
 * Postgres backends publish their statistics lazily: up to 10 s after going
 * idle (PGSTAT_IDLE_INTERVAL). Waiting that long keeps the queries of one
 * phase (opening the streams) out of the next one's count.
 */
const STATS_SETTLE_MS = Number(args['settle-ms'])
/** How long the service's idle statements are counted (--idle-seconds). */
const IDLE_SECONDS = Number(args['idle-seconds'])

async function startService (port: number, wakeup: string): Promise<ChildProcess> {
  const floor = wakeup === 'floor'
  const child = spawn(process.execPath, floor
    ? ['--import', 'tsx', '--import', PROBE, join(root, 'bench/fanout-floor.ts')]
    : serviceArgs(args.entry, serviceFlags), {
    cwd: root,
    env: {
      ...process.env,
      DATABASE_URL: databaseUrl,
      PORT: String(port),
      HOST: '127.0.0.1',
      LOG_LEVEL: 'warn',
      MIGRATE_ON_START: 'false',
      EVENTS_POLL_INTERVAL_MS: String(pollMs),
      EVENTS_WAKEUP: wakeup,
      // Measure delivery, not admission: the service caps streams at 10,000 by default, a quarter of that for one caller (this one client).
      ...BENCH_SERVICE_ENV,
      SSE_MAX_STREAMS: '1000000',
      SSE_MAX_STREAMS_PER_CALLER: '1000000'
    },
    stdio: ['ignore', 'inherit', 'inherit', 'ipc']
  })
  await untilAnswering(child, `http://127.0.0.1:${port}/health`, floor ? 'the floor' : 'the service')
  return child
}

/** Commit time of each event, by id: taken just before COMMIT is sent (a conservative start). */
const committedAt = new Map<number, number>()
/** Each event's fastest and slowest delivery, by id: which events make the p99, and whether the fan-out began late (fastest) or took long. */
const fastestById = new Map<number, number>()
const slowestById = new Map<number, number>()
/** When each keep-alive frame reached the client (a keep-alive burst beside a fan-out shows here). */
const keepAlivesAt: number[] = []

interface Subscriber { received: number, close: () => void }

function subscribe (port: number, latencies: number[], runId: string | undefined): Promise<Subscriber> {
  // A raw socket rather than http.request: the client's own cost per frame
  // (HTTP parser, chunk decoding, stream events) is part of what a
  // commit-to-delivery figure measures on a 2-core machine, so keep it least.
  return new Promise((resolve, reject) => {
    const path = runId === undefined ? '/api/events/stream' : `/api/events/stream?run_id=${runId}`
    const socket = connect(port, '127.0.0.1', () => socket.write(`GET ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n`))
    const subscriber: Subscriber = { received: 0, close: () => socket.destroy() }
    socket.setEncoding('latin1')
    let opened = false
    socket.on('data', (chunk: string) => {
      const now = Date.now()
      if (!opened) { opened = true; resolve(subscriber) }
      for (const match of chunk.matchAll(/^id: (\d+)\ndata:/gm)) {
        const id = Number(match[1])
        const sent = committedAt.get(id)
        if (sent !== undefined) {
          latencies.push(now - sent)
          if (now - sent > (slowestById.get(id) ?? -1)) slowestById.set(id, now - sent)
          if (now - sent < (fastestById.get(id) ?? Infinity)) fastestById.set(id, now - sent)
        }
        subscriber.received++
      }
      if (chunk.includes(': keep-alive')) keepAlivesAt.push(now)
    })
    socket.on('error', (err) => { if (!opened) reject(err) })
  })
}

async function transactionsOf (admin: pg.Client): Promise<number> {
  const result = await admin.query('select xact_commit + xact_rollback as n from pg_stat_database where datname = $1', [DATABASE])
  return Number(result.rows[0].n)
}

/** The service's Prometheus metrics, by series. */
async function metricsOf (port: number): Promise<Map<string, number>> {
  const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text()
  return new Map([...text.matchAll(/^([a-z_]+(?:\{[^}]*\})?) (\S+)$/gm)].map((m) => [m[1]!, Number(m[2])]))
}

/**
 * One stream resuming after `cursor`, as an EventSource would: a refusal
 * (a 503 when the service sheds load, or a stream that ends before its
 * events) is retried after a second, from the same cursor. Resolves with
 * the ids received once it has `expected` of them (or after 30 s), and how
 * many times it was refused.
 */
function resume (port: number, agent: Agent, cursor: number, expected: number): Promise<{ ids: number[], refused: number }> {
  const deadline = Date.now() + 30_000
  let refused = 0
  const attempt = (): Promise<number[]> => new Promise((resolve, reject) => {
    const ids: number[] = []
    let done = false
    const finish = (retry: boolean) => {
      if (done) return
      done = true
      req.destroy()
      if (retry && ids.length < expected && Date.now() < deadline) {
        refused++
        setTimeout(() => { attempt().then(resolve, reject) }, 1000 + Math.random() * 500)
      } else resolve(ids)
    }
    const req = request({ host: '127.0.0.1', port, path: '/api/events/stream', agent, headers: { accept: 'text/event-stream', 'last-event-id': String(cursor) } }, (res) => {
      if (res.statusCode !== 200) { res.resume(); finish(true); return }
      res.setEncoding('utf8')
      res.on('data', (chunk: string) => {
        for (const match of chunk.matchAll(/^id: (\d+)\ndata:/gm)) ids.push(Number(match[1]))
        if (ids.length >= expected) finish(false)
      })
      res.on('end', () => finish(true))
      res.on('error', () => {})
    })
    // A hard deadline: a live stream's keep-alive comments keep its socket from ever being idle.
    const timer = setTimeout(() => finish(false), Math.max(1, deadline - Date.now()))
    req.on('close', () => clearTimeout(timer))
    req.on('error', (err) => { if (!done) { done = true; reject(err) } })
    req.end()
  })
  return attempt().then((ids) => ({ ids, refused }))
}

/** The reconnect storm: `streams` resuming at once from cursors inside the window. */
async function storm (port: number, agent: Agent, admin: pg.Client, writer: pg.Client, streams: number): Promise<void> {
  const written: number[] = []
  for (let i = 0; i < 200; i++) {
    const { rows } = await writer.query("insert into events (event_type, run_id, summary, payload) values ('task_running', 'bench-run', 'bench', '{}') returning event_id")
    written.push(Number(rows[0].event_id))
  }
  await sleep(1000)
  const window = await metricsOf(port)
  // The polling alone, over as long as the storm will take (5 s, or --idle-seconds if shorter but at least 1: a smoke run's), then the storm.
  await sleep(STATS_SETTLE_MS)
  const idleStart = await transactionsOf(admin)
  const idleStarted = Date.now()
  await sleep(Math.max(1, Math.min(5, IDLE_SECONDS)) * 1000)
  await sleep(STATS_SETTLE_MS)
  const pollingPerSecond = ((await transactionsOf(admin)) - idleStart) / ((Date.now() - idleStarted) / 1000)
  const before = await metricsOf(port)
  const stormStart = await transactionsOf(admin)
  const started = Date.now()
  const cursors = Array.from({ length: streams }, (_, i) => written[(i * 7) % (written.length - 1)]!)
  const received = await Promise.all(cursors.map((cursor) => resume(port, agent, cursor, written.filter((id) => id > cursor).length)))
  const stormMs = Date.now() - started
  await sleep(STATS_SETTLE_MS)
  const stormTransactions = (await transactionsOf(admin)) - stormStart
  const beyondPolling = stormTransactions - pollingPerSecond * ((Date.now() - started) / 1000)
  const after = await metricsOf(port)
  const exact = received.filter(({ ids }, i) => JSON.stringify(ids) === JSON.stringify(written.filter((id) => id > cursors[i]!))).length
  const refused = received.filter(({ refused }) => refused > 0).length
  const delta = (series: string) => (after.get(series) ?? 0) - (before.get(series) ?? 0)
  console.log(`\nreconnect storm: ${streams} streams resumed at once from cursors among the last ${written.length} events, all served within ${stormMs} ms` +
    ` (${refused} refused at first by the service's load shedding, then retried as an EventSource does)`)
  console.log(`  window: ${window.get('event_window_events')} events, ${((window.get('event_window_bytes') ?? 0) / 1024).toFixed(0)} kB (${((window.get('event_window_bytes') ?? 0) / (window.get('event_window_events') || 1)).toFixed(0)} bytes per event)`)
  console.log(`  catch-up reads: ${delta('event_catch_up_reads_total{source="memory"}')} from memory, ${delta('event_catch_up_reads_total{source="database"}')} from the database`)
  console.log(`  database transactions during the storm: ${stormTransactions}, polling alone ${pollingPerSecond.toFixed(1)}/s: ${Math.max(0, beyondPolling).toFixed(0)} beyond the polling (target <= 20)`)
  console.log(`  streams that got exactly the events after their cursor: ${exact}/${streams}`)
}

interface Row { size: number, p50: number, p99: number, qps: number, memoryPerSubscriberKb: number, forcedPerSubscriberKb: number | undefined, delivered: number, expected: number, longestPauseMs: number }

async function stopService (service: ChildProcess): Promise<void> {
  service.kill('SIGTERM')
  await new Promise((resolve) => service.once('exit', resolve))
}

async function main () {
  const admin = new pg.Client({ connectionString: serverUrl })
  await admin.connect()
  await admin.query(`drop database if exists ${DATABASE} with (force)`)
  await admin.query(`create database ${DATABASE}`)
  await migrateToLatest(databaseUrl!)
  const writer = new pg.Client({ connectionString: databaseUrl })
  await writer.connect()

  const agent = new Agent({ keepAlive: false, maxSockets: Infinity })
  const os = await import('node:os')
  console.log(`machine: ${os.cpus().length} cores, load average ${os.loadavg().map((load) => load.toFixed(2)).join(' ')}, node ${process.version} (the service runs on the same node: ${process.execPath}); ` +
    `service ${args.entry === 'dist' ? 'dist/server.js (as npm start)' : 'server.ts through tsx'}, its node flags: ${serviceFlags === '' ? 'none (Node\'s defaults)' : serviceFlags}${args['service-flags'] === undefined ? ' (npm start\'s)' : ''}${process.env.NODE_OPTIONS ? `, NODE_OPTIONS=${process.env.NODE_OPTIONS}` : ''}; ` +
    `poll interval ${pollMs} ms; writer ${rate} events/s for ${seconds} s; ` +
    `${unfiltered ? 'every stream unfiltered' : `${onRunShare} of the streams on the written run, the rest on another`}; ` +
    `memory: VmRSS, median of three readings 1 s apart, no forced collection${args['forced-gc'] ? ' (then, labelled, after forced full collections)' : ''}; ${args.fresh ? 'a fresh service for each size' : 'one service for every size'}\n`)
  const modes = args.wakeup.split(',')
  const rounds = Number(args.rounds)
  /** Each round's p99 at the largest size, by mode: issue 33's ratio to the floor's is read within a round. */
  const p99s: Array<Map<string, number>> = []
  for (let round = 1; round <= rounds; round++) {
    p99s.push(new Map())
    if (rounds > 1) console.log(`round ${round} of ${rounds}`)
    for (const [index, mode] of modes.entries()) {
      const floor = mode === 'floor'
      const start = async () => {
        const port = await freePort()
        const service = await startService(port, mode)
        await sleep(2000)
        return { port, service }
      }
      let { port, service } = await start()
      const live = (await metricsOf(port)).get('event_wakeup_live') === 1
      const version = (await ask(service, 'report')).node
      console.log(floor
        ? `the floor (bench/fanout-floor.ts, node ${version}): no service, each event handed to a bare server as soon as it is committed`
        : `EVENTS_WAKEUP=${mode}: the wake-up is ${live ? 'live (WAL streaming)' : 'not live: polling alone'}; the service on node ${version}`)
      if (!floor) await idleStatements(admin)
      const results: Row[] = []
      for (const [i, size] of sizes.entries()) {
        if (args.fresh && i > 0) {
          await stopService(service);
          ({ port, service } = await start())
        }
        results.push(await measure(port, service, size, floor, admin, writer))
      }
      summarize(results, floor)
      p99s.at(-1)!.set(mode, results.at(-1)!.p99)
      const stormStreams = Number(args.storm)
      if (round === 1 && index === 0 && stormStreams > 0 && !floor) await storm(port, agent, admin, writer, stormStreams)
      await stopService(service)
      console.log('')
    }
  }

  for (const mode of modes.filter((candidate) => candidate !== 'floor' && modes.includes('floor'))) {
    const ratios = p99s.map((round) => round.get(mode)! / round.get('floor')!)
    console.log(`p99 / the floor's p99 at ${sizes.at(-1)} streams, EVENTS_WAKEUP=${mode}, each round: ${ratios.map((ratio) => ratio.toFixed(2)).join(', ')} ` +
      `(issue 33: <= 1.25 in each: ${ratios.every((ratio) => ratio <= 1.25) ? 'met' : 'MISSED'})`)
  }
  await writer.end()
  await admin.query(`drop database if exists ${DATABASE} with (force)`)
  await admin.end()
  agent.destroy()
}

/** The service's statements per second with no stream and no writer (--idle-seconds; 0 skips it). */
async function idleStatements (admin: pg.Client): Promise<void> {
  const idleSeconds = IDLE_SECONDS
  if (idleSeconds <= 0) return
  await sleep(STATS_SETTLE_MS)
  const before = await transactionsOf(admin)
  const started = Date.now()
  await sleep(idleSeconds * 1000)
  await sleep(STATS_SETTLE_MS)
  const perSecond = ((await transactionsOf(admin)) - before) / ((Date.now() - started) / 1000)
  console.log(`  idle: ${perSecond.toFixed(1)} statements/s (no stream, no writer; the event log's clock included)`)
}

/** One size on a service (or the floor: events handed to it over IPC): memory per idle stream, then delivery. */
async function measure (port: number, service: ChildProcess, size: number, floor: boolean, admin: pg.Client, writer: pg.Client): Promise<Row> {
  const forced = args['forced-gc']
  await sleep(1500)
  const baseline = await medianRssKb(service.pid!)
  const baselineReport = await ask(service, 'report')
  let baselineForced: number | undefined
  if (forced) {
    await ask(service, 'gc')
    baselineForced = rssKb(service.pid!)
  }
  const latencies: number[] = []
  const subscribers: Subscriber[] = []
  // The first onRun streams hear the written run; the others (filtered on another run) hear nothing.
  const onRun = Math.round(size * onRunShare)
  const runOf = (index: number) => unfiltered ? undefined : index < onRun ? WRITTEN_RUN : 'bench-other-run'
  for (let opened = 0; opened < size; opened += 250) {
    subscribers.push(...await Promise.all(Array.from({ length: Math.min(250, size - opened) }, (_, i) => subscribe(port, latencies, runOf(opened + i)))))
  }
  await sleep(1000)
  const idle = await medianRssKb(service.pid!)
  const idleReport = await ask(service, 'report')
  let idleForced: number | undefined
  let forcedReports: [ProbeReport, ProbeReport] | undefined
  if (forced) {
    await ask(service, 'gc')
    idleForced = rssKb(service.pid!)
    forcedReports = [baselineReport, await ask(service, 'report')]
  }

  const listening = subscribers.slice(0, onRun)
  /** Commits `count` events at the rate, from `from`; `timed`: each one's commit time is kept, for its deliveries. */
  const write = async (count: number, from: number, timed: boolean): Promise<number[]> => {
    const commitMs: number[] = []
    for (let i = 0; i < count; i++) {
      const due = from + (i * 1000) / rate
      if (due > Date.now()) await sleep(due - Date.now())
      await writer.query('begin')
      const inserted = await writer.query(
        "insert into events (event_type, run_id, summary, payload) values ('task_running', 'bench-run', 'bench', '{}') returning event_id"
      )
      const id = Number(inserted.rows[0].event_id)
      const committing = Date.now()
      if (timed) committedAt.set(id, committing)
      await writer.query('commit')
      commitMs.push(Date.now() - committing)
      if (floor) service.send({ id, runId: WRITTEN_RUN, json: JSON.stringify({ event_id: id, event_type: 'task_running', run_id: WRITTEN_RUN, task_id: null, thread_id: null, summary: 'bench', payload: {}, created_at: new Date().toISOString() }) })
    }
    const deadline = Date.now() + 30_000
    while (listening.some((subscriber) => subscriber.received < count) && Date.now() < deadline) await sleep(50)
    return commitMs
  }
  // A fresh server's first fan-outs run code not yet compiled by the JIT, on the
  // client as on the server: events before the window, not timed (--warmup-events).
  const warmup = Number(args['warmup-events'])
  if (warmup > 0) {
    await write(warmup, Date.now(), false)
    for (const subscriber of listening) subscriber.received = 0
  }

  await sleep(STATS_SETTLE_MS) // the connection phase's (and the warm-up's) queries land in the statistics first
  const transactionsBefore = await transactionsOf(admin)
  await ask(service, 'reset') // GC pauses, loop delay and CPU: the writing window's only
  const started = Date.now()
  const events = rate * seconds
  const commitMs = await write(events, started, true)
  const during = await ask(service, 'report')
  await sleep(STATS_SETTLE_MS)
  const elapsed = (Date.now() - started) / 1000
  // The writer's own transactions (begin/insert/commit: one each) are not the stream's.
  const streamTransactions = (await transactionsOf(admin)) - transactionsBefore - events
  for (const subscriber of subscribers) subscriber.close()

  latencies.sort((a, b) => a - b)
  const row: Row = {
    size,
    p50: percentile(latencies, 0.5),
    p99: percentile(latencies, 0.99),
    qps: streamTransactions / elapsed,
    memoryPerSubscriberKb: (idle.median - baseline.median) / size,
    forcedPerSubscriberKb: forced ? (idleForced! - baselineForced!) / size : undefined,
    delivered: subscribers.reduce((sum, subscriber) => sum + subscriber.received, 0),
    expected: onRun * events,
    longestPauseMs: during.pauses.longestMs
  }
  console.log(`${String(size).padStart(6)} subscribers (${onRun} on the written run), node ${during.node}: delivered ${row.delivered}/${row.expected}; commit-to-delivery p50 ${row.p50} ms, p99 ${row.p99} ms; ` +
    `stream queries ${row.qps.toFixed(2)}/s; the writer's COMMIT itself (in those figures) p50 ${percentile(commitMs.sort((a, b) => a - b), 0.5)} ms`)
  console.log(`    memory (no forced GC): server RSS ${baseline.median} -> ${idle.median} kB idle (readings ${baseline.readings.join('/')} -> ${idle.readings.join('/')}) = ${row.memoryPerSubscriberKb.toFixed(1)} kB per idle stream`)
  console.log(`    per stream: ${breakdown(baselineReport, baseline.median, idleReport, idle.median, size)}`)
  if (forced) {
    console.log(`    forced full GC (labelled; not what a container sees): ${baselineForced} -> ${idleForced} kB = ${row.forcedPerSubscriberKb!.toFixed(1)} kB per idle stream; ` +
      `live objects: ${breakdown(forcedReports![0], baselineForced!, forcedReports![1], idleForced!, size)}`)
  }
  console.log(`    during the writing window (${((Date.now() - started) / 1000 - STATS_SETTLE_MS / 1000).toFixed(1)} s): ${pausesLine(during)}`)
  console.log(`    ${slowestLine(started)}`)
  committedAt.clear()
  slowestById.clear()
  fastestById.clear()
  keepAlivesAt.length = 0
  return row
}

/** The round's three slowest events (when each was committed, its slowest delivery) and the keep-alives that arrived during the writing window. */
function slowestLine (started: number): string {
  const slowest = [...slowestById].sort((a, b) => b[1] - a[1]).slice(0, 3)
    .map(([id, ms]) => `${ms} ms (the first ${fastestById.get(id)} ms; committed at +${((committedAt.get(id)! - started) / 1000).toFixed(2)} s)`)
  const during = keepAlivesAt.filter((at) => at >= started)
  const span = during.length === 0 ? '' : ` between +${((during[0]! - started) / 1000).toFixed(2)} and +${((during.at(-1)! - started) / 1000).toFixed(2)} s`
  return `slowest events' last deliveries: ${slowest.join(', ')}; the median event's first ${percentile([...fastestById.values()].sort((a, b) => a - b), 0.5)} ms; keep-alives received in the window: ${during.length}${span}`
}

function summarize (results: Row[], floor: boolean): void {
  const bySize = new Map(results.map((row) => [row.size, row]))
  const smallest = results[0]!
  const largest = results[results.length - 1]!
  console.log('Targets')
  if (!floor) {
    if (results.length > 1) console.log(`  queries/s at ${largest.size} vs ${smallest.size} subscribers: ${(largest.qps / smallest.qps).toFixed(2)}x (target <= 1.2x)`)
    const thousand = bySize.get(1000)
    if (thousand !== undefined) console.log(`  p99 latency at 1000 subscribers: ${thousand.p99} ms (target <= poll interval + 50 = ${pollMs + 50} ms)`)
  }
  console.log(`  commit-to-delivery at ${largest.size} subscribers: p50 ${largest.p50} ms, p99 ${largest.p99} ms (targets with the wake-up: p50 <= 10 ms and p99 <= 30 ms at 5000, p99 <= 100 ms at 10000; issue 33: p99 <= 1.25 x the floor's)`)
  for (const row of results) {
    console.log(`  memory per idle stream at ${row.size}, no forced GC: ${row.memoryPerSubscriberKb.toFixed(1)} kB (target <= 20 kB)${row.forcedPerSubscriberKb === undefined ? '' : `; after forced GC ${row.forcedPerSubscriberKb.toFixed(1)} kB`}; longest GC pause while writing ${row.longestPauseMs.toFixed(1)} ms`)
  }
  const lost = results.filter((row) => row.delivered !== row.expected)
  console.log(`  events lost or repeated: ${lost.length === 0 ? 0 : lost.map((row) => `${row.size}: ${row.delivered}/${row.expected}`).join(', ')}`)
}

main().catch((err: unknown) => {
  console.error(err)
  process.exit(1)
})
