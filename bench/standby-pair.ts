/*
 * A private primary and a streaming hot standby (pg_basebackup -R of the
 * primary, in a temporary directory, on free ports), for bench:holes
 * --overlap. The same servers as test/helpers/standby.ts's
 * startReplicatedPostgres, without what only the tests need (the reader
 * role the primary refuses, the logs, failover). Not imported from there:
 * that file imports test/helpers/database.ts, which loads tap, and tap's
 * root test fails a process that runs past 30 s.
 */
import { writeFileSync, rmSync } from 'node:fs'
import { join } from 'node:path'
import pg from 'pg'
import { findServerBinaries, serverWorkspace } from '../test/helpers/cluster.js'
import { freePort, sleep } from '../test/helpers/wait.js'

export interface StandbyPair {
  /** The primary, as the superuser `postgres`, database `postgres`. */
  primaryUrl: string
  /** The hot standby, as `postgres` (a superuser: the service's wake-up may connect to it). */
  standbyUrl: string
  /** Creates an empty database on the primary and waits until the standby has it. */
  createDatabase: (name: string) => Promise<void>
  /** Resolves once the standby has replayed everything the primary had written when it was called. */
  waitForReplay: (timeoutMs?: number) => Promise<void>
  /** Stops both servers and removes their files. */
  stop: () => Promise<void>
}

/** Why a primary and a standby of our own cannot be made here, or false. */
export function standbyPairSkipReason (): string | false {
  return findServerBinaries() === undefined && 'no Postgres server binaries (initdb, pg_ctl, pg_basebackup): install postgresql, or set PG_BINDIR'
}

const HBA = [
  'local all all trust',
  'host all all 127.0.0.1/32 trust',
  'local replication all trust',
  'host replication all 127.0.0.1/32 trust'
].join('\n') + '\n'

export async function startStandbyPair (): Promise<StandbyPair> {
  const { dir, run, own } = serverWorkspace('ocp-bench-standby-')
  const primaryData = join(dir, 'primary')
  const standbyData = join(dir, 'standby')
  const [primaryPort, standbyPort] = [await freePort(), await freePort()]
  // As test/helpers/standby.ts: fsync off (nothing here need survive the machine), a WAL sender for the standby and for each wake-up.
  const common = `-k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off -c wal_level=replica -c max_wal_senders=4 -c hot_standby=on`
  const start = (data: string, port: number, log: string) =>
    run('pg_ctl', ['-D', data, '-o', `-p ${port} ${common}`, '-l', join(dir, log), '-w', 'start'])
  const writeHba = (data: string) => {
    const file = join(data, 'pg_hba.conf')
    writeFileSync(file, HBA)
    own(file)
  }

  let running: string[] = []
  const clients: pg.Client[] = []
  let stopped: Promise<void> | undefined
  const stop = () => {
    stopped ??= (async () => {
      for (const client of clients) await client.end().catch(() => {})
      // The standby first, so the primary's shutdown does not wait on its WAL sender.
      for (const data of [...running].reverse()) {
        try { run('pg_ctl', ['-D', data, '-m', 'fast', '-w', 'stop']) } catch {}
      }
      running = []
      rmSync(dir, { recursive: true, force: true })
    })()
    return stopped
  }

  try {
    run('initdb', ['-D', primaryData, '-A', 'trust', '-U', 'postgres', '--no-sync', '-E', 'UTF8'])
    writeHba(primaryData)
    start(primaryData, primaryPort, 'primary.log')
    running.push(primaryData)
    run('pg_basebackup', ['-h', '127.0.0.1', '-p', String(primaryPort), '-U', 'postgres', '-D', standbyData, '-R', '-X', 'stream', '-c', 'fast', '--no-sync'])
    start(standbyData, standbyPort, 'standby.log')
    running.push(standbyData)
  } catch (error) {
    await stop()
    throw error
  }
  const primaryUrl = `postgres://postgres@127.0.0.1:${primaryPort}/postgres`
  const standbyUrl = `postgres://postgres@127.0.0.1:${standbyPort}/postgres`
  const primary = new pg.Client({ connectionString: primaryUrl })
  const standby = new pg.Client({ connectionString: standbyUrl })
  clients.push(primary, standby)
  await primary.connect()
  await standby.connect()

  const waitForReplay = async (timeoutMs = 10_000) => {
    const { rows: [current] } = await primary.query<{ lsn: string }>('select pg_current_wal_lsn()::text as lsn')
    const deadline = Date.now() + timeoutMs
    for (;;) {
      const { rows: [at] } = await standby.query<{ replayed: boolean }>('select pg_last_wal_replay_lsn() >= $1::pg_lsn as replayed', [current!.lsn])
      if (at!.replayed) return
      if (Date.now() > deadline) throw new Error(`the standby has not replayed the primary's WAL up to ${current!.lsn} after ${timeoutMs} ms`)
      await sleep(20)
    }
  }
  await waitForReplay()
  return {
    primaryUrl,
    standbyUrl,
    createDatabase: async (name) => {
      await primary.query(`create database "${name}"`)
      await waitForReplay()
    },
    waitForReplay,
    stop
  }
}
