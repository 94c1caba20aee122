import { execFile, execFileSync } from 'node:child_process'
import { chownSync, existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs'
import { tmpdir, userInfo } from 'node:os'
import { join } from 'node:path'
import { promisify } from 'node:util'
import type { Test } from 'tap'
import { freePort } from './wait.ts'

const execFileAsync = promisify(execFile)

/*
 * A Postgres server of the test's own, in a temporary directory, that the
 * test may stop and start at will (never the machine's shared server).
 * Uses the installed server binaries (`pg_config --bindir`, or Debian's
 * /usr/lib/postgresql/N/bin); as root, it runs them as the `postgres` user,
 * since initdb refuses root.
 */

/** The directory of the server binaries (initdb, pg_ctl, pg_basebackup), or undefined when none is installed. */
export function findServerBinaries (): string | undefined {
  const candidates = [process.env.PG_BINDIR]
  try {
    candidates.push(execFileSync('pg_config', ['--bindir'], { stdio: 'pipe' }).toString().trim())
  } catch {} // no pg_config on the PATH: look where Debian puts the servers
  const versions = existsSync('/usr/lib/postgresql') ? readdirSync('/usr/lib/postgresql').sort((a, b) => Number(b) - Number(a)) : []
  candidates.push(...versions.map((version) => `/usr/lib/postgresql/${version}/bin`))
  return candidates.find((dir) => dir !== undefined && dir !== '' && existsSync(join(dir, 'initdb')))
}

/** A temporary directory the server binaries may write in, and how to run them (as `postgres` when we are root). */
export interface ServerWorkspace {
  dir: string
  run: (tool: string, args: string[]) => void
  /** As run, without blocking the event loop: for a tool that waits on this process's own connections. */
  runAsync: (tool: string, args: string[]) => Promise<void>
  /** Gives a file we wrote to the user the server runs as. */
  own: (path: string) => void
}

export function serverWorkspace (prefix: string): ServerWorkspace {
  const bin = findServerBinaries()
  if (bin === undefined) throw new Error('no Postgres server binaries (initdb, pg_ctl) found: install postgresql, or set PG_BINDIR')
  const dir = mkdtempSync(join(tmpdir(), prefix))
  const asRoot = userInfo().uid === 0
  const owner = asRoot
    ? { uid: Number(execFileSync('id', ['-u', 'postgres']).toString()), gid: Number(execFileSync('id', ['-g', 'postgres']).toString()) }
    : undefined
  const own = (path: string) => { if (owner !== undefined) chownSync(path, owner.uid, owner.gid) }
  own(dir)
  const command = (tool: string, args: string[]) =>
    asRoot ? ['runuser', '-u', 'postgres', '--', join(bin, tool), ...args] : [join(bin, tool), ...args]
  const run = (tool: string, args: string[]) => {
    const [file, ...rest] = command(tool, args)
    execFileSync(file!, rest, { stdio: 'pipe' })
  }
  const runAsync = async (tool: string, args: string[]) => {
    const [file, ...rest] = command(tool, args)
    await execFileAsync(file!, rest)
  }
  return { dir, run, runAsync, own }
}

export interface Cluster {
  url: string
  start: () => void
  /** Stops at once, as a crash would (pg_ctl stop -m immediate). */
  stop: () => void
  /**
   * Stops cleanly (pg_ctl stop -m fast), failing after `timeoutSeconds`: the
   * server waits for its WAL senders' clients to confirm all WAL sent. Async,
   * so that clients in this process can answer meanwhile.
   */
  stopClean: (timeoutSeconds: number) => Promise<void>
}

/** A server of the test's own; `settings` are more `-c name=value` options for it. */
export async function ownCluster (t: Test, settings = ''): Promise<Cluster> {
  const { dir, run, runAsync } = serverWorkspace('ocp-pg-')
  const data = join(dir, 'data')
  run('initdb', ['-D', data, '-A', 'trust', '-U', 'postgres', '--no-sync', '-E', 'UTF8'])
  const port = await freePort()
  // fsync=off survives a process crash (the OS still has the data);
  // synchronous_commit stays on, or a crash would lose acknowledged commits.
  const options = `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off ${settings}`
  const cluster: Cluster = {
    url: `postgres://postgres@127.0.0.1:${port}/postgres`,
    start: () => run('pg_ctl', ['-D', data, '-o', options, '-l', join(dir, 'log'), '-w', 'start']),
    stop: () => run('pg_ctl', ['-D', data, '-m', 'immediate', '-w', 'stop']),
    stopClean: (timeoutSeconds) => runAsync('pg_ctl', ['-D', data, '-m', 'fast', '-t', String(timeoutSeconds), '-w', 'stop'])
  }
  cluster.start()
  t.teardown(() => {
    try { cluster.stop() } catch {}
    rmSync(dir, { recursive: true, force: true })
  })
  return cluster
}
