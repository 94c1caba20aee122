/*
 * Which database a test run uses, without loading tap: benchmarks import
 * helpers that ask (test/helpers/standby.ts), and tap's root test fails a
 * process that runs past 30 s. database.ts re-exports both.
 */

/** Which database this run's tests use. */
export const testBackend: 'server' | 'embedded' = process.env.TEST_BACKEND === 'embedded' ? 'embedded' : 'server'

/** For `{ skip }` on a test that needs what only a Postgres server has (say which). */
export function needsServer (reason: string): string | false {
  return testBackend === 'embedded' && `needs a Postgres server: ${reason}`
}
