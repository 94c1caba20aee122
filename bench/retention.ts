/*
 * Removing expired events: by dropping a partition (what EVENTS_RETENTION
 * does, docs/operating.md, "Event history (retention)") against a bulk DELETE, side by
 * side in one run on the same server: time, and the WAL each writes (what
 * replicas and backups must carry too).
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm run bench:retention
 *   ... npm run bench:retention -- --quick      (20,000 events: the CI smoke run)
 *
 * Two databases (ocp_bench_retention_drop, ocp_bench_retention_delete,
 * made for the run and dropped after it) are migrated and loaded alike: N events two hours old, in the
 * first partition, as migration 0004 leaves an existing table. Each
 * measurement starts right after a CHECKPOINT (so both pay the full-page
 * images a first change after a checkpoint costs) and reads
 * pg_current_wal_lsn() before and after: the WAL of the whole server, so
 * run it on a server that is otherwise quiet.
 *
 * - drop: what a pass of the event log's keeper does with a one hour
 *   retention (its statements, measured step by step): close the range,
 *   read the partition's newest created_at (one scan, once per partition),
 *   then DETACH and DROP it and raise the floor, in one transaction.
 * - delete: DELETE FROM events WHERE created_at < now() - 1 hour; then the
 *   VACUUM that the dead rows call for, measured apart.
 */
import { performance } from 'node:perf_hooks'
import { parseArgs } from 'node:util'
import pg from 'pg'
import { closeRange, dropRange, listPartitions, sequencePosition } from '../events/keeper/partitions.ts'
import { adminUrl, formatInt, migratedDatabase } from './common.ts'

const { values: args } = parseArgs({ options: { quick: { type: 'boolean', default: false } } })
const EVENTS = args.quick ? 20_000 : 1_000_000
const BATCH = 100_000

async function freshDatabase (name: string): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: await migratedDatabase(name) })
  await client.connect()
  return client
}

/** N events of an ordinary shape (a task event of a run, a small payload), two hours old. */
async function load (client: pg.Client): Promise<void> {
  for (let done = 0; done < EVENTS; done += BATCH) {
    await client.query(`
      insert into events (event_type, run_id, task_id, thread_id, summary, payload, created_at)
      select 'task_running', 'run-' || (g % 1000), 'task-' || (g % 20000), 'thread-' || (g % 20000), 'Task started',
        jsonb_build_object('attempt', g % 3, 'note', repeat('x', 120)), now() - interval '2 hours'
      from generate_series($1::int, $2::int) g`, [done + 1, Math.min(done + BATCH, EVENTS)])
  }
  await client.query('vacuum analyze events')
}

interface Measure { seconds: number, walBytes: number }

async function measure (client: pg.Client, work: () => Promise<void>): Promise<Measure> {
  await client.query('checkpoint')
  const { rows: [before] } = await client.query<{ lsn: string }>('select pg_current_wal_lsn()::text as lsn')
  const started = performance.now()
  await work()
  const seconds = (performance.now() - started) / 1000
  const { rows: [after] } = await client.query<{ bytes: string }>('select pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint::text as bytes', [before!.lsn])
  return { seconds, walBytes: Number(after!.bytes) }
}

async function count (client: pg.Client): Promise<number> {
  const { rows: [row] } = await client.query<{ n: number }>('select count(*)::int as n from events')
  return row!.n
}

const formatBytes = (bytes: number) => bytes >= 1_048_576 ? `${(bytes / 1_048_576).toFixed(1)} MiB` : bytes >= 1024 ? `${formatInt(bytes / 1024)} kiB` : `${bytes} B`
const formatSeconds = (seconds: number) => seconds >= 1 ? `${seconds.toFixed(2)} s` : `${formatInt(seconds * 1000)} ms`

const dropClient = await freshDatabase('ocp_bench_retention_drop')
const deleteClient = await freshDatabase('ocp_bench_retention_delete')
try {
  const { rows: [server] } = await dropClient.query<{ version: string }>('select version()')
  console.log(`${server!.version}\nloading ${formatInt(EVENTS)} events into each database...`)
  const loadStarted = performance.now()
  await load(dropClient)
  await load(deleteClient)
  const { rows: [size] } = await dropClient.query<{ bytes: string }>("select pg_total_relation_size('events_initial')::text as bytes")
  console.log(`loaded in ${formatSeconds((performance.now() - loadStarted) / 1000)}; the partition with its indexes: ${formatBytes(Number(size!.bytes))}\n`)

  // What the keeper's pass does, step by step (events/keeper/partitions.ts).
  const [first] = (await listPartitions(dropClient))!.ranges
  const { drawn } = await sequencePosition(dropClient)
  if (!await closeRange(dropClient, drawn, first!.end, 1000)) throw new Error('the range could not be closed')
  let newest = ''
  const scan = await measure(dropClient, async () => {
    newest = (await dropClient.query<{ newest: string }>(`select max(created_at)::text as newest from ${first!.name}`)).rows[0]!.newest
  })
  if (Date.parse(newest) > Date.now() - 3_600_000) throw new Error('the partition has not expired')
  let floor = 0
  const drop = await measure(dropClient, async () => { floor = await dropRange(dropClient, first!.name, 1000) })
  if (await count(dropClient) !== 0 || floor !== EVENTS) throw new Error('the partition was not dropped')

  let deleted = 0
  const del = await measure(deleteClient, async () => {
    deleted = (await deleteClient.query('delete from events where created_at < now() - interval \'1 hour\'')).rowCount ?? 0
  })
  if (deleted !== EVENTS || await count(deleteClient) !== 0) throw new Error('the DELETE did not remove every event')
  const vacuum = await measure(deleteClient, async () => { await deleteClient.query('vacuum events') })

  const rows: Array<[string, Measure]> = [
    ['drop: the partition\'s newest created_at (one scan, once per partition)', scan],
    ['drop: DETACH + DROP, the floor raised (one transaction)', drop],
    ['drop, both steps', { seconds: scan.seconds + drop.seconds, walBytes: scan.walBytes + drop.walBytes }],
    ['delete: DELETE ... WHERE created_at < now() - 1 hour', del],
    ['delete, then: the VACUUM its dead rows call for', vacuum]
  ]
  console.log(`| removing ${formatInt(EVENTS)} events | time | WAL |`)
  console.log('|---|---:|---:|')
  for (const [label, result] of rows) console.log(`| ${label} | ${formatSeconds(result.seconds)} | ${formatBytes(result.walBytes)} |`)
  const both = rows[2]![1]
  console.log(`\nDELETE / drop (both steps): ${(del.seconds / both.seconds).toFixed(1)} x the time, ${formatInt(del.walBytes / Math.max(both.walBytes, 1))} x the WAL, before its VACUUM`)
} finally {
  await dropClient.end()
  await deleteClient.end()
  // Recreated on each run: no need to keep a few hundred MB of them.
  const admin = new pg.Client({ connectionString: adminUrl() })
  await admin.connect()
  for (const name of ['ocp_bench_retention_drop', 'ocp_bench_retention_delete']) await admin.query(`drop database if exists ${name} with (force)`)
  await admin.end()
}
