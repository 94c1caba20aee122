import { once } from 'node:events'
import { createServer } from 'node:http'
import t from 'tap'
import { build } from './helpers/app.ts'
import { extraDatabaseUrl, needsServer, testDatabaseUrl, withAdmin } from './helpers/database.ts'
import { freePort } from './helpers/wait.ts'
import { migrateToLatest } from '../db/migrate.ts'
import { runConformance } from './conformance/run.ts'
import { EXCLUDED } from './conformance/scope.ts'

// The official Durable Streams conformance suite's read path, against this
// service (test/conformance/run.ts). Every test of it must pass, but those
// that need what this read path does not serve, each named with its reason
// in test/conformance/scope.ts: no silent skip.

const LONG_POLL_MS = 3000

t.test('the official conformance suite\'s read path passes, but for the tests named with why they cannot apply', { skip: needsServer('an orchestrator\'s writes on a server of its own') }, async (t) => {
  const app = await build(t, { DURABLE_STREAMS_LONG_POLL_MS: LONG_POLL_MS, CORS_ORIGINS: '*', EVENTS_POLL_INTERVAL_MS: 50, EVENTS_KEEPER_INTERVAL_MS: 100 })
  await app.listen({ port: 0, host: '127.0.0.1' })
  const result = await runConformance(`http://127.0.0.1:${(app.server.address() as { port: number }).port}`, await testDatabaseUrl(), LONG_POLL_MS)
  t.ok(result.tests.length >= 100, `the suite's read path: ${result.tests.length} tests`)
  t.same(result.stale, [], 'every test excluded is still in the suite')
  t.same(result.failed, [], 'every other test of the read path passes')
  const passed = result.tests.filter((test) => test.status === 'passed').length
  t.comment(`read path: ${passed} passed, ${EXCLUDED.size} excluded (test/conformance/scope.ts says why), of ${result.tests.length}`)
})

t.test('a deployment the suite cannot use is said plainly, before any test runs', { skip: needsServer('a database the service does not read') }, async (t) => {
  const databaseUrl = await testDatabaseUrl()
  const closed = await freePort() // nothing listens there
  await t.rejects(runConformance(`http://127.0.0.1:${closed}`, databaseUrl, LONG_POLL_MS), /^no service answers at http:\/\/127\.0\.0\.1:\d+ \(GET \/health: .+\): start one, or pass --url$/, 'no service at the address')
  await t.rejects(runConformance(`http://127.0.0.1:${closed}`, 'postgres://postgres@127.0.0.1:1/none', LONG_POLL_MS), /^cannot connect to the database \(--database, default DATABASE_URL\): /, 'no database')

  // Something else at the address: not ready, then not the service.
  let healthStatus = 503
  const stranger = createServer((req, res) => res.writeHead(req.url === '/health' ? healthStatus : 500).end()).listen(0, '127.0.0.1')
  t.teardown(() => stranger.close())
  await once(stranger, 'listening')
  const strangerUrl = `http://127.0.0.1:${(stranger.address() as { port: number }).port}`
  await t.rejects(runConformance(strangerUrl, databaseUrl, LONG_POLL_MS), /^the service at .+ is not ready: GET \/health answered 503$/, 'a service not ready')
  healthStatus = 200
  await t.rejects(runConformance(strangerUrl, databaseUrl, LONG_POLL_MS), /answered GET \/api\/runs\/\{id\} with 500$/, 'a server that is not the service')

  const app = await build(t)
  await app.listen({ port: 0, host: '127.0.0.1' })
  const serviceUrl = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`
  const other = await extraDatabaseUrl('other')
  await t.rejects(runConformance(serviceUrl, other, LONG_POLL_MS), /^the database given refused a run written as an orchestrator writes it \(relation "runs" does not exist\): /, 'a database without the schema')
  await migrateToLatest(other)
  await t.rejects(runConformance(serviceUrl, other, LONG_POLL_MS), /does not read the database given \(a run written there is not found\)/, 'a service that reads another database')

  const guarded = await build(t, { API_TOKENS: 'secret-token-for-the-check' })
  await guarded.listen({ port: 0, host: '127.0.0.1' })
  await t.rejects(runConformance(`http://127.0.0.1:${(guarded.server.address() as { port: number }).port}`, databaseUrl, LONG_POLL_MS), /asks for credentials \(401\)/, 'a service that asks for credentials')

  const { rows } = await withAdmin(databaseUrl, (client) => client.query("select run_id from runs where run_id like 'conformance-probe-%'"))
  t.same(rows, [], 'and the probe runs are removed')
})
