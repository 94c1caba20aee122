import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

/* Runs an entry point (server.ts, db/migrate.ts, db/seed.ts) as a user does, in a child process. */

export const root = join(dirname(fileURLToPath(import.meta.url)), '../..')

export interface Outcome { code: number | null, stdout: string, stderr: string }

/**
 * Settings of every service a test or a benchmark starts, in process or as
 * a child: no load shedding on event-loop delay, for test files run in
 * parallel, and on a busy CI machine they lag, and benchmarks measure
 * answers, not 503s (operations.test.ts tests shedding itself).
 */
export const TEST_SERVICE_ENV = { MAX_EVENT_LOOP_DELAY_MS: '0' } as const

/**
 * Runs `command` (a script, or a script and its arguments) with `env` over TEST_SERVICE_ENV and this process's
 * environment less DATABASE_URL;
 * `onStdout` sees all output so far each time some arrives (what it starts must stop a server whatever happens, or the
 * run waits on it until tap's timeout).
 */
export function runScript (command: string | string[], env: Record<string, string | undefined>, onStdout?: (text: string, child: ReturnType<typeof spawn>) => void): Promise<Outcome> {
  const [script, ...args] = Array.isArray(command) ? command : [command]
  // The same loaders as this test process (TypeScript, coverage tracking).
  const child = spawn(process.execPath, [...process.execArgv, join(root, script!), ...args], {
    cwd: root,
    env: { ...process.env, DATABASE_URL: undefined, LOG_LEVEL: 'info', ...TEST_SERVICE_ENV, ...env },
    stdio: ['ignore', 'pipe', 'pipe']
  })
  let stdout = ''
  let stderr = ''
  child.stdout.on('data', (chunk) => { stdout += chunk; onStdout?.(stdout, child) })
  child.stderr.on('data', (chunk) => { stderr += chunk })
  return once(child, 'exit').then(([code]) => ({ code: code as number | null, stdout, stderr }))
}
