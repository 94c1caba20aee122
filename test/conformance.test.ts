import t from 'tap'
import { build } from './helpers/app.js'
import { needsServer, testDatabaseUrl } from './helpers/database.js'
import { runConformance } from './conformance/run.js'
import { EXCLUDED } from './conformance/scope.js'

// The official Durable Streams conformance suite's read path, against this
// service (test/conformance/run.ts). Every test of it must pass, but those
// that need what this read path does not serve, each named with its reason
// in test/conformance/scope.ts: no silent skip.

const LONG_POLL_MS = 3000

t.test('the official conformance suite\'s read path passes, but for the tests named with why they cannot apply', { skip: needsServer('an orchestrator\'s writes on a server of its own') }, async (t) => {
  const app = await build(t, { STREAMS_LONG_POLL_MS: LONG_POLL_MS, CORS_ORIGINS: '*', EVENTS_POLL_INTERVAL_MS: 50, EVENTS_CLOCK_INTERVAL_MS: 100 })
  await app.listen({ port: 0, host: '127.0.0.1' })
  const result = await runConformance(`http://127.0.0.1:${(app.server.address() as { port: number }).port}`, await testDatabaseUrl(), LONG_POLL_MS)
  t.ok(result.tests.length >= 100, `the suite's read path: ${result.tests.length} tests`)
  t.same(result.stale, [], 'every test excluded is still in the suite')
  t.same(result.failed, [], 'every other test of the read path passes')
  const passed = result.tests.filter((test) => test.status === 'passed').length
  t.comment(`read path: ${passed} passed, ${EXCLUDED.size} excluded (test/conformance/scope.ts says why), of ${result.tests.length}`)
})
