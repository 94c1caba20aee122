import { spawn, type ChildProcess } from 'node:child_process'
import { join } from 'node:path'
import type { Test } from 'tap'
import { answers } from './nginx.ts'
import { root, TEST_SERVICE_ENV } from './run.ts'
import { freePort, waitUntil } from './wait.ts'

/*
 * Replicas of the service (one process each, as in production), for the
 * tests that put them behind nginx (nginx.ts) and kill one while clients
 * stream through the proxy.
 */

export interface Replica { port: number, process: ChildProcess }

/** How long one replica may take to answer /ready: it compiles its TypeScript first, slow on a busy machine. */
const STARTUP_MS = 120_000

/**
 * `count` replicas over `databaseUrl`, ready; killed when the test ends.
 * Started one after the other: several compiling at once on a busy machine
 * can pass Fastify's plugin timeout. `env` adds to or overrides their
 * settings (TEST_SERVICE_ENV and the ones below).
 */
export async function startReplicas (t: Test, databaseUrl: string, count: number, env: Record<string, string> = {}): Promise<Replica[]> {
  const replicas: Replica[] = []
  t.teardown(() => { for (const replica of replicas) replica.process.kill('SIGKILL') })
  for (let i = 0; i < count; i++) {
    const port = await freePort()
    const child = spawn(process.execPath, [...process.execArgv, join(root, 'server.ts')], {
      cwd: root,
      env: { ...process.env, DATABASE_URL: databaseUrl, PORT: String(port), HOST: '127.0.0.1', LOG_LEVEL: 'warn', ...TEST_SERVICE_ENV, MIGRATE_ON_START: 'false', EVENTS_POLL_INTERVAL_MS: '50', SSE_RETRY_MS: '200', ...env },
      stdio: ['ignore', 'ignore', 'inherit']
    })
    replicas.push({ port, process: child })
    let exited: string | undefined
    child.once('exit', (code, signal) => { exited = `exited (${signal ?? code})` })
    await waitUntil(async () => {
      if (exited) throw new Error(`replica ${i + 1} ${exited} before it was ready`)
      return answers(`http://127.0.0.1:${port}/ready`)
    }, `replica ${i + 1}`, STARTUP_MS)
  }
  return replicas
}
