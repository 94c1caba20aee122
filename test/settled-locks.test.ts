import { sql } from 'kysely'
import pg from 'pg'
import t from 'tap'
import { settled } from '../db/settled-position.ts'
import { builder } from '../db/statement.ts'
import { testDatabaseUrl } from './helpers/database.ts'

/*
 * Every read of the API asks events_settled_row() for its X-Event-Cursor,
 * inlined into its statement, which calls events_settled() unless the log
 * is quiet. events_settled()'s plans are generic, and on Postgres 15 a
 * generic plan over the partitioned events table locks every partition and
 * its indexes before pruning them: with a partition a day of history, a
 * read's transaction took hundreds of locks. On a quiet log (nothing drawn
 * above the position) neither may touch the events table at all, and the
 * two must answer the same in every case.
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

  const asked = {
    function: 'select events_settled($1) as p',
    // What every read's statement holds (db/settled-position.ts): events_settled_row, inlined.
    row: sql`select ${settled(0)} as p`.compile(builder).sql
  }
  /** The position in a transaction of its own, and the relations it held locked. */
  async function settledWithLocks (known = 0, via: keyof typeof asked = 'function'): Promise<{ position: number, locked: string[] }> {
    await client.query('begin')
    try {
      const position = Number((await client.query<{ p: string }>(asked[via], [known])).rows[0]!.p)
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
  const quietRow = await settledWithLocks(0, 'row')
  t.equal(quietRow.position, 0, 'the inlined row: the same position')
  t.same(quietRow.locked.filter((name) => !['event_log_state', 'event_log_state_pkey', 'events_id_drawn', 'events_event_id_seq'].includes(name)), [],
    'from event_log_state and the sequence (through events_id_drawn) alone', { locked: quietRow.locked })

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
  const inFlightRow = await settledWithLocks(0, 'row')
  t.equal(inFlightRow.position, 0, 'the inlined row: the same')
  t.ok(inFlightRow.locked.includes('events'), 'by calling events_settled()')

  await writer.query('commit')
  t.equal((await settledWithLocks()).position, top, 'committed: it extends over them')
  t.equal((await settledWithLocks(0, 'row')).position, top, 'the inlined row too')
  for (const via of ['function', 'row'] as const) {
    const after = await settledWithLocks(top, via)
    t.equal(after.position, top, `${via}: from there (the poller's head), nothing drawn above: the same answer`)
    t.same(after.locked.filter((name) => partitions.has(name)), [], 'without looking at the events', { locked: after.locked })
  }
  t.equal((await settledWithLocks(top + 5, 'row')).position, top + 5, 'a known position above the ids drawn (a cursor handed out before a failover): the same as the function', { function: (await settledWithLocks(top + 5)).position })

  // Inside a range reissued after a failover: the position the range starts at.
  await client.query('update event_log_state set reissued = int8multirange(int8range($1, $2))', [top - 1, top + 10])
  t.teardown(() => client.query('update event_log_state set reissued = \'{}\''))
  t.equal((await settledWithLocks(top, 'row')).position, top - 2, 'in a reissued range, the inlined row answers as the function', { function: (await settledWithLocks(top)).position })
})

t.test('events_settled_row is inlined into the statement, and a role granted the tables reads it', async (t) => {
  const client = new pg.Client({ connectionString: await testDatabaseUrl() })
  await client.connect()
  t.teardown(() => client.end())
  const { rows: plan } = await client.query<{ 'QUERY PLAN': string }>('explain select (select r.settled from events_settled_row(0) r)')
  const text = plan.map((row) => row['QUERY PLAN']).join('\n')
  t.notMatch(text, /Function Scan/, 'no function scan: its query is part of the plan', { plan: text })
  t.match(text, /event_log_state/, 'which reads event_log_state itself')

  const reader = `settled_reader_${process.pid}`
  await client.query(`create role ${reader}`)
  t.teardown(async () => { await client.query('reset role'); await client.query(`drop owned by ${reader}`); await client.query(`drop role ${reader}`) })
  await client.query(`grant select on all tables in schema public to ${reader}`)
  await client.query(`set role ${reader}`)
  await t.rejects(client.query('select last_value from events_event_id_seq'), { code: '42501' }, 'the role has no right on the sequence')
  const drawn = (await client.query<{ drawn: string }>('select drawn from events_id_drawn')).rows[0]!.drawn
  t.match(drawn, /^\d+$/, 'yet reads how far it has drawn')
  const position = (await client.query<{ p: string }>('select (select r.settled from events_settled_row(0) r) as p')).rows[0]!.p
  t.match(position, /^\d+$/, 'and the settled position')
  await client.query('reset role')
})
