import t from 'tap'
import { PLUGIN_TIMEOUT_MS, pluginTimeoutOf } from '../app.ts'
import { build } from './helpers/app.ts'

// Liveness and readiness probes, polled every few seconds, are logged at debug (plugins/app/request-log.ts).

t.test('probes are logged at debug, every other request at info', async (t) => {
  const lines: Array<{ msg: string, level: number, url?: string }> = []
  const app = await build(t, {}, { logger: { level: 'debug', stream: { write: (line: string) => { lines.push(JSON.parse(line)) } } } })
  for (const url of ['/health', '/ready', '/api/runs', '/api/runs/nope']) await app.inject(url)
  const requests = lines.filter((line) => line.msg === 'request')
  t.same(requests.map((line) => [line.url, line.level]), [['/health', 20], ['/ready', 20], ['/api/runs', 30], ['/api/runs/nope', 30]])
})

t.test('at info, probes write no line; an unknown route is logged as unmatched', async (t) => {
  const lines: Array<{ msg: string, url?: string, route?: string }> = []
  const app = await build(t, {}, { logger: { level: 'info', stream: { write: (line: string) => { lines.push(JSON.parse(line)) } } } })
  for (const url of ['/health', '/no/such/route']) await app.inject(url)
  t.same(lines.filter((line) => line.msg === 'request').map((line) => [line.url, line.route]), [['/no/such/route', 'unmatched']])
})

t.test('a plugin may take PLUGIN_TIMEOUT_MS to start, not Fastify\'s 10 s, which the embedded database can pass on a busy host', async (t) => {
  const app = await build(t)
  t.equal(app.initialConfig.pluginTimeout, pluginTimeoutOf(app.config))
  t.ok(PLUGIN_TIMEOUT_MS >= 60_000)
  // Its two connection checks at start, however long DB_CONNECT_TIMEOUT_MS allows each, answer before it.
  const slowConnects = await build(t, { DB_CONNECT_TIMEOUT_MS: 300_000 })
  t.ok(slowConnects.initialConfig.pluginTimeout! > 2 * 300_000, 'longer than two of the longest connection checks')
})
