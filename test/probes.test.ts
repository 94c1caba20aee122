import t from 'tap'
import { build } from './helpers/app.js'

// Liveness and readiness probes, polled every few seconds, are logged at debug (plugins/app/request-log.ts).

t.test('probes are logged at debug, every other request at info', async (t) => {
  const lines: Array<{ msg: string, level: number, url?: string }> = []
  const app = await build(t, {}, { logger: { level: 'debug', stream: { write: (line: string) => { lines.push(JSON.parse(line)) } } } })
  for (const url of ['/health', '/ready', '/api/runs', '/api/runs/nope']) await app.inject(url)
  const requests = lines.filter((line) => line.msg === 'request')
  t.same(requests.map((line) => [line.url, line.level]), [['/health', 20], ['/ready', 20], ['/api/runs', 30], ['/api/runs/nope', 30]])
})
