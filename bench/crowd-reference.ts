/*
 * A crowd of Durable Streams long-pollers on one stream, this service
 * against the protocol's reference server (@durable-streams/server, pinned
 * in package.json), side by side in one run (BENCHMARKS.md, "A crowd
 * against the reference server"). Each server runs as a child process
 * under the same Node as this script, with its defaults (this service's
 * load shedding on); one client process (this one) opens --pollers
 * long-pollers, each looping from the Stream-Next-Offset and Stream-Cursor
 * of its last answer as the official client does, and appends one message
 * every --interval-ms for --seconds: on the reference server a POST, here
 * an orchestrator's INSERT, after a first message that every poller must
 * have (so that each waits on the server, none in its backlog). Prints, for each server, the delivery latency
 * from the moment each append was sent to its arrival at every poller,
 * the 503s the pollers got, and the TCP connections they opened.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm run bench:crowd-reference
 *   ... npm run bench:crowd-reference -- --pollers 1000 --seconds 10
 *   ... npm run bench:crowd-reference -- --quick            (CI's smoke run)
 *   ... npm run bench:crowd-reference -- --only service '--node-args=--cpu-prof --cpu-prof-dir=/tmp/prof'   (with =: a value that starts with a dash)
 *   ... npm run bench:crowd-reference -- --client-cost --rounds 5
 *
 * --client-cost measures the client alone, not the crowd: what one answer
 * of each server costs this client process. Each server's real long-poll
 * answer is captured once, as its bytes went on the wire; then a child
 * process that answers every request with those bytes at once, and does
 * nothing else, serves --pollers pollers looping as the crowd's do, for
 * --seconds / 4 at a time, the two servers' answers in alternating
 * rounds. Once this one client process is saturated (its CPU near the
 * span), a crowd's p99 is how fast it drains a batch of answers, so this
 * says how far either server can move it.
 *
 * The service runs as it ships (npm start's node flags and dist/server.js,
 * built first unless --no-build; --node-args are given to its Node after
 * them, so that a flag there wins). "server CPU" is the
 * CPU time its process used while the appends ran (Linux's /proc); "client
 * CPU" is this process's in the same span, and "span" that span's wall
 * time (the appends' 20 s and a second, or more when this one client
 * process is saturated: then its CPU nears the span).
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { Agent, request, type ClientRequest, type IncomingMessage } from 'node:http'
import { connect, type Socket } from 'node:net'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import pg from 'pg'
import { adminUrl as serverUrl, freePort, migratedDatabase, root, sleep, withDatabase } from './common.ts'
import { startFlags } from './probe.ts'

const { values: args } = parseArgs({
  options: {
    pollers: { type: 'string', default: '5000' },
    seconds: { type: 'string', default: '20' },
    'interval-ms': { type: 'string', default: '200' },
    rounds: { type: 'string', default: '1' },
    quick: { type: 'boolean', default: false },
    'no-build': { type: 'boolean', default: false },
    only: { type: 'string' },
    'client-cost': { type: 'boolean', default: false },
    'node-args': { type: 'string', default: '' }
  }
})
const pollers = args.quick ? 100 : Number(args.pollers)
const seconds = args.quick ? 2 : Number(args.seconds)
const intervalMs = Number(args['interval-ms'])
const rounds = args.quick ? 1 : Number(args.rounds)
const LONG_POLL_MS = 20_000
const DATABASE = 'ocp_bench_crowd_reference'
const RUN = 'crowd'
/** The message appended first, not measured: every poller has it before the measured appends begin. */
const WARM_UP = -1

const adminUrl = serverUrl()
const databaseUrl = withDatabase(adminUrl, DATABASE)
/** CPU seconds a process has used (Linux's /proc; NaN elsewhere): what a server spent on the crowd, beside the latency its clients saw. */
function cpuSeconds (pid: number | undefined): number {
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').replace(/^.*\) /s, '').split(' ')
    return (Number(fields[11]) + Number(fields[12])) / 100
  } catch { return Number.NaN }
}
const percentile = (sorted: number[], p: number) => sorted.length === 0 ? Number.NaN : sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * p))]!

async function until (url: string): Promise<void> {
  for (let attempt = 0; attempt < 300; attempt++) {
    try { if ((await fetch(url)).status < 500) return } catch {}
    await sleep(100)
  }
  throw new Error(`${url} did not answer`)
}

interface Server {
  name: string
  child: ChildProcess
  port: number
  path: string
  /** Appends message `n`. */
  append: (n: number) => Promise<void>
  /** The messages of a 200's body, by their `n`. */
  messages: (body: string) => number[]
  close: () => Promise<void>
}

async function reference (): Promise<Server> {
  const port = await freePort()
  const child = spawn(process.execPath, ['--import', 'tsx', join(root, 'bench/reference-server.ts')], {
    cwd: root, env: { ...process.env, PORT: String(port), LONG_POLL_MS: String(LONG_POLL_MS) }, stdio: ['ignore', 'inherit', 'inherit']
  })
  const path = '/v1/stream/crowd'
  await until(`http://127.0.0.1:${port}/v1/stream/none`)
  await fetch(`http://127.0.0.1:${port}${path}`, { method: 'PUT', headers: { 'content-type': 'application/json' } })
  return {
    name: 'reference server (@durable-streams/server, in memory)',
    child,
    port,
    path,
    append: async (n) => { await fetch(`http://127.0.0.1:${port}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ n }) }) },
    messages: (body) => (JSON.parse(body) as Array<{ n: number }>).map((message) => message.n),
    close: async () => { child.kill('SIGTERM'); await new Promise((resolve) => child.once('exit', resolve)) }
  }
}

async function service (): Promise<Server> {
  await migratedDatabase(DATABASE)
  const writer = new pg.Client({ connectionString: databaseUrl })
  await writer.connect()
  await writer.query("insert into runs (run_id, goal, summary, status) values ($1, 'crowd', '', 'running')", [RUN])
  const port = await freePort()
  // As it ships (the Dockerfile's and `npm start`'s dist/server.js), not through tsx; the crowd, one client, is
  // past a caller's share of long-polls (2,500 by default) and may reach the instance's: admitted, as the reference admits it.
  const child = spawn(process.execPath, [...startFlags().split(/\s+/).filter(Boolean), ...args['node-args'].split(' ').filter(Boolean), join(root, 'dist/server.js')], {
    cwd: root,
    env: { ...process.env, DATABASE_URL: databaseUrl, PORT: String(port), HOST: '127.0.0.1', LOG_LEVEL: 'error', MIGRATE_ON_START: 'false', DURABLE_STREAMS_LONG_POLL_MS: String(LONG_POLL_MS), DURABLE_STREAMS_MAX_LONG_POLLS: '1000000', DURABLE_STREAMS_MAX_LONG_POLLS_PER_CALLER: '1000000' },
    stdio: ['ignore', 'inherit', 'inherit']
  })
  await until(`http://127.0.0.1:${port}/ready`)
  return {
    name: 'this service (Postgres, one replica)',
    child,
    port,
    path: `/api/streams/runs/${RUN}`,
    append: async (n) => { await writer.query("insert into events (event_type, run_id, summary, payload) values ('message', $1, 'crowd', $2)", [RUN, JSON.stringify({ n })]) },
    messages: (body) => (JSON.parse(body) as Array<{ payload: { n: number } }>).map((event) => event.payload.n),
    close: async () => { child.kill('SIGTERM'); await new Promise((resolve) => child.once('exit', resolve)); await writer.end() }
  }
}

/** A poller's own keep-alive agent, as each browser tab or client process has. */
const pollerAgent = () => new Agent({ keepAlive: true, maxSockets: 1 })

/**
 * One long-poll as the official client makes it: from `offset`, echoing the
 * last answer's `cursor`, its body read as text and handed to `answered`.
 * The crowd's pollers and --client-cost's loop on it alike.
 */
function longPoll (port: number, path: string, agent: Agent, offset: string, cursor: string | undefined, answered: (res: IncomingMessage, body: string) => void): ClientRequest {
  const query = new URLSearchParams({ offset, live: 'long-poll', ...(cursor === undefined ? {} : { cursor }) })
  return request({ host: '127.0.0.1', port, path: `${path}?${query.toString()}`, agent }, (res) => {
    let body = ''
    res.setEncoding('utf8')
    res.on('data', (chunk: string) => { body += chunk })
    res.on('end', () => answered(res, body))
  })
}

interface Figures { latencies: number[], cpu: number, clientCpu: number, span: number, shed: number, errors: number, connections: number, deliveries: number, skipped: number }

async function crowd (server: Server): Promise<Figures> {
  // One keep-alive agent per poller, as each browser tab or client has its
  // own: one agent for all searches its list of 5,000 sockets at every
  // answer (Agent.removeSocket, 8 % of this process's CPU), and this
  // process is already what sets the pace (BENCHMARKS.md).
  const agents: Agent[] = []
  const sockets = new WeakSet<Socket>()
  const figures: Figures = { latencies: [], cpu: 0, clientCpu: 0, span: 0, shed: 0, errors: 0, connections: 0, deliveries: 0, skipped: 0 }
  const sentAt = new Map<number, number>()
  let stopped = false
  let waiting = 0
  let warmed = 0
  /** Each poller's last message: a message it never got, with a later one, is skipped (the servers must not). */
  const poll = (agent: Agent, offset: string, cursor: string | undefined, last = -1) => {
    if (stopped) return
    const req = longPoll(server.port, server.path, agent, offset, cursor, (res, body) => {
      waiting--
      const now = performance.now()
      if (res.statusCode === 200) {
        for (const n of server.messages(body)) {
          if (n === WARM_UP) warmed++
          const sent = sentAt.get(n)
          if (sent === undefined) continue
          figures.latencies.push(now - sent)
          figures.deliveries++
          if (last >= 0 && n > last + 1) figures.skipped += n - last - 1
          last = n
        }
      }
      if (res.statusCode === 503) {
        figures.shed++
        setTimeout(() => poll(agent, offset, cursor, last), Number(res.headers['retry-after'] ?? 1) * 1000)
        return
      }
      poll(agent, String(res.headers['stream-next-offset'] ?? offset), res.headers['stream-cursor'] as string | undefined, last)
    })
    req.on('socket', (socket) => { if (!sockets.has(socket)) { sockets.add(socket); figures.connections++ } })
    req.on('error', () => { waiting--; figures.errors++; if (!stopped) setTimeout(() => poll(agent, offset, cursor, last), 100) })
    waiting++
    req.end()
  }
  // Every poller from the same tail, read once (5,000 reads of `now` would race the first appends).
  const tail = (await fetch(`http://127.0.0.1:${server.port}${server.path}?offset=now`)).headers.get('stream-next-offset')!
  for (let i = 0; i < pollers; i++) {
    const agent = pollerAgent()
    agents.push(agent)
    poll(agent, tail, undefined)
  }
  for (let attempt = 0; attempt < 600 && waiting < pollers; attempt++) await sleep(50) // eslint-disable-line no-unmodified-loop-condition -- the pollers count themselves
  // A message not measured, until every poller has it: each is then waiting on the server, not in its backlog.
  await server.append(WARM_UP)
  for (let attempt = 0; attempt < 1200 && warmed < pollers; attempt++) await sleep(50) // eslint-disable-line no-unmodified-loop-condition -- the pollers count themselves
  await sleep(1000)
  const appends = Math.round(seconds * 1000 / intervalMs)
  const cpuBefore = cpuSeconds(server.child.pid)
  const clientBefore = process.cpuUsage()
  const spanBegan = performance.now()
  for (let n = 0; n < appends; n++) {
    const started = performance.now()
    sentAt.set(n, started)
    await server.append(n)
    await sleep(Math.max(0, intervalMs - (performance.now() - started)))
  }
  await sleep(Math.min(5000, 5 * intervalMs))
  figures.cpu = cpuSeconds(server.child.pid) - cpuBefore
  const client = process.cpuUsage(clientBefore)
  figures.clientCpu = (client.user + client.system) / 1e6
  figures.span = (performance.now() - spanBegan) / 1000
  stopped = true
  for (const agent of agents) agent.destroy()
  figures.latencies.sort((a, b) => a - b)
  return figures
}

/** Whether `bytes` hold one whole HTTP response (a body by Content-Length or chunked). */
function wholeResponse (bytes: Buffer): boolean {
  const headEnd = bytes.indexOf('\r\n\r\n')
  if (headEnd < 0) return false
  const head = bytes.subarray(0, headEnd).toString('latin1')
  const length = /^content-length: *(\d+)/im.exec(head)?.[1]
  if (length !== undefined) return bytes.length >= headEnd + 4 + Number(length)
  return bytes.subarray(headEnd).toString('latin1').endsWith('\r\n0\r\n\r\n')
}

/** One long-poll answer of `server` carrying one message, exactly as its bytes went on the wire. */
async function capturedAnswer (server: Server): Promise<Buffer> {
  const tail = (await fetch(`http://127.0.0.1:${server.port}${server.path}?offset=now`)).headers.get('stream-next-offset')!
  const socket = connect(server.port, '127.0.0.1')
  const chunks: Buffer[] = []
  socket.on('data', (chunk: Buffer) => chunks.push(chunk))
  socket.write(`GET ${server.path}?offset=${tail}&live=long-poll HTTP/1.1\r\nHost: 127.0.0.1:${server.port}\r\nConnection: keep-alive\r\n\r\n`)
  await sleep(500)
  await server.append(0)
  for (let attempt = 0; attempt < 200 && !wholeResponse(Buffer.concat(chunks)); attempt++) await sleep(25)
  socket.destroy()
  const answer = Buffer.concat(chunks)
  if (!wholeResponse(answer) || !answer.toString('latin1').startsWith('HTTP/1.1 200')) throw new Error(`${server.name}: no long-poll answer captured`)
  return answer
}

/** A server that answers every request with the bytes in ANSWER (base64) at once, and does nothing else. */
const CANNED_SERVER = `
import { createServer } from 'node:net'
const answer = Buffer.from(process.env.ANSWER, 'base64')
createServer((socket) => { socket.setNoDelay(true); socket.on('error', () => {}); socket.on('data', () => socket.write(answer)) }).listen(Number(process.env.PORT), '127.0.0.1')
`

/** This process's CPU per answer (µs) and answers a second, with --pollers pollers looping on `answer` for `ms`. */
async function clientCost (answer: Buffer, messages: Server['messages'], ms: number): Promise<{ cpuPerAnswer: number, answersPerSecond: number }> {
  const port = await freePort()
  const child = spawn(process.execPath, ['--input-type=module', '-e', CANNED_SERVER], { env: { ...process.env, PORT: String(port), ANSWER: answer.toString('base64') }, stdio: ['ignore', 'inherit', 'inherit'] })
  try {
    await until(`http://127.0.0.1:${port}/`)
    let answers = 0
    let stopped = false
    // As the crowd's pollers: an agent each, the body parsed, the next poll from the answer's headers.
    const poll = (agent: Agent, offset: string, cursor: string | undefined) => {
      if (stopped) return
      longPoll(port, '/stream', agent, offset, cursor, (res, body) => {
        messages(body)
        answers++
        poll(agent, String(res.headers['stream-next-offset']), res.headers['stream-cursor'] as string | undefined)
      }).on('error', () => {}).end() // only when stopped: the agents are destroyed mid-request
    }
    const agents = Array.from({ length: pollers }, pollerAgent)
    for (const agent of agents) poll(agent, '0', undefined)
    await sleep(1000)
    const before = { cpu: process.cpuUsage(), answers, at: performance.now() }
    await sleep(ms)
    const cpu = process.cpuUsage(before.cpu)
    const measured = answers - before.answers
    const result = { cpuPerAnswer: (cpu.user + cpu.system) / measured, answersPerSecond: measured / ((performance.now() - before.at) / 1000) }
    stopped = true
    for (const agent of agents) agent.destroy()
    return result
  } finally {
    child.kill('SIGTERM')
    await new Promise((resolve) => child.once('exit', resolve))
  }
}

async function clientCosts (): Promise<void> {
  const answers: Array<{ name: string, answer: Buffer, messages: Server['messages'] }> = []
  for (const start of [reference, service]) {
    const server = await start()
    try {
      answers.push({ name: server.name, answer: await capturedAnswer(server), messages: server.messages })
    } finally {
      await server.close()
    }
  }
  console.log(`\nbench:crowd-reference --client-cost, Node ${process.version}: ${pollers} pollers looping on each server's captured long-poll answer (a server that sends those bytes at once), ${seconds / 4} s a round, ${rounds} round(s)\n`)
  for (const { name, answer } of answers) console.log(`${name}: ${answer.length} bytes, ${answer.toString('latin1').split('\r\n\r\n')[0]!.split('\r\n').length - 1} header lines`)
  console.log('\n| round | answer of | client CPU per answer | answers/s |')
  console.log('|---|---|---:|---:|')
  const costs = new Map<string, number[]>()
  // Not recorded: this process's first loops run before its code is optimized.
  await clientCost(answers[0]!.answer, answers[0]!.messages, seconds * 250)
  for (let round = 1; round <= rounds; round++) {
    for (const { name, answer, messages } of round % 2 === 1 ? answers : [...answers].reverse()) {
      const { cpuPerAnswer, answersPerSecond } = await clientCost(answer, messages, seconds * 250)
      costs.set(name, [...(costs.get(name) ?? []), cpuPerAnswer])
      console.log(`| ${round} | ${name} | ${cpuPerAnswer.toFixed(1)} µs | ${answersPerSecond.toFixed(0)} |`)
    }
  }
  const mean = (values: number[]) => values.reduce((sum, value) => sum + value, 0) / values.length
  const [referenceCost, serviceCost] = answers.map(({ name }) => mean(costs.get(name)!))
  console.log(`\nthis service's answer / the reference's, client CPU per answer (mean of ${rounds}): ${(serviceCost! / referenceCost!).toFixed(3)}`)
  console.log(`figure ${JSON.stringify({ clientCost: Object.fromEntries(costs), ratio: serviceCost! / referenceCost! })}`)
}

if (!args['no-build']) {
  console.log('bench: npm run build')
  const build = spawnSync('npm', ['run', 'build'], { cwd: root, stdio: ['ignore', 'ignore', 'inherit'] })
  if (build.status !== 0) throw new Error('npm run build failed')
}
if (args['client-cost']) {
  await clientCosts()
  process.exit(0)
}
console.log(`\nbench:crowd-reference, Node ${process.version}: ${pollers} long-pollers on one stream, an append every ${intervalMs} ms for ${seconds} s, ${rounds} round(s)\n`)
console.log('| round | server | delivery p50 | p99 | max | deliveries (of pollers × appends) | skipped | 503s | TCP connections | errors | server CPU | client CPU | span |')
console.log('|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|')
const figures: Record<string, Figures[]> = {}
for (let round = 1; round <= rounds; round++) {
  for (const start of args.only === 'service' ? [service] : args.only === 'reference' ? [reference] : [reference, service]) {
    const server = await start()
    try {
      const result = await crowd(server)
      ;(figures[server.name] ??= []).push(result)
      const { latencies } = result
      const expected = pollers * Math.round(seconds * 1000 / intervalMs)
      console.log(`| ${round} | ${server.name} | ${percentile(latencies, 0.5).toFixed(0)} ms | ${percentile(latencies, 0.99).toFixed(0)} ms | ${(latencies.at(-1) ?? Number.NaN).toFixed(0)} ms | ${result.deliveries} (${expected}) | ${result.skipped} | ${result.shed} | ${result.connections} | ${result.errors} | ${result.cpu.toFixed(1)} s | ${result.clientCpu.toFixed(1)} s | ${result.span.toFixed(1)} s |`)
    } finally {
      await server.close()
    }
    await sleep(2000)
  }
}
console.log(`figure ${JSON.stringify(Object.fromEntries(Object.entries(figures).map(([name, runs]) => [name, runs.map((run) => ({ p50: percentile(run.latencies, 0.5), p99: percentile(run.latencies, 0.99), shed: run.shed, connections: run.connections, deliveries: run.deliveries, cpu: run.cpu, clientCpu: run.clientCpu, span: run.span }))])))}`)
