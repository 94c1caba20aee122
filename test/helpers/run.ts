import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

/* Runs an entry point (server.ts, db/migrate.ts, db/seed.ts) as a user does, in a child process. */

export const root = join(dirname(fileURLToPath(import.meta.url)), '../..')

export interface Outcome { code: number | null, stdout: string, stderr: string }

/**
 * Runs `command` (a script, or a script and its arguments) with `env` over this process's environment less DATABASE_URL;
 * `onStdout` sees all output so far each time some arrives.
 */
export function runScript (command: string | string[], env: Record<string, string | undefined>, onStdout?: (text: string, child: ReturnType<typeof spawn>) => void): Promise<Outcome> {
  const [script, ...args] = Array.isArray(command) ? command : [command]
  // The same loaders as this test process (TypeScript, coverage tracking).
  const child = spawn(process.execPath, [...process.execArgv, join(root, script!), ...args], {
    cwd: root,
    env: { ...process.env, DATABASE_URL: undefined, LOG_LEVEL: 'info', ...env },
    stdio: ['ignore', 'pipe', 'pipe']
  })
  let stdout = ''
  let stderr = ''
  child.stdout.on('data', (chunk) => { stdout += chunk; onStdout?.(stdout, child) })
  child.stderr.on('data', (chunk) => { stderr += chunk })
  return once(child, 'exit').then(([code]) => ({ code: code as number | null, stdout, stderr }))
}
