/*
 * npm run bench:auth: what authentication costs a read. One service (node
 * dist/server.js, over the demo fixture) with API_TOKENS and AUTH_ISSUERS
 * (a local issuer, RS256 keys) is loaded with getRun, in alternating rounds
 * of the same request with: a static token; one identity-provider JWT (its
 * signature checked once, then remembered until it expires); and a new
 * JWT on every request (a signature check each: 15,000 tokens in turn, more
 * than the 10,000 remembered). Prints each round, then the medians and
 * their ratios to the static token.
 *
 *   npm run bench:auth -- [--seconds 10] [--rounds 3] [--connections 16] [--no-build]
 */
import autocannon from 'autocannon'
import { spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import pg from 'pg'
import { seed } from '../db/seed.js'
import { startIssuer } from '../test/helpers/issuer.js'
import { adminUrl, formatInt, freePort, gitDescription, root, sleep, withDatabase } from './common.js'

const { values: args } = parseArgs({
  options: {
    seconds: { type: 'string', default: '10' },
    rounds: { type: 'string', default: '3' },
    connections: { type: 'string', default: '16' },
    'no-build': { type: 'boolean', default: false }
  }
})
const SECONDS = Number(args.seconds)
const ROUNDS = Number(args.rounds)
const CONNECTIONS = Number(args.connections)
const DATABASE = 'ocp_bench_auth'
const PATH = '/api/runs/run-demo-1'
const STATIC_TOKEN = 'bench-static-token'
const FRESH_TOKENS = 15_000

async function startService (databaseUrl: string, env: Record<string, string>): Promise<{ url: string, child: ChildProcess }> {
  const port = await freePort()
  const child = spawn(process.execPath, [join(root, 'dist/server.js')], {
    cwd: root,
    env: { ...process.env, DATABASE_URL: databaseUrl, PORT: String(port), HOST: '127.0.0.1', LOG_LEVEL: 'warn', LOG_FORMAT: 'json', ...env },
    stdio: ['ignore', 'ignore', 'inherit']
  })
  const url = `http://127.0.0.1:${port}`
  for (let i = 0; i < 300; i++) {
    try {
      if ((await fetch(`${url}/ready`)).ok) return { url, child }
    } catch {}
    await sleep(100)
  }
  throw new Error('the service did not become ready')
}

/** One stretch of load; `tokens` are sent in turn, one per request. */
async function load (url: string, tokens: string[], seconds = SECONDS) {
  let next = 0
  const result = await autocannon({
    url: `${url}${PATH}`,
    connections: CONNECTIONS,
    duration: seconds,
    requests: [{ setupRequest: (request) => ({ ...request, headers: { ...request.headers, authorization: `Bearer ${tokens[next++ % tokens.length]}` } }) }]
  })
  if (result.non2xx > 0 || result.errors > 0) throw new Error(`${result.non2xx} non-2xx answers, ${result.errors} errors`)
  return { rps: result.requests.average, p50: result.latency.p50, p99: result.latency.p99 }
}

const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!

async function main () {
  if (!args['no-build']) {
    const build = spawnSync('npm', ['run', '--silent', 'build'], { cwd: root, stdio: 'inherit' })
    if (build.status !== 0) throw new Error('npm run build failed')
  }
  const admin = new pg.Client({ connectionString: adminUrl() })
  await admin.connect()
  await admin.query(`drop database if exists ${DATABASE} with (force)`)
  await admin.query(`create database ${DATABASE}`)
  await admin.end()
  const databaseUrl = withDatabase(adminUrl(), DATABASE)
  await seed(databaseUrl, join(root, 'fixtures/demo.json')) // migrates, then loads

  const closers: Array<() => void> = []
  const issuer = await startIssuer({ teardown: (fn) => closers.push(fn) })
  const jwt = await issuer.sign({}, { expiresIn: 3600 })
  const fresh = await Promise.all(Array.from({ length: FRESH_TOKENS }, (_, i) => issuer.sign({ sub: `user-${i}` }, { expiresIn: 3600 })))
  const modes = { static: [STATIC_TOKEN], jwt: [jwt], 'jwt, new each request': fresh }
  const service = await startService(databaseUrl, { API_TOKENS: STATIC_TOKEN, AUTH_ISSUERS: JSON.stringify([{ issuer: issuer.url, audience: 'ocp-api' }]) })
  try {
    console.log(`bench:auth, ${gitDescription()}, node ${process.version}: GET ${PATH}, ${CONNECTIONS} connections, ${SECONDS} s a round, ${ROUNDS} rounds alternating; RS256 JWTs`)
    for (const tokens of Object.values(modes)) await load(service.url, tokens, 2) // warm-up: the JIT, the pool, the keys
    const results = Object.fromEntries(Object.keys(modes).map((mode) => [mode, [] as Array<{ rps: number, p50: number, p99: number }>]))
    for (let round = 1; round <= ROUNDS; round++) {
      for (const [mode, tokens] of Object.entries(modes)) {
        const result = await load(service.url, tokens)
        results[mode]!.push(result)
        console.log(`round ${round} ${mode.padEnd(22)}: ${formatInt(result.rps)} req/s, p50 ${result.p50} ms, p99 ${result.p99} ms`)
      }
    }
    const base = median(results.static!.map((r) => r.rps))
    for (const [mode, list] of Object.entries(results)) {
      const rps = median(list.map((r) => r.rps))
      console.log(`median ${mode.padEnd(22)}: ${formatInt(rps)} req/s (p50 ${median(list.map((r) => r.p50))} ms, p99 ${median(list.map((r) => r.p99))} ms); ${(rps / base).toFixed(2)} of static`)
    }
  } finally {
    service.child.kill('SIGTERM')
    for (const close of closers) close()
  }
}

await main()
