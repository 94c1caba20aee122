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
