/*
 * npm run bench:tracing: what OpenTelemetry tracing costs. The service
 * (node dist/server.js) over the demo fixture is loaded with getRun, in
 * alternating rounds with tracing off (no OTEL_* variable: the SDK is not
 * loaded) and on (OTLP http/json to a collector in this process that
 * accepts and drops every batch, every request sampled). Prints each
 * round, then the medians and their ratio.
 *
 *   npm run bench:tracing -- [--seconds 10] [--rounds 3] [--connections 16] [--no-build]
 */
import autocannon from 'autocannon'
import { createServer } from 'node:http'
import { parseArgs } from 'node:util'
import { buildService, demoDatabase, formatInt, gitDescription, median, startBuiltService } from './common.ts'

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
const DATABASE = 'ocp_bench_tracing'
const PATH = '/api/runs/run-demo-1'

/** An OTLP/HTTP collector that accepts and drops: the spans it was sent. */
async function collector () {
  let spans = 0
  const server = createServer((request, response) => {
    let body = ''
    request.on('data', (chunk) => { body += chunk })
    request.on('end', () => {
      for (const resource of JSON.parse(body).resourceSpans ?? []) {
        for (const scoped of resource.scopeSpans) spans += scoped.spans.length
      }
      response.writeHead(200, { 'content-type': 'application/json' }).end('{}')
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return { url: `http://127.0.0.1:${(server.address() as { port: number }).port}`, spans: () => spans, close: () => server.close() }
}

async function load (url: string) {
  const result = await autocannon({ url: `${url}${PATH}`, connections: CONNECTIONS, duration: SECONDS })
  if (result.non2xx > 0 || result.errors > 0) throw new Error(`${result.non2xx} non-2xx answers, ${result.errors} errors`)
  return { rps: result.requests.average, p99: result.latency.p99 }
}

async function main () {
  if (!args['no-build']) buildService()
  const databaseUrl = await demoDatabase(DATABASE)

  const sink = await collector()
  const modes = {
    off: {},
    on: { OTEL_EXPORTER_OTLP_ENDPOINT: sink.url, OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json', OTEL_SERVICE_NAME: 'ocp-api-bench' }
  }
  console.log(`bench:tracing, ${gitDescription()}, node ${process.version}: GET ${PATH}, ${CONNECTIONS} connections, ${SECONDS} s a round, ${ROUNDS} rounds alternating`)
  const results: Record<keyof typeof modes, Array<{ rps: number, p99: number }>> = { off: [], on: [] }
  for (let round = 1; round <= ROUNDS; round++) {
    for (const mode of ['off', 'on'] as const) {
      const service = await startBuiltService(databaseUrl, modes[mode])
      await load(service.url) // warm-up: the JIT, the pool, the prepared statements
      const result = await load(service.url)
      results[mode].push(result)
      console.log(`round ${round} tracing ${mode.padEnd(3)}: ${formatInt(result.rps)} req/s, p99 ${result.p99} ms`)
      service.child.kill('SIGTERM')
      await new Promise((resolve) => service.child.once('exit', resolve))
    }
  }
  sink.close()
  const off = median(results.off.map((r) => r.rps))
  const on = median(results.on.map((r) => r.rps))
  console.log(`median: off ${formatInt(off)} req/s (p99 ${median(results.off.map((r) => r.p99))} ms), on ${formatInt(on)} req/s (p99 ${median(results.on.map((r) => r.p99))} ms); on/off ${(on / off).toFixed(2)}; ${formatInt(sink.spans())} spans received`)
}

await main()
