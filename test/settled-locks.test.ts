import pg from 'pg'
import t from 'tap'
import { testDatabaseUrl } from './helpers/database.js'

/*
 * Every read of the API asks events_settled() for its X-Event-Cursor. Its
 * plans are generic, and on Postgres 15 a generic plan over the partitioned
 * events table locks every partition and its indexes before pruning them:
 * with a partition a day of history, a read's transaction took hundreds of
 * locks. On a quiet log (nothing drawn above the position) it must not
 * touch the events table at all.
 */

const PARTITIONS = 40

t.test('events_settled on a quiet log locks no partition, however many; past a drawn id it looks, and extends', async (t) => {
  const url = await testDatabaseUrl()
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  t.teardown(() => client.end())
  await client.query(`do $$ begin for i in 0..${PARTITIONS - 1} loop
    execute format('create table events_test_%s partition of events for values from (%s) to (%s)', i, 900000000 + i * 1000, 900000000 + (i + 1) * 1000);
  end loop; end $$`)
  const partitions = new Set((await client.query<{ name: string }>('select relid::regclass::text as name from pg_partition_tree(\'events\')')).rows.map((row) => row.name))
  t.ok(partitions.size > PARTITIONS, `${partitions.size} tables in the events tree`)

  /** events_settled(known) in a transaction of its own, and the relations it held locked. */
  async function settledWithLocks (known = 0): Promise<{ position: number, locked: string[] }> {
    await client.query('begin')
    try {
      const position = Number((await client.query<{ p: string }>('select events_settled($1) as p', [known])).rows[0]!.p)
      const { rows } = await client.query<{ name: string }>(`select relation::regclass::text as name from pg_locks
        where pid = pg_backend_pid() and locktype = 'relation' and relation <> 'pg_locks'::regclass`)
      return { position, locked: rows.map((row) => row.name) }
    } finally {
      await client.query('commit')
    }
  }
  // Past PL/pgSQL's first five calls, its plans are the generic ones.
  for (let i = 0; i < 8; i++) await client.query('select events_settled(0)')

  const quiet = await settledWithLocks()
  t.equal(quiet.position, 0, 'an empty log: position 0')
  t.same(quiet.locked.filter((name) => partitions.has(name)), [], 'no table of the events tree locked', { locked: quiet.locked })
  t.ok(quiet.locked.length <= 3, `${quiet.locked.length} relations locked`, { locked: quiet.locked })

  // A writer at work: an id drawn above the position, not yet committed.
  const writer = new pg.Client({ connectionString: url })
  await writer.connect()
  t.teardown(() => writer.end())
  await writer.query('insert into runs (run_id, goal, summary, status) values ($1, $2, $3, $4)', ['locks-run', 'g', '', 'running'])
  await writer.query('begin')
  const { rows } = await writer.query<{ id: string }>('insert into events (event_type, run_id, summary) select \'message\', \'locks-run\', \'s\' from generate_series(1, 3) returning event_id as id')
  const top = Math.max(...rows.map((row) => Number(row.id)))
  const inFlight = await settledWithLocks()
  t.equal(inFlight.position, 0, 'ids drawn, not committed: the position stays')
  t.ok(inFlight.locked.includes('events'), 'and it looked at the events')

  await writer.query('commit')
  t.equal((await settledWithLocks()).position, top, 'committed: it extends over them')
  const after = await settledWithLocks(top)
  t.equal(after.position, top, 'from there (the poller\'s head), nothing drawn above: the same answer')
  t.same(after.locked.filter((name) => partitions.has(name)), [], 'without looking at the events', { locked: after.locked })
})
