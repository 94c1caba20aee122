/*
 * What one idle event stream costs, taken apart (issue 33; BENCHMARKS.md,
 * "Event stream"): the service with no stream, then with --streams open
 * (half on a run, half on another, as bench/stream.ts opens them), a heap
 * snapshot of each (bench/service-probe.ts), and the difference per stream
 * by what the objects are: V8's constructor names, and Node's native
 * objects as its heap snapshot reports them. Live objects only (a heap
 * snapshot collects first); the resident memory around it is printed too,
 * with and without a forced collection.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:55433/postgres node --import tsx bench/heap-breakdown.ts --streams 2000
 *   ... --service-flags=--max-semi-space-size=16 --top 40
 *   ... --long-poll     (Durable Streams long-poll waiters instead of SSE streams)
 */
import { spawn, type ChildProcess } from 'node:child_process'
import { readFileSync, rmSync } from 'node:fs'
import { connect, type Socket } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import pg from 'pg'
import { migrateToLatest } from '../db/migrate.ts'
import { adminUrl, BENCH_SERVICE_ENV, freePort, root, sleep, withDatabase } from './common.ts'
import { ask, breakdown, medianRssKb, rssKb, serviceArgs, startFlags, type ProbeReport } from './probe.ts'

const { values: args } = parseArgs({
  options: {
    streams: { type: 'string', default: '2000' },
    top: { type: 'string', default: '30' },
    entry: { type: 'string', default: 'tsx' },
    'service-flags': { type: 'string' },
    'long-poll': { type: 'boolean', default: false }
  }
})
/** --long-poll: Durable Streams long-polls (live=long-poll at the tail of a run, bench/durable-streams.ts's waiters) instead of SSE streams. */
const longPoll = args['long-poll']
const streams = Number(args.streams)
const DATABASE = 'ocp_bench_heap'
const serverUrl = adminUrl()
const databaseUrl = withDatabase(serverUrl, DATABASE)

/** Self sizes by what a node is: a constructor's name for objects, the kind (and name) for the rest. */
function aggregate (path: string): Map<string, { count: number, bytes: number }> {
  const snapshot = JSON.parse(readFileSync(path, 'utf8')) as { snapshot: { meta: { node_fields: string[], node_types: [string[]] } }, nodes: number[], strings: string[] }
  const fields = snapshot.snapshot.meta.node_fields
  const types = snapshot.snapshot.meta.node_types[0]
  const width = fields.length
  const [typeAt, nameAt, sizeAt] = [fields.indexOf('type'), fields.indexOf('name'), fields.indexOf('self_size')]
  const totals = new Map<string, { count: number, bytes: number }>()
  const { nodes, strings } = snapshot
  for (let i = 0; i < nodes.length; i += width) {
    const type = types[nodes[i + typeAt]!]!
    const name = strings[nodes[i + nameAt]!]!
    let key: string
    switch (type) {
      case 'object': key = name; break
      case 'native': key = `(native) ${name.replace(/\s*\/.*$/, '')}`; break
      case 'closure': key = '(closures)'; break
      case 'string': case 'concatenated string': case 'sliced string': key = '(strings)'; break
      case 'code': key = '(code)'; break
      case 'hidden': case 'object shape': case 'array': key = `(${type}) ${name.replace(/\d+/g, 'N').slice(0, 40)}`; break
      default: key = `(${type})`
    }
    const total = totals.get(key) ?? totals.set(key, { count: 0, bytes: 0 }).get(key)!
    total.count++
    total.bytes += nodes[i + sizeAt]!
  }
  return totals
}

function openStream (port: number, runId: string): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1', () => socket.write(`GET /api/events/stream?run_id=${runId} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n`))
    socket.once('data', () => resolve(socket))
    socket.on('data', () => {})
    socket.once('error', reject)
  })
}

/** A long-poll at the tail of `runId`, waiting (resolves once sent: the service's gauge says when all wait). */
function openLongPoll (port: number, runId: string, offset: string): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1', () => {
      socket.write(`GET /api/streams/runs/${runId}?live=long-poll&offset=${offset} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`)
      resolve(socket)
    })
    socket.on('data', () => {})
    socket.once('error', reject)
  })
}

async function waitingLongPolls (port: number): Promise<number> {
  return Number(/^event_long_polls_waiting (\d+)$/m.exec(await (await fetch(`http://127.0.0.1:${port}/metrics`)).text())?.[1])
}

async function main () {
  const admin = new pg.Client({ connectionString: serverUrl })
  await admin.connect()
  await admin.query(`drop database if exists ${DATABASE} with (force)`)
  await admin.query(`create database ${DATABASE}`)
  await migrateToLatest(databaseUrl!)
  const seed = new pg.Client({ connectionString: databaseUrl })
  await seed.connect()
  for (const run of ['bench-run', 'bench-other-run']) await seed.query("insert into runs (run_id, goal, summary, status, created_at, updated_at) values ($1, 'bench', '', 'running', now(), now())", [run])
  await seed.end()
  const port = await freePort()
  const service: ChildProcess = spawn(process.execPath, serviceArgs(args.entry, args['service-flags']), {
    cwd: root,
    env: { ...process.env, DATABASE_URL: databaseUrl, PORT: String(port), HOST: '127.0.0.1', LOG_LEVEL: 'warn', MIGRATE_ON_START: 'false', ...BENCH_SERVICE_ENV, SSE_MAX_STREAMS: '1000000', SSE_MAX_STREAMS_PER_CALLER: '1000000', DURABLE_STREAMS_MAX_LONG_POLLS: '1000000', DURABLE_STREAMS_MAX_LONG_POLLS_PER_CALLER: '1000000' },
    stdio: ['ignore', 'inherit', 'inherit', 'ipc']
  })
  for (let attempt = 0; ; attempt++) {
    try { if ((await fetch(`http://127.0.0.1:${port}/health`)).ok) break } catch {}
    if (attempt > 200) throw new Error('the service did not start')
    await sleep(100)
  }
  await sleep(2000)
  const snapshotOf = async (name: string) => {
    const path = join(tmpdir(), `ocp-heap-${process.pid}-${name}.heapsnapshot`)
    await ask(service, 'snapshot', { path })
    const totals = aggregate(path)
    rmSync(path)
    return totals
  }
  // Resident memory first (a heap snapshot leaves native memory behind), then the snapshots:
  // with the streams open, and once they have closed (what the first ones compiled and
  // grew, once, is in both: the difference is the streams').
  const read = async () => ({ rss: await medianRssKb(service.pid!), report: await ask(service, 'report') })
  const before = await read()
  await ask(service, 'gc')
  const beforeForced = { rss: rssKb(service.pid!), report: await ask(service, 'report') }

  const sockets: Socket[] = []
  const tail = longPoll ? (await fetch(`http://127.0.0.1:${port}/api/streams/events?offset=now`)).headers.get('stream-next-offset')! : ''
  for (let opened = 0; opened < streams; opened += 250) {
    sockets.push(...await Promise.all(Array.from({ length: Math.min(250, streams - opened) }, (_, i) => {
      const run = (opened + i) % 2 === 0 ? 'bench-run' : 'bench-other-run'
      return longPoll ? openLongPoll(port, run, tail) : openStream(port, run)
    })))
  }
  if (longPoll) {
    for (const deadline = Date.now() + 30_000; Date.now() < deadline && await waitingLongPolls(port) < streams; await sleep(200));
  }
  await sleep(1000)
  const after = await read()
  await ask(service, 'gc')
  const afterForced = { rss: rssKb(service.pid!), report: await ask<ProbeReport>(service, 'report') }
  const fullHeap = await snapshotOf('open')
  for (const socket of sockets) socket.destroy()
  await sleep(2000)
  const emptyHeap = await snapshotOf('closed')

  console.log(`node ${afterForced.report.node}, service flags: ${args['service-flags'] ?? startFlags()}; ${streams} ${longPoll ? 'Durable Streams long-polls waiting' : 'idle streams'} (half on a run, half on another)`)
  console.log(`no forced GC:  per stream ${breakdown(before.report, before.rss.median, after.report, after.rss.median, streams)}`)
  console.log(`after full GC: per stream ${breakdown(beforeForced.report, beforeForced.rss, afterForced.report, afterForced.rss, streams)}`)
  const rows = [...new Set([...emptyHeap.keys(), ...fullHeap.keys()])].map((key) => {
    const [a, b] = [emptyHeap.get(key) ?? { count: 0, bytes: 0 }, fullHeap.get(key) ?? { count: 0, bytes: 0 }]
    return { key, count: (b.count - a.count) / streams, bytes: (b.bytes - a.bytes) / streams }
  }).sort((x, y) => y.bytes - x.bytes)
  const total = rows.reduce((sum, row) => sum + row.bytes, 0)
  console.log(`live heap objects per ${longPoll ? 'waiter' : 'stream'} (heap snapshot difference): ${(total / 1024).toFixed(2)} kB; the largest:`)
  console.log('   bytes  objects  what')
  for (const row of rows.slice(0, Number(args.top))) console.log(`${row.bytes.toFixed(0).padStart(8)}  ${row.count.toFixed(2).padStart(7)}  ${row.key}`)

  service.kill('SIGTERM')
  await new Promise((resolve) => service.once('exit', resolve))
  await admin.query(`drop database if exists ${DATABASE} with (force)`)
  await admin.end()
}

main().catch((err: unknown) => {
  console.error(err)
  process.exit(1)
})
