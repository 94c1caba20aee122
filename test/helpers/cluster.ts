import { execFileSync } from 'node:child_process'
import { chownSync, existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs'
import { tmpdir, userInfo } from 'node:os'
import { join } from 'node:path'
import type { Test } from 'tap'
import { freePort } from './wait.js'

/*
 * A Postgres server of the test's own, in a temporary directory, that the
 * test may stop and start at will (never the machine's shared server).
 * Uses the installed server binaries (Debian: /usr/lib/postgresql/N/bin);
 * as root, it runs them as the `postgres` user, since initdb refuses root.
 */

function serverBinaries (): string {
  const fromEnv = process.env.PG_BINDIR
  if (fromEnv !== undefined && existsSync(join(fromEnv, 'initdb'))) return fromEnv
  const versions = existsSync('/usr/lib/postgresql') ? readdirSync('/usr/lib/postgresql').sort((a, b) => Number(b) - Number(a)) : []
  for (const version of versions) {
    const dir = `/usr/lib/postgresql/${version}/bin`
    if (existsSync(join(dir, 'initdb'))) return dir
  }
  throw new Error('no Postgres server binaries (initdb, pg_ctl) found: install postgresql, or set PG_BINDIR')
}

export interface Cluster {
  url: string
  start: () => void
  /** Stops at once, as a crash would (pg_ctl stop -m immediate). */
  stop: () => void
}

export async function ownCluster (t: Test): Promise<Cluster> {
  const bin = serverBinaries()
  const dir = mkdtempSync(join(tmpdir(), 'ocp-pg-'))
  const asRoot = userInfo().uid === 0
  const run = (tool: string, args: string[]) => {
    const command = asRoot ? ['runuser', '-u', 'postgres', '--', join(bin, tool), ...args] : [join(bin, tool), ...args]
    execFileSync(command[0]!, command.slice(1), { stdio: 'pipe' })
  }
  if (asRoot) chownSync(dir, Number(execFileSync('id', ['-u', 'postgres']).toString()), Number(execFileSync('id', ['-g', 'postgres']).toString()))
  const data = join(dir, 'data')
  run('initdb', ['-D', data, '-A', 'trust', '-U', 'postgres', '--no-sync', '-E', 'UTF8'])
  const port = await freePort()
  // fsync=off survives a process crash (the OS still has the data);
  // synchronous_commit stays on, or a crash would lose acknowledged commits.
  const options = `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off`
  const cluster: Cluster = {
    url: `postgres://postgres@127.0.0.1:${port}/postgres`,
    start: () => run('pg_ctl', ['-D', data, '-o', options, '-l', join(dir, 'log'), '-w', 'start']),
    stop: () => run('pg_ctl', ['-D', data, '-m', 'immediate', '-w', 'stop'])
  }
  cluster.start()
  t.teardown(() => {
    try { cluster.stop() } catch {}
    rmSync(dir, { recursive: true, force: true })
  })
  return cluster
}
