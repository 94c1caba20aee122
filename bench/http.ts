/*
 * The read endpoints under HTTP load, against the two floors that bound
 * them, at one or two scales (BENCHMARKS.md, "HTTP reads").
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm run bench:http -- --scale both
 *   ... npm run bench:http -- --scale small --seconds 10 --connections 10
 *   ... npm run bench:http -- --scale small --seconds 1 --rounds 1 --warmup 0 --only health,run10   (CI's smoke run: figures not meaningful)
 *
 * For each scale: generates its database when missing (bench/generate.ts),
 * rewrites bench/sql/*.sql from the service's own statements
 * (bench/sql.ts), builds and starts the service (node dist/server.js,
 * LOG_LEVEL warn unless --log-level says info, its log to a file) and a bare node:http server answering
 * /health's body, checks every body (status 200, valid against the route's
 * TypeBox schema, the expected sizes, and byte for byte what its bench/sql
 * statement returns), then, on loopback with the same number of
 * connections: wrk (Debian's, when installed; else autocannon, or as
 * --client says) against the bare servers, Fastify alone and getHealth, in
 * alternating rounds; then for each read, the same against it alternating
 * with pgbench -M prepared running its statement with as many clients
 * (alternating, so that a change of the machine's load meanwhile falls on
 * both sides of a ratio); the run detail also against its statement
 * without the event cursor, the body alone (bench/sql/run-detail-body.sql),
 * and once more spread over 64 runs of 10 tasks (run10-spread): every
 * request to one address lets identical reads arriving together share a
 * statement (db/statement.ts), so the share of reads that did is printed,
 * and the spread read, where none can, shows what each read costs alone.
 * Everything is warmed up first. Prints requests per
 * second, p50 and p99 latency, CPU per request, the ratio to getHealth of
 * this very process, the ratio to the statement alone in Postgres, and,
 * with both scales, the growth of p50 from small to large.
 */
import autocannon from 'autocannon'
import { Ajv2019 } from 'ajv/dist/2019.js'
import addFormats from 'ajv-formats'
import { spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { closeSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { connect } from 'node:net'
import { cpus, tmpdir } from 'node:os'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import pg from 'pg'
import { responseSchemas } from '../schemas/api.ts'
import { resourceSchemas } from '../schemas/resources.ts'
import { adminUrl, defaultDatabaseFor, formatInt, freePort, gitDescription, isScaleName, root, SCALES, sleep, untilAnswering, withDatabase, type Marker, type ScaleName, type Targets } from './common.ts'
import { generate } from './generate.ts'
import { readFloorStatement, SQL_DIR, STATEMENTS, writeFloorStatements } from './sql.ts'

const { values: args } = parseArgs({
  options: {
    scale: { type: 'string', default: 'small' },
    seconds: { type: 'string', default: '10' },
    warmup: { type: 'string', default: '2' },
    connections: { type: 'string', default: '10' },
    'pgbench-jobs': { type: 'string', default: '2' },
    only: { type: 'string' },
    'no-build': { type: 'boolean', default: false },
    'cpu-prof': { type: 'string' },
    'pool-max': { type: 'string' },
    pipelined: { type: 'string' },
    rounds: { type: 'string', default: '3' },
    client: { type: 'string' },
    'log-level': { type: 'string', default: 'warn' }
  }
})
const USAGE = 'usage: npm run bench:http -- [--scale small|large|both] [--seconds N] [--rounds N] [--warmup N] [--client wrk|autocannon] [--connections N] [--pgbench-jobs N] [--only bare,bare-headers,fastify,health,runs,run10,run10-spread,run10-304,run200,blocked,thread] [--no-build] [--cpu-prof DIR] [--pool-max N] [--pipelined N] [--log-level warn|info]'
const scales = args.scale === 'both' ? ['small', 'large'] : [args.scale]
const seconds = Number(args.seconds)
const warmup = Number(args.warmup)
const connections = Number(args.connections)
const pgbenchJobs = Number(args['pgbench-jobs'])
const rounds = Number(args.rounds)
/** Each measurement is taken in `rounds` stretches of this many seconds (pgbench counts whole seconds). */
const roundSeconds = Math.max(1, Math.round(seconds / rounds))
/** The HTTP load generator: wrk (C, Debian's) when installed, as light on the shared cores as pgbench is; else autocannon. */
const client = args.client ?? (spawnSync('wrk', ['--version']).error === undefined ? 'wrk' : 'autocannon')
const logLevel = args['log-level']
if (!scales.every(isScaleName) || !['wrk', 'autocannon'].includes(client) || !['warn', 'info'].includes(logLevel) ||
    ![seconds, connections, pgbenchJobs, rounds].every((n) => Number.isInteger(n) && n >= 1) || !(Number.isInteger(warmup) && warmup >= 0)) {
  console.error(USAGE)
  process.exit(2)
}

// ---- what is measured -------------------------------------------------------

interface FloorScript { file: string, variables: (targets: Targets) => Record<string, string> }

interface Endpoint {
  key: string
  label: string
  path: (targets: Targets) => string
  /** The response schema its body must match ($id), for the bare server none. */
  schema?: string
  /** Checks the body's size, beyond its schema: the same shape at every scale. */
  check?: (body: any) => string | undefined
  /** The floor statement (bench/sql) and its variables; bodyAlone, the same without the event cursor (also measured). */
  floor?: FloorScript & { bodyAlone?: FloorScript }
  /** Whether the issue sets the database-floor target (0.5) for it. */
  floorTarget?: boolean
  /** A conditional GET of the endpoint with this key, sending its ETag in If-None-Match: measured in its rounds, answered 304. */
  revalidates?: string
  /**
   * Spread over SPREAD_RUNS runs with as many tasks as this target's, each
   * request the next of them (wrk) and each transaction one of them at random
   * (pgbench): no two requests in flight together ask for the same run, so
   * none shares another's statement (db/statement.ts) and each pays its own.
   */
  spread?: keyof Targets
}

/** How many runs a spread endpoint goes round. */
const SPREAD_RUNS = 64

/** Byte counts of a spread endpoint's runs (or the one of another endpoint), as one figure: their mean. */
const meanOf = (sizes: number[]) => Math.round(sizes.reduce((sum, size) => sum + size, 0) / sizes.length)

const runDetailFloor = (run: keyof Targets) => {
  const variables = (targets: Targets) => ({ ...STATEMENTS.getRunDetail!.variables(targets), run_id: targets[run] })
  return { file: STATEMENTS.getRunDetail!.file, variables, bodyAlone: { file: STATEMENTS.getRunDetail!.bodyAlone!, variables } }
}

const ENDPOINTS: Endpoint[] = [
  { key: 'bare', label: 'bare node:http, same body as /health', path: () => '/health' },
  { key: 'bare-headers', label: 'bare node:http, same body and headers', path: () => '/health' },
  { key: 'fastify', label: 'Fastify alone (no plugins, no logger)', path: () => '/health' },
  { key: 'health', label: 'getHealth', path: () => '/health', schema: 'Health' },
  {
    key: 'runs',
    label: 'listRuns (default page, 1,000 runs)',
    path: () => '/api/runs',
    schema: 'RunList',
    check: (body) => body.runs.length === 1000 ? undefined : `${body.runs.length} runs, expected 1000`,
    floor: { file: STATEMENTS.listRuns!.file, variables: STATEMENTS.listRuns!.variables },
    floorTarget: true
  },
  {
    key: 'run10',
    label: 'getRunDetail (10 tasks)',
    path: (targets) => `/api/runs/${targets.run10}`,
    schema: 'RunDetailEnvelope',
    check: (body) => body.run.tasks.length === 10 && body.run.blocked_tasks.length === 2 ? undefined : 'expected 10 tasks, 2 blocked',
    floor: runDetailFloor('run10'),
    floorTarget: true
  },
  {
    key: 'run10-spread',
    label: `getRunDetail (10 tasks), ${SPREAD_RUNS} runs in turn`,
    path: (targets) => `/api/runs/${targets.run10}`,
    schema: 'RunDetailEnvelope',
    check: (body) => body.run.tasks.length === 10 ? undefined : 'expected 10 tasks',
    floor: runDetailFloor('run10'),
    floorTarget: true,
    spread: 'run10'
  },
  {
    key: 'run10-304',
    label: 'getRunDetail (10 tasks), If-None-Match: 304',
    path: (targets) => `/api/runs/${targets.run10}`,
    revalidates: 'run10'
  },
  {
    key: 'run200',
    label: 'getRunDetail (200 tasks)',
    path: (targets) => `/api/runs/${targets.run200}`,
    schema: 'RunDetailEnvelope',
    check: (body) => body.run.tasks.length === 200 && body.run.blocked_tasks.length === 10 ? undefined : 'expected 200 tasks, 10 blocked',
    floor: runDetailFloor('run200'),
    floorTarget: true
  },
  {
    key: 'blocked',
    label: 'listBlockedTasks (10 of 200 tasks)',
    path: (targets) => `/api/runs/${targets.run200}/blocked`,
    schema: 'BlockedTaskList',
    check: (body) => body.blocked.length === 10 ? undefined : 'expected 10 blocked tasks',
    floor: { file: STATEMENTS.listBlockedTasks!.file, variables: STATEMENTS.listBlockedTasks!.variables }
  },
  {
    key: 'thread',
    label: 'getThreadDetail (200 messages)',
    path: (targets) => `/api/threads/${encodeURIComponent(targets.thread200)}`,
    schema: 'ThreadDetailEnvelope',
    check: (body) => body.thread.messages.length === 200 ? undefined : 'expected 200 messages',
    floor: { file: STATEMENTS.getThreadDetail!.file, variables: STATEMENTS.getThreadDetail!.variables },
    floorTarget: true
  }
]
/** The HTTP floors and getHealth, measured together. */
const FRAMEWORK = new Set(['bare', 'bare-headers', 'fastify', 'health'])

const only = args.only === undefined ? undefined : new Set(args.only.split(','))
if (only !== undefined && !Array.from(only).every((key) => ENDPOINTS.some((endpoint) => endpoint.key === key))) {
  console.error(USAGE)
  process.exit(2)
}
// A spread read needs wrk's scripts: asked for by name, it is an error without wrk; otherwise it is left out, and said so.
const spreadWithoutWrk = client === 'wrk' ? [] : ENDPOINTS.filter((endpoint) => endpoint.spread !== undefined && (only === undefined || only.has(endpoint.key)))
if (only !== undefined && spreadWithoutWrk.length > 0) {
  console.error(`${spreadWithoutWrk.map((endpoint) => endpoint.key).join(', ')}: needs wrk (Debian's wrk package)`)
  process.exit(2)
}
if (spreadWithoutWrk.length > 0) console.log(`bench: no wrk, so ${spreadWithoutWrk.map((endpoint) => endpoint.key).join(', ')} is left out (it needs wrk's scripts)`)
const measured = ENDPOINTS.filter((endpoint) => (only === undefined || only.has(endpoint.key)) && !spreadWithoutWrk.includes(endpoint))

const ajv = new Ajv2019({ allErrors: true, strict: false })
addFormats.default(ajv)
for (const schema of [...resourceSchemas, ...responseSchemas]) ajv.addSchema(schema)

// ---- processes ----------------------------------------------------------------

/** The floor of the HTTP stack: node:http answering /health's body, with only the headers it needs, or (BARE_HEADERS) with the service's too. */
const BARE_SERVER = `
const body = JSON.stringify({ status: 'ok' })
const headers = { ...JSON.parse(process.env.BARE_HEADERS || '{}'), 'content-type': 'application/json; charset=utf-8', 'content-length': Buffer.byteLength(body) }
require('node:http').createServer((req, res) => {
  res.writeHead(200, headers)
  res.end(body)
}).listen(Number(process.env.PORT), '127.0.0.1')`

/** Fastify itself, the same version, with nothing registered but the route (for reading the framework floor). */
const BARE_FASTIFY = `
import Fastify from 'fastify'
const app = Fastify({ logger: false })
const schema = { response: { 200: { type: 'object', properties: { status: { type: 'string' } }, required: ['status'] } } }
app.get('/health', { schema }, async () => ({ status: 'ok' }))
await app.listen({ host: '127.0.0.1', port: Number(process.env.PORT) })`

/** The headers of the service's /health response that a bare server can repeat (the request id included, as a constant). */
async function serviceHeaders (port: number): Promise<Record<string, string>> {
  const res = await fetch(`http://127.0.0.1:${port}/health`)
  await res.arrayBuffer()
  const own = new Set(['date', 'connection', 'keep-alive', 'content-length', 'content-type', 'transfer-encoding'])
  return Object.fromEntries([...res.headers].filter(([name]) => !own.has(name)))
}

async function stop (child: ChildProcess): Promise<void> {
  if (child.exitCode !== null) return
  const exited = new Promise((resolve) => child.once('exit', resolve))
  child.kill('SIGTERM')
  await Promise.race([exited, sleep(15_000)])
  if (child.exitCode === null) child.kill('SIGKILL')
}

/** CPU time (user + system) of a process so far, in seconds, from /proc. */
function processCpuSeconds (pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ')
  return (Number(fields[11]) + Number(fields[12])) / 100
}

/** Busy and total jiffies of the whole machine, from /proc/stat. */
function machineJiffies (): { busy: number, total: number } {
  const values = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1).map(Number)
  const total = values.reduce((sum, n) => sum + n, 0)
  const idle = values[3]! + values[4]!
  return { busy: total - idle, total }
}

/** CPU used from now until the returned function is called: seconds of the process `pid` and of this one, jiffies of the machine. */
function cpuMeter (pid?: number) {
  const machine = machineJiffies()
  const client = process.cpuUsage()
  const service = pid === undefined ? 0 : processCpuSeconds(pid)
  return () => {
    const machineNow = machineJiffies()
    const clientNow = process.cpuUsage(client)
    return {
      serviceCpu: pid === undefined ? 0 : processCpuSeconds(pid) - service,
      clientCpu: (clientNow.user + clientNow.system) / 1e6,
      machineBusy: machineNow.busy - machine.busy,
      machineTotal: machineNow.total - machine.total
    }
  }
}

const percentile = (sorted: Float64Array | number[], p: number) =>
  sorted.length === 0 ? Number.NaN : sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * p))]!

// ---- measurements ---------------------------------------------------------------

/** What one stretch of load measured. */
interface Sample {
  /** Requests answered 200 (or pgbench transactions). */
  count: number
  seconds: number
  /** In ms, one per request (autocannon, pgbench), or none and `percentiles` (wrk). */
  latencies: Float64Array
  percentiles?: { p50: number, p99: number }
  failures: number
  serviceCpu: number
  clientCpu: number
  machineBusy: number
  machineTotal: number
}

interface Measurement {
  rps: number
  p50: number
  p99: number
  failures: number
  /** In cores (service, client) and as a fraction of the machine. */
  cpu: { service: number, client: number, machine: number }
}

/** The stretches of one measurement, taken in rounds alternating with others, as one figure. */
function combine (samples: Sample[]): Measurement {
  const sum = (pick: (sample: Sample) => number) => samples.reduce((total, sample) => total + pick(sample), 0)
  const latencies = new Float64Array(sum((sample) => sample.latencies.length))
  let at = 0
  for (const sample of samples) { latencies.set(sample.latencies, at); at += sample.latencies.length }
  latencies.sort()
  const seconds = sum((sample) => sample.seconds)
  const count = sum((sample) => sample.count)
  // wrk reports percentiles, not latencies: those of the rounds are averaged, weighted by their requests.
  const weighted = (pick: (p: { p50: number, p99: number }) => number) => sum((sample) => sample.percentiles === undefined ? 0 : pick(sample.percentiles) * sample.count) / count
  const exact = samples.every((sample) => sample.percentiles === undefined)
  return {
    rps: count / seconds,
    p50: exact ? percentile(latencies, 0.5) : weighted((p) => p.p50),
    p99: exact ? percentile(latencies, 0.99) : weighted((p) => p.p99),
    failures: sum((sample) => sample.failures),
    cpu: {
      service: sum((sample) => sample.serviceCpu) / seconds,
      client: sum((sample) => sample.clientCpu) / seconds,
      machine: sum((sample) => sample.machineBusy) / sum((sample) => sample.machineTotal)
    }
  }
}

/** autocannon against `url` for `duration` seconds; latencies are kept exactly (autocannon's own histogram rounds to 1 ms). */
function autocannonRun (url: string, duration: number, pid?: number, headers: Record<string, string> = {}): Promise<Sample> {
  return new Promise((resolve, reject) => {
    let latencies = new Float64Array(1 << 16)
    let count = 0
    let failures = 0
    const meter = cpuMeter(pid)
    const started = process.hrtime.bigint()
    const instance = autocannon({ url, connections, duration, pipelining: 1, headers }, (err, result) => {
      if (err !== null && err !== undefined) { reject(err); return }
      const seconds = Number(process.hrtime.bigint() - started) / 1e9
      resolve({ count, seconds, latencies: latencies.subarray(0, count), failures: failures + result.errors, ...meter() })
    })
    instance.on('response', (_client, statusCode, _bytes, responseTime) => {
      if (statusCode !== 200 && statusCode !== 304) { failures++; return }
      if (count === latencies.length) {
        const grown = new Float64Array(latencies.length * 2)
        grown.set(latencies)
        latencies = grown
      }
      latencies[count++] = responseTime
    })
  })
}

/** CPU seconds of this process's children that have ended (wrk), from /proc. */
function childrenCpuSeconds (): number {
  const fields = readFileSync('/proc/self/stat', 'utf8').split(') ')[1]!.split(' ')
  return (Number(fields[13]) + Number(fields[14])) / 100
}

/** wrk (one thread) against `url` for `duration` seconds, with its latency percentiles. */
async function wrkRun (url: string, duration: number, pid?: number, headers: Record<string, string> = {}, script?: string): Promise<Sample> {
  const meter = cpuMeter(pid)
  const clientBefore = childrenCpuSeconds()
  const output = await new Promise<string>((resolve, reject) => {
    const headerArgs = Object.entries(headers).flatMap(([name, value]) => ['-H', `${name}: ${value}`])
    const scriptArgs = script === undefined ? [] : ['-s', script]
    const child = spawn('wrk', ['-t', '1', '-c', String(connections), '-d', `${duration}s`, '--latency', ...headerArgs, ...scriptArgs, url], { stdio: ['ignore', 'pipe', 'pipe'] })
    let text = ''
    child.stdout.on('data', (chunk) => { text += chunk })
    child.stderr.on('data', (chunk) => { text += chunk })
    child.on('error', reject)
    child.on('exit', (code) => code === 0 ? resolve(text) : reject(new Error(`wrk failed (${code}):\n${text}`)))
  })
  const cpu = meter()
  const ms = (value: string, unit: string) => Number(value) * ({ us: 0.001, ms: 1, s: 1000 } as Record<string, number>)[unit]!
  const quantile = (p: string) => {
    const match = new RegExp(`^\\s*${p}%\\s+([\\d.]+)(us|ms|s)\\s*$`, 'm').exec(output)
    if (match === null) throw new Error(`wrk: no ${p}% latency in its output:\n${output}`)
    return ms(match[1]!, match[2]!)
  }
  const total = /(\d+) requests in ([\d.]+)(us|ms|s),/.exec(output)
  if (total === null) throw new Error(`wrk: no request count in its output:\n${output}`)
  const non2xx = Number(/Non-2xx or 3xx responses: (\d+)/.exec(output)?.[1] ?? 0)
  const errors = /Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/.exec(output)
  const failures = non2xx + (errors === null ? 0 : errors.slice(1).reduce((n, value) => n + Number(value), 0))
  return {
    count: Number(total[1]) - non2xx,
    seconds: ms(total[2]!, total[3]!) / 1000,
    latencies: new Float64Array(0),
    percentiles: { p50: quantile('50'), p99: quantile('99') },
    failures,
    ...cpu,
    clientCpu: childrenCpuSeconds() - clientBefore
  }
}

/** The HTTP load of one stretch, with the chosen client. */
const httpRun = (url: string, duration: number, pid?: number, headers?: Record<string, string>) =>
  client === 'wrk' ? wrkRun(url, duration, pid, headers) : autocannonRun(url, duration, pid, headers)

/** A wrk script asking for each of `paths` in turn, one request after another. */
function roundRobinScript (dir: string, paths: string[]): string {
  const file = join(dir, 'round-robin.lua')
  writeFileSync(file, `local paths = { ${paths.map((path) => JSON.stringify(path)).join(', ')} }
local next = 0
request = function ()
  next = next % #paths + 1
  return wrk.format("GET", paths[next])
end
`)
  return file
}

/**
 * The floor statement over the runs of a spread endpoint, as one script: each
 * transaction draws one of them at random (\\set), and the statement picks
 * its id from their list by that parameter, so it stays one prepared
 * statement per connection, as the service's is.
 */
function spreadFloorFile (dir: string, floor: FloorScript, runs: string[]): string {
  const text = readFileSync(join(SQL_DIR, floor.file), 'utf8')
  if (!text.includes(':run_id')) throw new Error(`bench/sql/${floor.file}: no :run_id to spread`)
  const list = `(array[${runs.map((run) => `'${run.replaceAll("'", "''")}'`).join(', ')}]::text[])[:spread_run]`
  const file = join(dir, floor.file)
  writeFileSync(file, `\\set spread_run random(1, ${runs.length})\n${text.replaceAll(':run_id', list)}`)
  return file
}

/** Bytes on the wire of one answer (status line, headers and body, uncompressed, as the load generators ask), over a raw socket. */
function wireBytes (url: string, headers: Record<string, string> = {}): Promise<number> {
  const { hostname, port, pathname, search } = new URL(url)
  return new Promise((resolve, reject) => {
    let bytes = 0
    const socket = connect(Number(port), hostname, () => {
      socket.write(`GET ${pathname}${search} HTTP/1.1\r\nHost: ${hostname}:${port}\r\nConnection: close\r\n` +
        Object.entries(headers).map(([name, value]) => `${name}: ${value}\r\n`).join('') + '\r\n')
    })
    socket.on('data', (chunk) => { bytes += chunk.length })
    socket.on('end', () => resolve(bytes))
    socket.on('error', reject)
  })
}

function pgbenchArgs (url: string, floor: FloorScript, targets: Targets, duration: number, file = join(SQL_DIR, floor.file)): string[] {
  const parsed = new URL(url)
  const variables = floor.variables(targets)
  return [
    '-n', '-M', 'prepared', '-c', String(connections), '-j', String(pgbenchJobs), '-T', String(duration),
    '-f', file,
    ...Object.entries(variables).flatMap(([name, value]) => ['-D', `${name}=${value}`]),
    '-h', parsed.hostname, '-p', parsed.port || '5432', '-U', decodeURIComponent(parsed.username || 'postgres'),
    parsed.pathname.slice(1)
  ]
}

function pgbenchEnv (url: string): NodeJS.ProcessEnv {
  const password = decodeURIComponent(new URL(url).password)
  return password === '' ? process.env : { ...process.env, PGPASSWORD: password }
}

/** pgbench -M prepared running the floor statement (or `file`, a spread one); latencies from its per-transaction log. */
async function pgbenchRun (url: string, floor: FloorScript, targets: Targets, duration: number, file?: string): Promise<Sample> {
  const logDir = mkdtempSync(join(tmpdir(), 'ocp-bench-pgbench-'))
  try {
    const meter = cpuMeter()
    const output = await new Promise<string>((resolve, reject) => {
      const child = spawn('pgbench', [...pgbenchArgs(url, floor, targets, duration, file), '--log', `--log-prefix=${join(logDir, 'tx')}`],
        { env: pgbenchEnv(url), stdio: ['ignore', 'pipe', 'pipe'] })
      let text = ''
      child.stdout.on('data', (chunk) => { text += chunk })
      child.stderr.on('data', (chunk) => { text += chunk })
      child.on('error', reject)
      child.on('exit', (code) => code === 0 ? resolve(text) : reject(new Error(`pgbench failed (${code}):\n${text}`)))
    })
    const cpu = meter()
    const tps = /tps = ([\d.]+) \(without initial connection time\)/.exec(output)
    const failed = /number of failed transactions: (\d+)/.exec(output)
    if (tps === null) throw new Error(`pgbench: no tps in its output:\n${output}`)
    const latencies: number[] = []
    for (const file of readdirSync(logDir)) {
      for (const line of readFileSync(join(logDir, file), 'utf8').split('\n')) {
        const latencyUs = line.split(' ')[2]
        if (latencyUs !== undefined) latencies.push(Number(latencyUs) / 1000)
      }
    }
    // Its rate as pgbench reports it (connection time excluded), over the run's duration.
    return { count: Number(tps[1]) * duration, seconds: duration, latencies: Float64Array.from(latencies), failures: Number(failed?.[1] ?? 0), ...cpu, serviceCpu: 0, clientCpu: 0 }
  } finally {
    rmSync(logDir, { recursive: true, force: true })
  }
}

/** The body the floor statement returns, run once through pg with its variables as parameters. */
async function floorBody (url: string, floor: FloorScript, targets: Targets): Promise<string> {
  const { text, values } = readFloorStatement(floor.file, floor.variables(targets))
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    return (await client.query(text, values)).rows[0].body as string
  } finally {
    await client.end()
  }
}

/** The first SPREAD_RUNS runs (by id) with as many tasks as `run`. */
async function runsLike (url: string, run: string): Promise<string[]> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    const { rows } = await client.query<{ run_id: string }>(
      `select run_id from tasks group by run_id
        having count(*) = (select count(*) from tasks where run_id = $1) order by run_id limit $2`, [run, SPREAD_RUNS])
    if (rows.length < SPREAD_RUNS) throw new Error(`only ${rows.length} runs with as many tasks as ${run}, ${SPREAD_RUNS} wanted`)
    return rows.map((row) => row.run_id)
  } finally {
    await client.end()
  }
}

/** The service's reads so far: those that ran their own statement and those that shared one (db_reads_total). */
async function readsOf (servicePort: number): Promise<{ own: number, shared: number }> {
  const text = await (await fetch(`http://127.0.0.1:${servicePort}/metrics`)).text()
  const count = (statement: string) => Number(new RegExp(`^db_reads_total\\{statement="${statement}"\\} (\\d+)$`, 'm').exec(text)?.[1] ?? NaN)
  return { own: count('own'), shared: count('shared') }
}

// ---- one scale ---------------------------------------------------------------------

interface Row {
  endpoint: Endpoint
  bytes: number
  /** Bytes on the wire of one answer: status line, headers, body. */
  wire: number
  http: Measurement
  floor?: Measurement
  /** pgbench of the floor statement without the event cursor. */
  bodyAlone?: Measurement
  /** The share of the service's reads in its rounds (and those of its revalidation) that shared another's statement. */
  sharedReads?: number
}

async function benchScale (scale: ScaleName): Promise<{ marker: Marker, rows: Row[] }> {
  const database = defaultDatabaseFor(scale)
  const url = withDatabase(adminUrl(), database)
  const marker = await generate({ scale, database, seed: 1, force: false })
  const changed = await writeFloorStatements(marker.targets)
  if (changed.length > 0) console.log(`bench/sql: rewritten from the service's SQL (commit them): ${changed.join(', ')}`)

  const [servicePort, barePort, bareHeadersPort, fastifyPort] = [await freePort(), await freePort(), await freePort(), await freePort()]
  const logFile = join(tmpdir(), `ocp-bench-http-${scale}.log`)
  const logFd = openSync(logFile, 'w')
  const cpuProf = args['cpu-prof'] === undefined ? [] : ['--cpu-prof', '--cpu-prof-dir', args['cpu-prof']]
  const service = spawn(process.execPath, [...cpuProf, join(root, 'dist/server.js')], {
    cwd: root,
    env: {
      ...process.env,
      DATABASE_URL: url,
      HOST: '127.0.0.1',
      PORT: String(servicePort),
      LOG_LEVEL: logLevel,
      LOG_FORMAT: 'json',
      MIGRATE_ON_START: 'false',
      ...(args['pool-max'] === undefined ? {} : { DB_POOL_MAX: args['pool-max'] }),
      ...(args.pipelined === undefined ? {} : { DB_PIPELINED_CONNECTIONS: args.pipelined })
    },
    stdio: ['ignore', logFd, 'inherit']
  })
  const bare = spawn(process.execPath, ['-e', BARE_SERVER], { env: { ...process.env, PORT: String(barePort) }, stdio: ['ignore', 'inherit', 'inherit'] })
  const fastify = spawn(process.execPath, ['--input-type=module', '-e', BARE_FASTIFY], { cwd: root, env: { ...process.env, PORT: String(fastifyPort) }, stdio: ['ignore', 'inherit', 'inherit'] })
  let bareHeaders: ChildProcess | undefined
  const rows: Row[] = []
  const spreadDir = mkdtempSync(join(tmpdir(), 'ocp-bench-spread-'))
  try {
    await untilAnswering(service, `http://127.0.0.1:${servicePort}/health`, 'the service')
    await untilAnswering(bare, `http://127.0.0.1:${barePort}/health`, 'the bare node:http server')
    await untilAnswering(fastify, `http://127.0.0.1:${fastifyPort}/health`, 'Fastify alone')
    bareHeaders = spawn(process.execPath, ['-e', BARE_SERVER], {
      env: { ...process.env, PORT: String(bareHeadersPort), BARE_HEADERS: JSON.stringify(await serviceHeaders(servicePort)) },
      stdio: ['ignore', 'inherit', 'inherit']
    })
    await untilAnswering(bareHeaders, `http://127.0.0.1:${bareHeadersPort}/health`, 'the bare node:http server with headers')
    const ports: Record<string, number> = { bare: barePort, 'bare-headers': bareHeadersPort, fastify: fastifyPort }
    const pids: Record<string, number | undefined> = { bare: bare.pid, 'bare-headers': bareHeaders.pid, fastify: fastify.pid }
    console.log(`\nscale ${scale}: ${database}, ${Object.entries(marker.counts).map(([table, n]) => `${formatInt(n)} ${table}`).join(', ')}; service log in ${logFile}`)

    const urlOf = (endpoint: Endpoint, targets = marker.targets) => `http://127.0.0.1:${ports[endpoint.key] ?? servicePort}${endpoint.path(targets)}`
    /** The targets each endpoint is read with: the bench's, or for a spread endpoint one variant per run it goes round. */
    const variants = new Map<string, Targets[]>()
    for (const endpoint of measured) {
      const spread = endpoint.spread
      variants.set(endpoint.key, spread === undefined
        ? [marker.targets]
        : (await runsLike(url, marker.targets[spread])).map((run) => ({ ...marker.targets, [spread]: run })))
    }
    const pidOf = (endpoint: Endpoint) => endpoint.key in pids ? pids[endpoint.key] : service.pid
    const bytes = new Map<string, number>()
    /** The headers each endpoint is requested with: a revalidation sends the tag of the body it revalidates. */
    const requestHeaders = new Map<string, Record<string, string>>()
    for (const endpoint of measured) {
      if (endpoint.revalidates !== undefined) {
        const tag = (await fetch(urlOf(endpoint))).headers.get('etag')
        const headers = { 'If-None-Match': tag ?? '' }
        const res = await fetch(urlOf(endpoint), { headers })
        if (tag === null || res.status !== 304 || (await res.text()) !== '') throw new Error(`${endpoint.label}: expected a tag and 304 with no body, got ${tag} and ${res.status}`)
        requestHeaders.set(endpoint.key, headers)
        bytes.set(endpoint.key, 0)
        continue
      }
      // Every body first: it must be right before its speed means anything.
      const sizes: number[] = []
      for (const targets of variants.get(endpoint.key)!) {
        const res = await fetch(urlOf(endpoint, targets))
        const text = await res.text()
        if (res.status !== 200) throw new Error(`${endpoint.label}: ${urlOf(endpoint, targets)} answered ${res.status}: ${text.slice(0, 300)}`)
        const body = JSON.parse(text)
        if (endpoint.schema !== undefined) {
          const validate = ajv.getSchema(endpoint.schema)!
          if (!validate(body)) throw new Error(`${endpoint.label}: the body does not match ${endpoint.schema}: ${JSON.stringify(validate.errors).slice(0, 500)}`)
        }
        const problem = endpoint.check?.(body)
        if (problem !== undefined) throw new Error(`${endpoint.label}: ${problem}`)
        for (const floor of [endpoint.floor, endpoint.floor?.bodyAlone]) {
          if (floor !== undefined && await floorBody(url, floor, targets) !== text) {
            throw new Error(`${endpoint.label}: bench/sql/${floor.file} does not return the body the service sends`)
          }
        }
        sizes.push(Buffer.byteLength(text))
      }
      bytes.set(endpoint.key, meanOf(sizes))
    }
    const wire = new Map<string, number>()
    for (const endpoint of measured) {
      wire.set(endpoint.key, meanOf(await Promise.all(variants.get(endpoint.key)!.map((targets) => wireBytes(urlOf(endpoint, targets), requestHeaders.get(endpoint.key))))))
    }

    // What is compared is measured in alternating rounds, so that a change of the machine's
    // load meanwhile falls on both sides: the HTTP floors with getHealth, each read with its
    // statement in pgbench.
    const groups: Array<Array<{ key: string, run: (duration: number) => Promise<Sample> }>> = []
    const framework = measured.filter((endpoint) => FRAMEWORK.has(endpoint.key))
    if (framework.length > 0) groups.push(framework.map((endpoint) => ({ key: endpoint.key, run: (duration) => httpRun(urlOf(endpoint), duration, pidOf(endpoint)) })))
    for (const endpoint of measured.filter((candidate) => !FRAMEWORK.has(candidate.key) && candidate.revalidates === undefined)) {
      const spread = endpoint.spread
      const spreadTargets = spread === undefined ? undefined : variants.get(endpoint.key)!
      const spreadRuns = spreadTargets?.map((targets) => targets[spread!])
      const script = spreadTargets === undefined ? undefined : roundRobinScript(spreadDir, spreadTargets.map(endpoint.path))
      const members = [{
        key: endpoint.key,
        run: (duration: number) => script === undefined ? httpRun(urlOf(endpoint), duration, service.pid) : wrkRun(urlOf(endpoint), duration, service.pid, {}, script)
      }]
      // Its revalidation, in the same rounds: 304 against 200 of the same read.
      for (const revalidation of measured.filter((candidate) => candidate.revalidates === endpoint.key)) {
        members.push({ key: revalidation.key, run: (duration: number) => httpRun(urlOf(revalidation), duration, service.pid, requestHeaders.get(revalidation.key)) })
      }
      const floor = endpoint.floor
      const spreadFile = (script: FloorScript) => spreadRuns === undefined ? undefined : spreadFloorFile(spreadDir, script, spreadRuns)
      if (floor !== undefined) {
        const file = spreadFile(floor)
        members.push({ key: `${endpoint.key} floor`, run: (duration: number) => pgbenchRun(url, floor, marker.targets, duration, file) })
      }
      const bodyAlone = floor?.bodyAlone
      if (bodyAlone !== undefined) {
        const file = spreadFile(bodyAlone)
        members.push({ key: `${endpoint.key} body alone`, run: (duration: number) => pgbenchRun(url, bodyAlone, marker.targets, duration, file) })
      }
      groups.push(members)
    }
    const samples = new Map<string, Sample[]>()
    for (const group of groups) {
      if (warmup > 0) for (const member of group) await member.run(warmup)
      // The framework's group makes no database read: nothing to count.
      const readsBefore = FRAMEWORK.has(group[0]!.key) ? undefined : await readsOf(servicePort)
      for (let round = 0; round < rounds; round++) {
        for (const member of group) samples.set(member.key, [...(samples.get(member.key) ?? []), await member.run(roundSeconds)])
      }
      for (const member of group) {
        if (member.key.endsWith(' floor') || member.key.endsWith(' body alone')) continue
        const endpoint = measured.find((candidate) => candidate.key === member.key)!
        const http = combine(samples.get(member.key)!)
        const floorSamples = samples.get(`${member.key} floor`)
        const bodyAloneSamples = samples.get(`${member.key} body alone`)
        const row: Row = {
          endpoint,
          bytes: bytes.get(member.key)!,
          wire: wire.get(member.key)!,
          http,
          ...(floorSamples === undefined ? {} : { floor: combine(floorSamples) }),
          ...(bodyAloneSamples === undefined ? {} : { bodyAlone: combine(bodyAloneSamples) })
        }
        rows.push(row)
        if (member === group[0] && readsBefore !== undefined) {
          const reads = await readsOf(servicePort)
          const own = reads.own - readsBefore.own
          const shared = reads.shared - readsBefore.shared
          row.sharedReads = shared / (own + shared)
        }
        const failures = http.failures + (row.floor?.failures ?? 0) + (row.bodyAlone?.failures ?? 0)
        console.log(`  ${endpoint.label.padEnd(38)} ${formatInt(http.rps).padStart(7)} req/s  p50 ${http.p50.toFixed(2)} ms  p99 ${http.p99.toFixed(2)} ms` +
          (row.floor === undefined ? '' : `   pgbench ${formatInt(row.floor.rps).padStart(7)} tps  p50 ${row.floor.p50.toFixed(2)} ms`) +
          (row.bodyAlone === undefined ? '' : `   body alone ${formatInt(row.bodyAlone.rps).padStart(7)} tps`) +
          (row.sharedReads === undefined ? '' : `   sharing a statement ${(row.sharedReads * 100).toFixed(1)} %`) +
          (failures > 0 ? `   FAILURES: ${failures}` : ''))
      }
    }
  } finally {
    await Promise.all([stop(service), stop(bare), stop(fastify), ...(bareHeaders === undefined ? [] : [stop(bareHeaders)])])
    closeSync(logFd)
    rmSync(spreadDir, { recursive: true, force: true })
  }
  return { marker, rows }
}

// ---- report --------------------------------------------------------------------------

const fixed = (n: number, digits = 2) => Number.isNaN(n) ? '' : n.toFixed(digits)
const verdict = (ok: boolean) => ok ? 'met' : '**MISSED**'

function table (header: string[], lines: string[][]): string {
  const align = header.map((_cell, i) => i === 0 ? '---' : '---:')
  return [header, align, ...lines].map((cells) => `| ${cells.join(' | ')} |`).join('\n')
}

function report (scale: ScaleName, rows: Row[]): string[] {
  const byKey = new Map(rows.map((row) => [row.endpoint.key, row]))
  const health = byKey.get('health')
  const bare = byKey.get('bare')
  console.log(`\n### Scale ${scale}: ${formatInt(SCALES[scale].runs)} runs, ${formatInt(SCALES[scale].tasks)} tasks, ${formatInt(SCALES[scale].events)} events\n`)
  console.log(table(
    ['endpoint', 'body bytes', 'wire bytes', 'req/s', 'p50 ms', 'p99 ms', '× getHealth', 'CPU µs/req: service', 'client', 'busy cores', 'pgbench tps', 'pgbench p50 ms', 'busy cores', '× pgbench', 'body alone: tps', '×', 'reads sharing a statement'],
    rows.map(({ endpoint, bytes, wire, http, floor, bodyAlone, sharedReads }) => [
      endpoint.label,
      formatInt(bytes),
      formatInt(wire),
      formatInt(http.rps),
      fixed(http.p50),
      fixed(http.p99),
      health === undefined ? '' : fixed(http.rps / health.http.rps),
      formatInt(http.cpu.service * 1e6 / http.rps),
      formatInt(http.cpu.client * 1e6 / http.rps),
      fixed(http.cpu.machine * cpus().length, 1),
      floor === undefined ? '' : formatInt(floor.rps),
      floor === undefined ? '' : fixed(floor.p50),
      floor === undefined ? '' : fixed(floor.cpu.machine * cpus().length, 1),
      floor === undefined ? '' : fixed(http.rps / floor.rps),
      bodyAlone === undefined ? '' : formatInt(bodyAlone.rps),
      bodyAlone === undefined ? '' : fixed(http.rps / bodyAlone.rps),
      sharedReads === undefined ? '' : `${(sharedReads * 100).toFixed(1)} %`
    ])
  ))
  const targets: string[] = []
  const fastify = byKey.get('fastify')
  if (health !== undefined && fastify !== undefined) {
    const ratio = health.http.rps / fastify.http.rps
    targets.push(`| ${scale} | framework floor: getHealth / Fastify alone, the same body (LOG_LEVEL ${logLevel}) | ${fixed(ratio)} | ≥ 0.80 | ${verdict(ratio >= 0.8)} |`)
  }
  if (health !== undefined && bare !== undefined) {
    targets.push(`| ${scale} | (for reading it) getHealth / bare node:http | ${fixed(health.http.rps / bare.http.rps)} | | |`)
  }
  for (const [key, what] of [['bare-headers', 'bare node:http sending the service\'s headers'], ['fastify', 'Fastify alone']]) {
    const reference = byKey.get(key!)
    if (health !== undefined && bare !== undefined && reference !== undefined) {
      targets.push(`| ${scale} | (for reading it) ${what} / bare node:http; getHealth / ${what} | ${fixed(reference.http.rps / bare.http.rps)}; ${fixed(health.http.rps / reference.http.rps)} | | |`)
    }
  }
  for (const row of rows) {
    const revalidated = rows.find((candidate) => candidate.endpoint.key === row.endpoint.revalidates)
    if (revalidated !== undefined) {
      targets.push(`| ${scale} | (no target) ${row.endpoint.label} against its 200: req/s; bytes on the wire | ${fixed(row.http.rps / revalidated.http.rps)} ×; ${formatInt(row.wire)} against ${formatInt(revalidated.wire)} | | |`)
    }
    if (row.floor === undefined || row.endpoint.floorTarget !== true) continue
    const ratio = row.http.rps / row.floor.rps
    targets.push(`| ${scale} | database floor: ${row.endpoint.label} / pgbench | ${fixed(ratio)} | ≥ 0.50 | ${verdict(ratio >= 0.5)} |`)
    if (row.bodyAlone === undefined) continue
    const bodyRatio = row.http.rps / row.bodyAlone.rps
    targets.push(`| ${scale} | database floor, the body alone: ${row.endpoint.label} / pgbench of its statement without the event cursor | ${fixed(bodyRatio)} | ≥ 0.50 | ${verdict(bodyRatio >= 0.5)} |`)
  }
  const failures = rows.filter((row) => row.http.failures + (row.floor?.failures ?? 0) + (row.bodyAlone?.failures ?? 0) > 0)
  if (failures.length > 0) console.log(`\nWARNING: failed requests or transactions in: ${failures.map((row) => row.endpoint.label).join(', ')}`)
  return targets
}

async function main () {
  const admin = adminUrl()
  if (!args['no-build']) {
    console.log('bench: npm run build')
    const build = spawnSync('npm', ['run', 'build'], { cwd: root, stdio: ['ignore', 'ignore', 'inherit'] })
    if (build.status !== 0) throw new Error('npm run build failed')
  }
  const server = new pg.Client({ connectionString: admin })
  await server.connect()
  const version = (await server.query('show server_version')).rows[0].server_version as string
  await server.end()

  const results = new Map<ScaleName, Row[]>()
  for (const scale of scales as ScaleName[]) results.set(scale, (await benchScale(scale)).rows)

  console.log(`\n## HTTP reads: ${new Date().toISOString().slice(0, 16).replace('T', ' ')} UTC, commit ${gitDescription()}`)
  console.log(`\nMachine: ${cpus().length} × ${cpus()[0]?.model ?? 'unknown CPU'}, Node.js ${process.version}, Postgres ${version} on loopback. ` +
    `The service at LOG_LEVEL ${logLevel}` +
    (args['pool-max'] === undefined ? '' : `, DB_POOL_MAX ${args['pool-max']}`) +
    (args.pipelined === undefined ? '' : `, DB_PIPELINED_CONNECTIONS ${args.pipelined}`) + `. ${connections} connections (${client === 'wrk' ? 'wrk -t 1' : 'autocannon'}) and ${connections} clients (pgbench -M prepared -j ${pgbenchJobs}); each figure over ${rounds} × ${roundSeconds} s, ` +
    `in rounds alternating with what it is compared with (the HTTP floors with getHealth, each read with its statement in pgbench and, for the run detail, that statement without the event cursor), after ${warmup} s of warm-up. ` +
    `CPU µs/req: CPU time per request of the service (or bare server) process and of the load generator (${client}); busy cores: of the whole machine during the measurement.` +
    (client === 'wrk' ? ' Latency percentiles: wrk\'s, averaged over the rounds weighted by requests.' : ' Latencies: every response\'s, from autocannon\'s response events.'))
  const targets: string[] = []
  for (const [scale, rows] of results) targets.push(...report(scale, rows))

  const small = results.get('small')
  const large = results.get('large')
  if (small !== undefined && large !== undefined) {
    console.log('\n### Growth, large / small\n')
    const lines: string[][] = []
    for (const row of large) {
      const before = small.find((candidate) => candidate.endpoint.key === row.endpoint.key)
      if (before === undefined || (FRAMEWORK.has(row.endpoint.key) && row.endpoint.key !== 'health')) continue
      const ratio = row.http.p50 / before.http.p50
      lines.push([row.endpoint.label, fixed(before.http.p50), fixed(row.http.p50), fixed(ratio), formatInt(before.http.rps), formatInt(row.http.rps)])
      targets.push(`| both | growth of p50, large / small: ${row.endpoint.label} | ${fixed(ratio)} | ≤ 1.50 | ${verdict(ratio <= 1.5)} |`)
    }
    console.log(table(['endpoint', 'p50 small ms', 'p50 large ms', 'p50 large / small', 'req/s small', 'req/s large'], lines))
  }
  if (targets.length > 0) {
    console.log('\n### Targets\n')
    console.log(table(['scale', 'target', 'measured', 'target', 'verdict'], targets.map((line) => line.slice(2, -2).split(' | '))))
  }
}

main().catch((err: unknown) => {
  console.error(err)
  process.exit(1)
})
