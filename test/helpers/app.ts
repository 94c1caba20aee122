import type { FastifyInstance } from 'fastify'
import { connect } from 'node:net'
import type { Test } from 'tap'
import { buildApp, type BuildOptions } from '../../app.ts'
import { loadConfig, type Config } from '../../config.ts'
import { testBackend, testDatabaseUrl } from './database.ts'
import { TEST_SERVICE_ENV } from './run.ts'
import { waitUntil } from './wait.ts'

/**
 * The configuration the tests run with: this file's database, quiet logs,
 * and the settings of every service a test starts (TEST_SERVICE_ENV).
 * On the embedded database, whose one backend every connection takes in
 * turn, in a process CI's two cores share with other test files, waits of
 * 30 s rather than 5 before a read is called unavailable: a stream refused
 * that way once failed a CI run (the tests of those timeouts set their own).
 */
export async function testConfig (overrides: Partial<Config> = {}): Promise<Config> {
  const env = {
    DATABASE_URL: await testDatabaseUrl(),
    LOG_LEVEL: 'silent',
    ...TEST_SERVICE_ENV,
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

/**
 * Waits until `app`'s window of recent events has learnt a history floor of
 * at least `floor` (on a poll after it holds the events up to it): until
 * then it would still serve a catch-up from below it, which it holds whole.
 */
export function untilWindowLearnsFloor (app: FastifyInstance, floor: number): Promise<void> {
  return waitUntil(() => (app.events.hub.window?.from ?? 0) >= floor, 'the window of recent events to learn the floor')
}

/**
 * Holds `app`'s close where its refusals have begun but its streams have not
 * yet ended (its wake-up slow to stop), until `release`: a request arriving
 * meanwhile, on a connection kept alive from before, reaches the closing
 * app. `entered` resolves once the close is held there.
 */
export function holdClose (app: FastifyInstance): { entered: Promise<void>, release: () => void } {
  let release!: () => void
  const released = new Promise<void>((resolve) => { release = resolve })
  let enter!: () => void
  const entered = new Promise<void>((resolve) => { enter = resolve })
  Object.assign(app.events, { wakeup: { stop: () => { enter(); return released } } })
  return { entered, release }
}

/** An answer read off a raw connection. */
export interface RawAnswer { statusCode: number, headers: Record<string, string>, body: string }

/**
 * A raw keep-alive connection to `url`, idle once its first request
 * (/health) is answered. `late` sends another on it and resolves with that
 * answer once the service closes the connection.
 */
export async function keptAliveConnection (url: string): Promise<{ late: (path: string, headers?: Record<string, string>) => Promise<RawAnswer> }> {
  const socket = connect({ port: Number(new URL(url).port), host: '127.0.0.1' })
  let received = ''
  socket.on('data', (chunk) => { received += chunk.toString() })
  const closed = new Promise((resolve) => socket.on('close', resolve))
  socket.write('GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n')
  await waitUntil(() => /^HTTP\/1\.1 200 [\s\S]*\r\n\r\n\{.*\}$/.test(received), 'the first answer')
  return {
    async late (path, headers = {}) {
      socket.write(`GET ${path} HTTP/1.1\r\nHost: localhost\r\n${Object.entries(headers).map(([name, value]) => `${name}: ${value}\r\n`).join('')}\r\n`)
      await closed
      const second = received.split(/(?=HTTP\/1\.1 )/)[1]!
      const [head, body] = [second.slice(0, second.indexOf('\r\n\r\n')), second.slice(second.indexOf('\r\n\r\n') + 4)]
      const [status, ...lines] = head.split('\r\n')
      return {
        statusCode: Number(status!.split(' ')[1]),
        headers: Object.fromEntries(lines.map((line) => [line.slice(0, line.indexOf(':')).toLowerCase(), line.slice(line.indexOf(':') + 1).trim()])),
        body
      }
    }
  }
}
