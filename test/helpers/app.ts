import type { FastifyInstance } from 'fastify'
import type { Test } from 'tap'
import { buildApp, type BuildOptions } from '../../app.js'
import { loadConfig, type Config } from '../../config.js'
import { testBackend, testDatabaseUrl } from './database.js'

/**
 * The configuration the tests run with: this file's database, quiet logs,
 * and no load shedding on event-loop delay (CI machines run test files in
 * parallel, and a busy one lags; operations.test.ts tests shedding itself).
 * On the embedded database, whose one backend every connection takes in
 * turn, in a process CI's two cores share with other test files, waits of
 * 30 s rather than 5 before a read is called unavailable: a stream refused
 * that way once failed a CI run (the tests of those timeouts set their own).
 */
export async function testConfig (overrides: Partial<Config> = {}): Promise<Config> {
  const env = {
    DATABASE_URL: await testDatabaseUrl(),
    LOG_LEVEL: 'silent',
    MAX_EVENT_LOOP_DELAY_MS: '0',
    ...(testBackend === 'embedded' && { DB_CONNECT_TIMEOUT_MS: '30000', DB_STATEMENT_TIMEOUT_MS: '30000' })
  }
  return { ...loadConfig(env), ...overrides }
}

/** An application over this file's database, closed when the test ends. */
export async function build (t: Test, overrides: Partial<Config> = {}, options: BuildOptions = {}): Promise<FastifyInstance> {
  const app = await buildApp(await testConfig(overrides), options)
  t.teardown(() => app.close())
  await app.ready()
  return app
}

/** An application (as build makes it) listening on loopback: its base URL and port. `port` 0: any free one. */
export async function serve (t: Test, overrides: Partial<Config> = {}, port = 0): Promise<{ app: FastifyInstance, url: string, port: number }> {
  const app = await build(t, overrides)
  await app.listen({ port, host: '127.0.0.1' })
  const address = app.server.address() as { port: number }
  return { app, url: `http://127.0.0.1:${address.port}`, port: address.port }
}
