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
 *   npm run bench:auth -- --quick --no-build     (CI's smoke run: one 1 s round, 100 JWTs in turn, so most
 *                                                 are remembered; figures not meaningful)
 */
import autocannon from 'autocannon'
import { parseArgs } from 'node:util'
import { startIssuer } from '../test/helpers/issuer.ts'
import { buildService, demoDatabase, formatInt, gitDescription, median, startBuiltService } from './common.ts'

const { values: args } = parseArgs({
  options: {
    seconds: { type: 'string', default: '10' },
    rounds: { type: 'string', default: '3' },
    connections: { type: 'string', default: '16' },
    'no-build': { type: 'boolean', default: false },
    quick: { type: 'boolean', default: false }
  }
})
const SECONDS = args.quick ? 1 : Number(args.seconds)
const ROUNDS = args.quick ? 1 : Number(args.rounds)
const CONNECTIONS = Number(args.connections)
const DATABASE = 'ocp_bench_auth'
const PATH = '/api/runs/run-demo-1'
const STATIC_TOKEN = 'bench-static-token'
/** Signing them takes most of a smoke run's time: --quick signs few. */
const FRESH_TOKENS = args.quick ? 100 : 15_000
/** Each mode's untimed warm-up, in seconds. */
const WARMUP = args.quick ? 1 : 2

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

async function main () {
  if (!args['no-build']) {
    buildService()
  }
  const databaseUrl = await demoDatabase(DATABASE)

  const closers: Array<() => void> = []
  const issuer = await startIssuer({ teardown: (fn) => closers.push(fn) })
  const jwt = await issuer.sign({}, { expiresIn: 3600 })
  const fresh = await Promise.all(Array.from({ length: FRESH_TOKENS }, (_, i) => issuer.sign({ sub: `user-${i}` }, { expiresIn: 3600 })))
  const modes = { static: [STATIC_TOKEN], jwt: [jwt], 'jwt, new each request': fresh }
  const service = await startBuiltService(databaseUrl, { LOG_LEVEL: 'warn', API_TOKENS: STATIC_TOKEN, AUTH_ISSUERS: JSON.stringify([{ issuer: issuer.url, audience: 'ocp-api' }]) })
  try {
    console.log(`bench:auth, ${gitDescription()}, node ${process.version}: GET ${PATH}, ${CONNECTIONS} connections, ${SECONDS} s a round, ${ROUNDS} rounds alternating; RS256 JWTs`)
    for (const tokens of Object.values(modes)) await load(service.url, tokens, WARMUP) // warm-up: the JIT, the pool, the keys
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
