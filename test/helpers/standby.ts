import { readFileSync, rmSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import pg from 'pg'
import type { Test } from 'tap'
import { needsServer } from './backend.ts'
import { findServerBinaries, serverWorkspace } from './cluster.ts'
import { freePort, sleep, withDatabase } from './wait.ts'

/*
 * A primary and a streaming hot standby of the test's own (pg_basebackup -R
 * of the primary, in temporary directories, on free ports), for the tests
 * of the service on a read replica: docs/reference.md, "Read replicas".
 *
 * The read-only login role READER_ROLE is created on the primary and so
 * replicates, but the primary's pg_hba.conf rejects it (pg_hba.conf is per
 * server and is not replicated): a read made as that role reaches the
 * standby or fails, which is how the tests prove that no read reaches the
 * primary.
 */

/** One statement on `url`, over a connection of its own: the primary and the standby are reached by URL. */
export async function queryOn (url: string, text: string, values: unknown[] = []): Promise<pg.QueryResultRow[]> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    return (await client.query(text, values)).rows
  } finally {
    await client.end()
  }
}

export const READER_ROLE = 'ocp_reader'

/** For `{ skip }`: why a primary and a standby of the test's own cannot be made here, or false. */
export function standbySkipReason (): string | false {
  return needsServer('a primary and a hot standby of its own (initdb, pg_basebackup)') ||
    (findServerBinaries() === undefined && 'no Postgres server binaries (initdb, pg_ctl, pg_basebackup): install postgresql, or set PG_BINDIR')
}

export interface ReplicatedPostgres {
  /** The primary, as the superuser `postgres`, database `postgres` (withDatabase() for another). */
  primaryUrl: string
  /** The hot standby, as `postgres`. */
  standbyUrl: string
  /** The standby as READER_ROLE: what a replica's reads use. */
  readerUrl: string
  /** The primary as READER_ROLE: always refused by the primary's pg_hba.conf. */
  primaryReaderUrl: string
  /** Creates an empty database on the primary (the role's read rights included) and waits until the standby has it. */
  createDatabase: (name: string) => Promise<void>
  /** Resolves once the standby has replayed everything the primary had written when it was called. */
  waitForReplay: (timeoutMs?: number) => Promise<void>
  /** The server's log so far (log_connections is on: one line per connection, with its user and application_name). */
  log: (server: 'primary' | 'standby') => string
  /** Cuts the standby off the primary's WAL (what the primary commits from now on never reaches it), and waits until it is. */
  detachStandby: () => Promise<void>
  /** Stops the primary at once, as a crash would (pg_ctl stop -m immediate). */
  crashPrimary: () => void
  /** Promotes the standby (pg_promote) and waits until it takes writes: it then serves at standbyUrl as the new primary. */
  promoteStandby: () => Promise<void>
  /** Stops both servers and removes their files; also done when the test ends. */
  stop: () => Promise<void>
}

/** Lines of pg_hba.conf: trust on loopback (replication included), the reader refused first where asked. */
function hba (rejectReader: boolean): string {
  return [
    ...(rejectReader ? [`local all ${READER_ROLE} reject`, `host all ${READER_ROLE} 127.0.0.1/32 reject`] : []),
    'local all all trust',
    'host all all 127.0.0.1/32 trust',
    'local replication all trust',
    'host replication all 127.0.0.1/32 trust'
  ].join('\n') + '\n'
}

async function query<T extends pg.QueryResultRow> (url: string, text: string): Promise<T[]> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    return (await client.query<T>(text)).rows
  } finally {
    await client.end()
  }
}

export async function startReplicatedPostgres (t: Test): Promise<ReplicatedPostgres> {
  const { dir, run, own } = serverWorkspace('ocp-standby-')
  const primaryData = join(dir, 'primary')
  const standbyData = join(dir, 'standby')
  const [primaryPort, standbyPort] = [await freePort(), await freePort()]
  // fsync=off: a test's data need not survive the machine; log_connections: who connected where.
  const common = `-k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off -c log_connections=on -c wal_level=replica -c max_wal_senders=4 -c hot_standby=on`
  const start = (data: string, port: number, log: string) =>
    run('pg_ctl', ['-D', data, '-o', `-p ${port} ${common}`, '-l', join(dir, log), '-w', 'start'])
  const writeHba = (data: string, rejectReader: boolean) => {
    const file = join(data, 'pg_hba.conf')
    writeFileSync(file, hba(rejectReader))
    own(file)
  }

  let running: string[] = []
  let stopped: Promise<void> | undefined
  const clients: pg.Client[] = []
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
  t.teardown(stop)

  run('initdb', ['-D', primaryData, '-A', 'trust', '-U', 'postgres', '--no-sync', '-E', 'UTF8'])
  writeHba(primaryData, true)
  start(primaryData, primaryPort, 'primary.log')
  running.push(primaryData)
  const primaryUrl = `postgres://postgres@127.0.0.1:${primaryPort}/postgres`

  // The reader: read-only by default, SELECT on every table the owner
  // (postgres, who migrates) creates in `public`. Default privileges are
  // per database, so they are set in template1 too: databases created later
  // inherit them.
  await query(primaryUrl, `create role ${READER_ROLE} login; alter role ${READER_ROLE} set default_transaction_read_only = on`)
  for (const database of ['template1', 'postgres']) {
    await query(withDatabase(primaryUrl, database), `alter default privileges for role postgres in schema public grant select on tables to ${READER_ROLE}`)
  }

  run('pg_basebackup', ['-h', '127.0.0.1', '-p', String(primaryPort), '-U', 'postgres', '-D', standbyData, '-R', '-X', 'stream', '-c', 'fast', '--no-sync'])
  writeHba(standbyData, false) // the copy refuses the reader, as the primary does
  start(standbyData, standbyPort, 'standby.log')
  running.push(standbyData)
  const standbyUrl = `postgres://postgres@127.0.0.1:${standbyPort}/postgres`

  const primary = new pg.Client({ connectionString: primaryUrl })
  const standby = new pg.Client({ connectionString: standbyUrl })
  clients.push(primary, standby)
  // crashPrimary ends the primary's connection under it.
  primary.on('error', () => {})
  standby.on('error', () => {})
  await primary.connect()
  await standby.connect()

  const waitForReplay = async (timeoutMs = 10_000) => {
    const { rows: [current] } = await primary.query<{ lsn: string }>('select pg_current_wal_lsn()::text as lsn')
    const lsn = current!.lsn
    const deadline = Date.now() + timeoutMs
    for (;;) {
      const { rows: [standbyAt] } = await standby.query<{ replayed: boolean }>('select pg_last_wal_replay_lsn() >= $1::pg_lsn as replayed', [lsn])
      if (standbyAt!.replayed) return
      if (Date.now() > deadline) throw new Error(`the standby has not replayed the primary's WAL up to ${lsn} after ${timeoutMs} ms`)
      await sleep(20)
    }
  }

  const reader = (url: string) => {
    const parsed = new URL(url)
    parsed.username = READER_ROLE
    return parsed.toString()
  }
  const pair: ReplicatedPostgres = {
    primaryUrl,
    standbyUrl,
    readerUrl: reader(standbyUrl),
    primaryReaderUrl: reader(primaryUrl),
    createDatabase: async (name) => {
      await primary.query(`create database "${name}"`)
      await waitForReplay()
    },
    waitForReplay,
    log: (server) => readFileSync(join(dir, `${server}.log`), 'utf8'),
    detachStandby: async () => {
      await standby.query("alter system set primary_conninfo = ''")
      await standby.query('select pg_reload_conf()')
      for (let i = 0; ; i++) {
        const { rowCount } = await standby.query('select 1 from pg_stat_wal_receiver')
        if (rowCount === 0) return
        if (i > 500) throw new Error('the standby still receives WAL after 10 s')
        await sleep(20)
      }
    },
    crashPrimary: () => {
      run('pg_ctl', ['-D', primaryData, '-m', 'immediate', '-w', 'stop'])
      running = running.filter((data) => data !== primaryData)
    },
    promoteStandby: async () => {
      await standby.query('select pg_promote(true, 60)')
      for (;;) {
        const { rows: [row] } = await standby.query<{ recovering: boolean }>('select pg_is_in_recovery() as recovering')
        if (!row!.recovering) return
        await sleep(20)
      }
    },
    stop
  }
  await waitForReplay()
  return pair
}
