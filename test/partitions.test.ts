import { Kysely, PostgresDialect } from 'kysely'
import { Migrator } from 'kysely/migration'
import pg from 'pg'
import t, { type Test } from 'tap'
import { migrateToLatest } from '../db/migrate.ts'
import { migrations } from '../db/migrations/index.ts'
import { CONVERSION_MARGIN, DEFAULT_PARTITION, FIRST_PARTITION, partitionName, prepareConversion } from '../db/migrations/0004_events_partitioned_by_id.ts'
import {
  closeRange, HOLD_SEQUENCE, listPartitions, MIN_RANGE_IDS, NEXTVAL_CLOSE_LIMIT, PartitionKeeper, RANGES_AHEAD, sequencePosition, type KeeperLog, type KeeperOptions
} from '../events/keeper/partitions.ts'
import { extraDatabaseUrl, needsServer, testPool } from './helpers/database.ts'
import { sleep } from './helpers/wait.ts'

// Migration 0004 (the events table partitioned by id, converted without a
// rewrite) and the keeper of its partitions (events/keeper/partitions.ts),
// driven pass by pass on databases of their own.

async function connect (t: Test, url: string): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: url })
  client.on('error', () => {})
  await client.connect()
  t.teardown(() => client.end())
  return client
}

function kysely (t: Test, url: string): Kysely<any> {
  const pool = testPool(url, 1)
  const db = new Kysely<any>({ dialect: new PostgresDialect({ pool }) })
  t.teardown(() => db.destroy())
  return db
}

/** A database migrated up to `upTo` (all migrations by default), and a client on it. */
async function database (t: Test, suffix: string, upTo?: string): Promise<{ url: string, client: pg.Client }> {
  const url = await extraDatabaseUrl(suffix)
  if (upTo === undefined) await migrateToLatest(url)
  else {
    const { error } = await new Migrator({ db: kysely(t, url), provider: { getMigrations: async () => migrations } }).migrateTo(upTo)
    if (error !== undefined) throw error
  }
  return { url, client: await connect(t, url) }
}

interface Logged { level: string, details: object, message: string }
function recordingLog (): KeeperLog & { lines: Logged[] } {
  const lines: Logged[] = []
  const at = (level: string) => (details: object, message: string) => { lines.push({ level, details, message }) }
  return { lines, info: at('info'), warn: at('warn'), debug: at('debug') }
}

/** A tick on the pass's connection, as the keeper runs one on its own before a pass drops what a close settled. */
const tickOn = async (client: pg.ClientBase) => Number((await client.query<{ settled: string }>('select settled::text from events_keep_order()')).rows[0]!.settled)

function keeper (options: Partial<KeeperOptions> = {}) {
  const log = recordingLog()
  return { keeper: new PartitionKeeper({ retentionMs: undefined, lockTimeoutMs: 200, settle: tickOn, log, ...options }), log }
}

const one = async <T extends pg.QueryResultRow>(client: pg.Client, text: string, values: unknown[] = []): Promise<T> => (await client.query<T>(text, values)).rows[0]!
const floorOf = async (client: pg.Client) => Number((await one<{ f: string }>(client, 'select history_floor as f from event_log_state')).f)
const drawnOf = async (client: pg.Client) => (await sequencePosition(client)).drawn
const ranges = async (client: pg.Client) => (await listPartitions(client))!.ranges

t.test('the conversion keeps the table, its rows and its indexes: no rewrite', async (t) => {
  const { url, client } = await database(t, 'convert', '0003_event_order_without_lock')
  const reader = `ocp_test_reader_${process.pid}`
  await client.query(`create role ${reader}`)
  t.teardown(async () => { await client.query(`drop owned by ${reader}`); await client.query(`drop role ${reader}`) })
  await client.query(`grant select on events to ${reader} with grant option`)
  await client.query('grant select on events to public')
  await client.query(`insert into events (event_type, run_id, payload, created_at)
    select 'type-' || g, 'run-' || (g % 7), jsonb_build_object('g', g), now() - g * interval '1 minute' from generate_series(1, 1000) g`)
  const storage = `select c.relname, c.oid::int, c.relfilenode::int from pg_class c
    where c.oid in (select 'events'::regclass union all select indexrelid from pg_index where indrelid = 'events'::regclass) order by c.oid`
  const before = (await client.query(storage)).rows
  const fingerprint = 'select count(*)::int as n, sum(event_id)::text as ids, md5(string_agg(e::text, \',\' order by event_id)) as rows from events e'
  const rowsBefore = await one(client, fingerprint)
  const drawn = await drawnOf(client)

  t.same(await migrateToLatest(url), { applied: ['0004_events_partitioned_by_id', '0005_event_writers_inlined', '0006_events_settled_by_index', '0007_runs_status_index', '0008_events_census_by_sequence_lock', '0009_events_settled_by_the_keeper', '0010_events_settled_exactly', '0011_events_drawn_for_readers', '0012_stream_token_key', '0013_events_settled_without_partition_locks', '0014_events_settled_inlined', '0015_events_forks_and_lease', '0016_summaries_default_empty', '0017_least_privilege', '0018_events_settle_mark_at_settled'] })
  t.equal((await one<{ kind: string }>(client, 'select relkind::text as kind from pg_class where oid = \'events\'::regclass')).kind, 'p', 'events is partitioned')
  const after = await client.query<{ oid: number, relfilenode: number, relname: string }>('select c.oid::int, c.relfilenode::int, c.relname from pg_class c where c.oid = any($1)', [before.map((row) => row.oid)])
  t.same(after.rows.map((row) => [row.oid, row.relfilenode]).sort(), before.map((row) => [row.oid, row.relfilenode]).sort(),
    'the table and its three indexes are the same files: nothing was rewritten or rebuilt')
  t.same(after.rows.map((row) => row.relname).sort(), [FIRST_PARTITION, `${FIRST_PARTITION}_pkey`, `${FIRST_PARTITION}_run_id_event_id_idx`, `${FIRST_PARTITION}_thread_id_event_id_idx`])
  t.same(await one(client, fingerprint), rowsBefore, 'every row kept, ids included')

  const bound = drawn + CONVERSION_MARGIN
  t.same((await listPartitions(client))!, {
    ranges: [
      { name: FIRST_PARTITION, start: undefined, end: bound },
      { name: partitionName(bound), start: bound, end: bound + 1_000_000 }
    ],
    defaultPartition: DEFAULT_PARTITION
  }, 'the table is the first range, up to the sequence plus a margin; a range ahead; a default partition')
  t.equal((await client.query(`select 1 from pg_constraint where conrelid = '${FIRST_PARTITION}'::regclass and contype = 'c'`)).rowCount, 0, 'the CHECK that proved the bound is gone')

  const parent = await one<{ id_default: string, trigger: string, owner: string, indexes: string[] }>(client, `
    select pg_get_expr(d.adbin, d.adrelid) as id_default,
      (select pg_get_triggerdef(oid) from pg_trigger where tgrelid = 'events'::regclass and tgname = 'events_explicit_id') as trigger,
      pg_get_serial_sequence('events', 'event_id') as owner,
      array(select indexrelid::regclass::text from pg_index where indrelid = 'events'::regclass order by 1) as indexes
    from pg_attrdef d where d.adrelid = 'events'::regclass and d.adnum = 1`)
  t.equal(parent.id_default, 'events_next_id()')
  t.match(parent.trigger, /AFTER INSERT ON public\.events FOR EACH ROW WHEN \(events_id_needs_check\(new\.event_id\)\)/, 'the trigger for explicit ids, with its WHEN clause, on the parent')
  t.equal(parent.owner, 'public.events_event_id_seq', 'the sequence belongs to the parent\'s column')
  t.same(parent.indexes, ['events_pkey', 'events_run_id_event_id_idx', 'events_thread_id_event_id_idx'])
  const grants = await one(client, `select has_table_privilege('${reader}', 'events', 'select') as reader, has_table_privilege('${reader}', 'events', 'select with grant option') as grantable,
    has_table_privilege('public', 'events', 'select') as public`)
  t.same(grants, { reader: true, grantable: true, public: true }, 'the grants moved to the parent')

  const placed = async (id?: number) => one<{ id: string, partition: string }>(client,
    `insert into events (${id === undefined ? '' : 'event_id, '}event_type) values (${id === undefined ? '' : `${id}, `}'probe') returning event_id::text as id, tableoid::regclass::text as partition`)
  t.same(await placed(), { id: String(drawn + 1), partition: FIRST_PARTITION }, 'the next id continues in the first range')
  t.same(await placed(bound + 5), { id: String(bound + 5), partition: partitionName(bound) }, 'an id in the range ahead goes there')
  t.same(await placed(bound + 1_000_000), { id: String(bound + 1_000_000), partition: DEFAULT_PARTITION }, 'an id past every range goes to the default partition')
  t.same(await placed(), { id: String(bound + 1_000_001), partition: DEFAULT_PARTITION }, 'and so does the next one drawn')

  const migrator = new Migrator({ db: kysely(t, url), provider: { getMigrations: async () => migrations } })
  const { error } = await migrator.migrateTo('0003_event_order_without_lock')
  t.equal(error, undefined, 'down')
  const table = await one<{ kind: string, oid: number, relfilenode: number }>(client, 'select relkind::text as kind, oid::int, relfilenode::int from pg_class where oid = \'events\'::regclass')
  t.same(table, { kind: 'r', oid: before[0]!.oid, relfilenode: before[0]!.relfilenode }, 'down: the first partition is the table again')
  t.equal((await one<{ n: number }>(client, 'select count(*)::int as n from events')).n, 1004, 'with the rows of the other partitions')
  t.same((await client.query('select indexrelid::regclass::text as name from pg_index where indrelid = \'events\'::regclass order by 1')).rows.map((row) => row.name),
    ['events_pkey', 'events_run_id_event_id_idx', 'events_thread_id_event_id_idx'])
  t.same(await one(client, 'select has_table_privilege(\'public\', \'events\', \'select\') as public'), { public: true })
  t.same(await placed(), { id: String(bound + 1_000_002), partition: 'events' }, 'the ordering default and trigger work again')
  t.same(await migrateToLatest(url), { applied: ['0004_events_partitioned_by_id', '0005_event_writers_inlined', '0006_events_settled_by_index', '0007_runs_status_index', '0008_events_census_by_sequence_lock', '0009_events_settled_by_the_keeper', '0010_events_settled_exactly', '0011_events_drawn_for_readers', '0012_stream_token_key', '0013_events_settled_without_partition_locks', '0014_events_settled_inlined', '0015_events_forks_and_lease', '0016_summaries_default_empty', '0017_least_privilege', '0018_events_settle_mark_at_settled'] }, 'and up again')
  t.equal((await one<{ n: number }>(client, 'select count(*)::int as n from events')).n, 1005)
})

t.test('the CHECK is added and validated before the migrations\' transaction, and taken away if the migration fails', async (t) => {
  const { url, client } = await database(t, 'prepare', '0003_event_order_without_lock')
  await client.query('insert into events (event_type) select \'t\' from generate_series(1, 10)')
  const db = kysely(t, url)
  t.equal(await prepareConversion(db), true, 'added')
  t.match((await client.query('select pg_get_constraintdef(oid) as def, convalidated as valid from pg_constraint where conrelid = \'events\'::regclass and contype = \'c\'')).rows,
    [{ def: new RegExp(`^CHECK \\(\\(event_id < '?${10 + CONVERSION_MARGIN}`), valid: true }], 'the sequence plus the margin; validated: the scan is done')
  t.equal(await prepareConversion(db), false, 'already there: nothing added')

  await client.query(`create table ${FIRST_PARTITION} (x int)`) // in the way of the rename
  await t.rejects(migrateToLatest(url), /^migration 0004_events_partitioned_by_id failed: relation "events_initial" already exists/)
  t.equal((await client.query('select 1 from pg_constraint where conrelid = \'events\'::regclass and contype = \'c\'')).rowCount, 1, 'the CHECK stays when it was there before')
  await client.query('alter table events drop constraint events_ids_below_first_partition_end')
  await t.rejects(migrateToLatest(url), /already exists/)
  t.equal((await client.query('select 1 from pg_constraint where conrelid = \'events\'::regclass and contype = \'c\'')).rowCount, 0, 'a CHECK added for a failed migration is taken away: it would refuse ids from its bound on')
  await client.query(`drop table ${FIRST_PARTITION}`)

  // Ids drawn past the bound since it was chosen: the migration chooses again.
  await prepareConversion(db)
  await client.query(`select setval('events_event_id_seq', ${10 + CONVERSION_MARGIN + 5})`)
  t.same(await migrateToLatest(url), { applied: ['0004_events_partitioned_by_id', '0005_event_writers_inlined', '0006_events_settled_by_index', '0007_runs_status_index', '0008_events_census_by_sequence_lock', '0009_events_settled_by_the_keeper', '0010_events_settled_exactly', '0011_events_drawn_for_readers', '0012_stream_token_key', '0013_events_settled_without_partition_locks', '0014_events_settled_inlined', '0015_events_forks_and_lease', '0016_summaries_default_empty', '0017_least_privilege', '0018_events_settle_mark_at_settled'] })
  t.equal((await ranges(client))[0]!.end, 15 + 2 * CONVERSION_MARGIN)
  t.equal(await prepareConversion(db), false, 'nothing to prepare on a partitioned table')
})

t.test('preparing gives up, leaving the work to the migration, when the table is busy', { skip: needsServer('a second session holding a lock') }, async (t) => {
  const { url, client } = await database(t, 'busy_prepare', '0003_event_order_without_lock')
  const holder = await connect(t, url)
  await holder.query('begin')
  await holder.query('lock table events in access share mode')
  t.equal(await prepareConversion(kysely(t, url)), false, 'the lock timeout ends the attempt')
  await holder.query('commit')
  t.equal((await client.query('select 1 from pg_constraint where conrelid = \'events\'::regclass and contype = \'c\'')).rowCount, 0)
  t.same(await migrateToLatest(url), { applied: ['0004_events_partitioned_by_id', '0005_event_writers_inlined', '0006_events_settled_by_index', '0007_runs_status_index', '0008_events_census_by_sequence_lock', '0009_events_settled_by_the_keeper', '0010_events_settled_exactly', '0011_events_drawn_for_readers', '0012_stream_token_key', '0013_events_settled_without_partition_locks', '0014_events_settled_inlined', '0015_events_forks_and_lease', '0016_summaries_default_empty', '0017_least_privilege', '0018_events_settle_mark_at_settled'] })
})

t.test('ranges are made ahead of the sequence, above what the default partition holds', async (t) => {
  const { client } = await database(t, 'ahead')
  const { keeper: keeping } = keeper()
  await keeping.keep(client)
  const initial = await ranges(client)
  t.equal(initial.length, 2, 'the migration\'s range ahead is enough while the sequence is far from it')
  t.equal(keeping.partitions, 3, 'the default partition counted')

  const top = initial[1]!.end
  await client.query('select setval(\'events_event_id_seq\', $1)', [top - 10])
  await keeping.keep(client)
  t.same((await ranges(client)).slice(2).map(({ start, end }) => [start, end]), [[top, top + MIN_RANGE_IDS], [top + MIN_RANGE_IDS, top + 2 * MIN_RANGE_IDS]],
    `contiguous ranges until ${RANGES_AHEAD} of them lie ahead`)

  // The keeper was away: ids went past every range, into the default partition.
  const past = top + 5 * MIN_RANGE_IDS
  await client.query('insert into events (event_id, event_type) values ($1, \'explicit\')', [past])
  const drawn = await one<{ id: string, partition: string }>(client, 'insert into events (event_type) values (\'drawn\') returning event_id::text as id, tableoid::regclass::text as partition')
  t.same(drawn, { id: String(past + 1), partition: DEFAULT_PARTITION }, 'inserts never fail for want of a range')
  await client.query('insert into events (event_id, event_type) values ($1, \'explicit\')', [past + 100])
  await keeping.keep(client)
  const made = (await ranges(client)).slice(4)
  t.equal(made[0]!.start, past + 101 + NEXTVAL_CLOSE_LIMIT,
    'a new range starts above the highest id in the default partition and the sequence, past the ids that may be on their way into the default partition meanwhile')
  t.same(await one(client, 'insert into events (event_type) values (\'next\') returning tableoid::regclass::text as partition'), { partition: DEFAULT_PARTITION },
    'the ids below it still go to the default partition')
  await client.query('select setval(\'events_event_id_seq\', $1)', [made[0]!.start! - 1])
  t.same(await one(client, 'insert into events (event_type) values (\'next\') returning tableoid::regclass::text as partition'), { partition: made[0]!.name }, 'and from its start, to the range')
  t.equal((await one<{ n: number }>(client, `select count(*)::int as n from ${DEFAULT_PARTITION}`)).n, 4, 'the default partition keeps its rows')
})

t.test('a range is sized by the observed rate, to span a quarter of the retention', async (t) => {
  const { client } = await database(t, 'rate')
  const { keeper: keeping } = keeper({ retentionMs: 40_000 })
  t.equal(keeping.spanMs, 10_000)
  t.equal(keeper().keeper.spanMs, 86_400_000, 'a day without a retention')
  await keeping.keep(client)
  t.equal(keeping.rangeSize, MIN_RANGE_IDS, 'no rate known yet: the smallest')
  await client.query('select nextval(\'events_event_id_seq\') from generate_series(1, 20000)')
  await sleep(1100)
  await keeping.keep(client)
  t.ok(keeping.rate > 5000 && keeping.rate < 20_000, `${Math.round(keeping.rate)} ids/s`)
  t.ok(keeping.rangeSize > 50_000 && keeping.rangeSize < 200_000, `${keeping.rangeSize} ids: ten seconds at that rate`)
})

t.test('with a retention: the range being filled is closed once its first event is a quarter of the retention old', async (t) => {
  const { client } = await database(t, 'close')
  const { keeper: keeping, log } = keeper({ retentionMs: 6000 })
  await client.query('insert into events (event_type, created_at) values (\'young\', now())')
  await keeping.keep(client)
  t.equal(await drawnOf(client), 1, 'a young range is left open')
  await client.query('update events set created_at = now() - interval \'2 seconds\'')
  await keeping.keep(client)
  t.equal(await drawnOf(client), 1, 'one whose first event is old, but that this keeper has not seen open for a span yet, too')

  await sleep(1600)
  await keeping.keep(client)
  const [first, second] = await ranges(client)
  t.equal(await drawnOf(client), first!.end - 1, 'the first range (ten million ids ahead: setval) is closed')
  t.match(log.lines.filter((line) => /range closed/.test(line.message)), [{ level: 'debug', details: { partition: FIRST_PARTITION, from: 1, to: first!.end - 1 } }])
  t.same(await one(client, 'insert into events (event_type, created_at) values (\'next\', now() - interval \'2 seconds\') returning tableoid::regclass::text as partition'), { partition: second!.name })
  const drawn = await drawnOf(client)
  await keeping.keep(client)
  await sleep(1600)
  await keeping.keep(client)
  t.equal(await drawnOf(client), second!.end - 1, `a range of ${second!.end - drawn - 1} ids is closed the same way`)

  await keeping.keep(client) // makes ranges ahead of the sequence's new place
  const third = (await ranges(client)).find((range) => range.start === second!.end)
  await client.query('insert into events (event_type, created_at) values (\'next\', now() - interval \'2 seconds\')')
  await sleep(1600)
  await keeping.keep(client)
  t.ok(third!.end - third!.start! <= NEXTVAL_CLOSE_LIMIT)
  t.equal(await drawnOf(client), third!.end - 1, 'a short way is drawn with nextval')
  t.ok((await ranges(client)).some((range) => range.start === third!.end), 'the range after it was made before the jump')
})

t.test('setval never moves the sequence past a writer in flight', { skip: needsServer('a writer transaction open beside the keeper') }, async (t) => {
  const { url, client } = await database(t, 'close_writer')
  const writer = await connect(t, url)
  await writer.query('begin')
  await writer.query('insert into events (event_type) values (\'in flight\')')
  const [first] = await ranges(client)
  const drawn = await drawnOf(client)
  t.equal(await closeRange(client, drawn, first!.end, 200), false, 'a writer that drew, in flight: not now')
  t.equal(await drawnOf(client), drawn, 'the sequence did not move')
  await writer.query('commit')
  await writer.query('begin')
  await writer.query('savepoint s')
  await writer.query('insert into events (event_type) values (\'undone\')')
  await writer.query('rollback to savepoint s')
  t.equal(await closeRange(client, drawn + 1, first!.end, 200), false, 'a writer whose draw was rolled back to a savepoint: still in flight, not now')
  await writer.query('commit')
  t.equal(await drawnOf(client), drawn + 1)

  // A writer that draws after the census found none waits for the jump, and draws past it.
  await writer.query('begin')
  await writer.query('select 1 from events limit 1') // holds its snapshot, has drawn nothing
  await client.query('begin')
  await client.query(HOLD_SEQUENCE)
  const late = writer.query('insert into events (event_type) values (\'late\') returning event_id::text as id')
  await sleep(100)
  await client.query('select setval(\'events_event_id_seq\', $1::bigint)', [first!.end - 1])
  await client.query('commit')
  t.equal((await late).rows[0].id, String(first!.end), 'a draw waits while the sequence\'s owner is re-stated, then continues above the jump')
  await writer.query('commit')

  await client.query('select setval(\'events_event_id_seq\', $1::bigint)', [drawn + 1])
  t.equal(await closeRange(client, drawn + 1, first!.end, 200), true, 'no writer in flight: the jump')
  t.equal(await drawnOf(client), first!.end - 1)
  t.equal(await closeRange(client, first!.end - 1 - NEXTVAL_CLOSE_LIMIT - 5, first!.end, 200), false, 'the sequence already past the target: never backwards')
  t.equal(await drawnOf(client), first!.end - 1)

  // A drawer in flight holds the jump's lock off.
  await client.query('select setval(\'events_event_id_seq\', $1::bigint)', [drawn + 2])
  await writer.query('begin')
  await writer.query('select nextval(\'events_event_id_seq\')')
  const other = await connect(t, url)
  await other.query('begin')
  await other.query('set local lock_timeout = 100')
  await t.rejects(other.query(HOLD_SEQUENCE), { code: '55P03' }, 'a drawer in flight holds the jump\'s lock off')
  await other.query('rollback')
  await writer.query('commit')
  await other.query('begin')
  await other.query(HOLD_SEQUENCE)
  t.equal(await closeRange(client, drawn + 3, first!.end, 100), false, 'another jump in flight (ALTER SEQUENCE draws nothing, but takes the drawers\' lock too): not now')
  await other.query('rollback')
  // A drawer that comes between the census and the jump's lock is hard to time: a COMMENT in flight holds a
  // conflicting lock that the census does not count, and the jump gives up after its lock timeout the same way.
  await other.query('begin')
  await other.query('comment on sequence events_event_id_seq is \'busy\'')
  t.equal(await closeRange(client, drawn + 3, first!.end, 100), false, 'the sequence\'s lock busy: not now, after the lock timeout')
  await other.query('rollback')
  t.equal(await drawnOf(client), drawn + 3)

  // The jump needs the sequence's owner, as the rest of the keeper needs the table's.
  const role = `ocp_test_not_owner_${process.pid}`
  await client.query(`create role ${role}`)
  t.teardown(async () => { await client.query('reset role'); await client.query(`drop owned by ${role}`); await client.query(`drop role ${role}`) })
  await client.query(`grant select, update on events_event_id_seq to ${role}`)
  // The census is the keeper's (not executable by public): given, so that the jump itself is what fails.
  await client.query(`grant execute on function events_census(bigint, bigint, text[], bigint[], bigint[], bigint) to ${role}`)
  await client.query(`set role ${role}`)
  await t.rejects(closeRange(client, drawn + 3, first!.end, 100), { code: '42501' }, 'a role that does not own the sequence: the pass fails, and says why')
  await client.query('reset role')
})

t.test('with a retention: settled, expired ranges are dropped lowest first, and the floor raised in the same transaction', async (t) => {
  const { client } = await database(t, 'drop')
  const { keeper: keeping, log } = keeper({ retentionMs: 4000 })
  await client.query('insert into events (event_type, created_at) select \'old\', now() - interval \'1 hour\' from generate_series(1, 5)')
  await keeping.keep(client)
  t.equal(await floorOf(client), 0, 'the range is still open')
  await sleep(1100)
  await keeping.keep(client)
  t.equal(await floorOf(client), 5, 'closed, settled, expired: dropped at once; the floor is its highest id')
  t.equal((await one<{ n: number }>(client, 'select count(*)::int as n from events')).n, 0)
  t.match(log.lines.filter((line) => line.level === 'info'), [{ message: /partition dropped/, details: { partition: FIRST_PARTITION, historyFloor: 5 } }])
  t.equal(keeping.dropped, 1)

  // A younger event holds its range back until it expires too.
  const [next] = await ranges(client)
  const young = await one<{ id: string }>(client, 'insert into events (event_type, created_at) values (\'young\', now() - interval \'2 seconds\') returning event_id::text as id')
  await keeping.keep(client)
  t.equal((await ranges(client))[0]!.name, next!.name, 'not yet expired: kept')
  await sleep(2100)
  await keeping.keep(client)
  t.not((await ranges(client))[0]!.name, next!.name, 'expired: dropped')
  t.equal(await floorOf(client), Number(young.id))

  // The floor is never lowered; empty settled ranges go too.
  await client.query('update event_log_state set history_floor = 1000000000')
  const [empty] = await ranges(client)
  await client.query('select setval(\'events_event_id_seq\', $1)', [empty!.end + 10])
  await keeping.keep(client)
  t.not((await ranges(client))[0]!.name, empty!.name, 'a settled range the sequence skipped, empty, is dropped')
  t.equal(await floorOf(client), 1_000_000_000, 'the floor stays where it was')
  t.ok((await ranges(client)).length >= RANGES_AHEAD, 'ranges are still made ahead')
})

t.test('without a retention nothing is ever dropped or deleted', async (t) => {
  const { client } = await database(t, 'keep_all')
  const { keeper: keeping } = keeper()
  await client.query('insert into events (event_type, created_at) select \'ancient\', now() - interval \'10 years\' from generate_series(1, 5)')
  const [first] = await ranges(client)
  await client.query('insert into events (event_id, event_type, created_at) values ($1, \'ancient, in the default\', now() - interval \'10 years\')', [first!.end + 50_000_000])
  for (let pass = 0; pass < 3; pass++) await keeping.keep(client)
  t.equal((await one<{ n: number }>(client, 'select count(*)::int as n from events')).n, 6)
  t.equal(await floorOf(client), 0)
  t.equal(await drawnOf(client), first!.end + 50_000_000, 'and no range is closed')
})

t.test('expired rows of the default partition are deleted once below every range; nothing else is', async (t) => {
  const { client } = await database(t, 'default')
  const { keeper: keeping, log } = keeper({ retentionMs: 4000 })
  const [first, second] = await ranges(client)
  const past = second!.end + 100
  // Written while the keeper was away: past every range. Old, then young.
  await client.query(`insert into events (event_id, event_type, created_at) values
    ($1, 'old', now() - interval '1 hour'), ($2, 'old', now() - interval '1 hour'), ($3, 'young', now())`, [past, past + 1, past + 2])
  await keeping.keep(client)
  const left = (await client.query<{ id: string }>('select event_id::text as id from events order by event_id')).rows.map((row) => Number(row.id))
  t.same(left, [past + 2], 'the (empty) ranges below dropped; the expired default rows deleted; the young one kept')
  t.equal(await floorOf(client), past + 1)
  t.equal(keeping.deletedRows, 2)
  t.match(log.lines.filter((line) => /partition dropped/.test(line.message)), [{ level: 'info', details: { partition: first!.name } }, { details: { partition: second!.name } }])
  t.match(log.lines.filter((line) => /default partition/.test(line.message)), [{ level: 'info', details: { deleted: 2, historyFloor: past + 1 } }])
})

t.test('a busy events table: the keeper waits at most its lock timeout, says so, and tries again on the next pass', { skip: needsServer('a second session holding a lock') }, async (t) => {
  const { url, client } = await database(t, 'busy')
  const { keeper: keeping, log } = keeper({ retentionMs: 4000 })
  await client.query('insert into events (event_type, created_at) values (\'old\', now() - interval \'1 hour\')')
  const holder = await connect(t, url)
  await holder.query('begin')
  await holder.query(`lock table ${DEFAULT_PARTITION} in access share mode`)
  const top = (await ranges(client))[1]!.end
  await client.query('select setval(\'events_event_id_seq\', $1)', [top + 10]) // past every range
  await keeping.keep(client)
  t.match(log.lines.filter((line) => line.level === 'warn'), [
    { message: /busy \(lock_timeout\); a range ahead is made on a later pass/, details: { lockTimeoutMs: 200 } },
    { message: /busy \(lock_timeout\); events_initial, expired, is dropped on a later pass/ }
  ])
  t.equal(await floorOf(client), 0, 'nothing dropped')
  await holder.query('commit')
  await keeping.keep(client)
  t.equal(await floorOf(client), 1, 'the next pass does it')
  t.equal((await ranges(client))[0]!.start, top + 11 + NEXTVAL_CLOSE_LIMIT, 'and makes the ranges ahead, past the sequence and the ids in flight')
})

t.test('a pass that fails for another reason than a busy table fails (the keeper logs it and tries again)', async (t) => {
  const { client } = await database(t, 'conflict')
  const top = (await ranges(client))[1]!.end
  await client.query(`create table ${partitionName(top)} (x int)`)
  await client.query('select setval(\'events_event_id_seq\', $1)', [top - 10])
  await t.rejects(keeper().keeper.keep(client), /relation "events_from_\d+" already exists/)
})

t.test('without a default partition (an operator removed it) ranges are still made and dropped', async (t) => {
  const { client } = await database(t, 'no_default')
  await client.query(`drop table ${DEFAULT_PARTITION}`)
  const { keeper: keeping } = keeper({ retentionMs: 4000 })
  await client.query('insert into events (event_type, created_at) values (\'old\', now() - interval \'1 hour\')')
  await keeping.keep(client)
  await sleep(1100)
  await keeping.keep(client)
  t.equal(await floorOf(client), 1)
  t.equal(keeping.partitions, 1, 'one range left, no default')
  await client.query('select setval(\'events_event_id_seq\', $1)', [(await ranges(client))[0]!.end - 10])
  await keeping.keep(client)
  t.equal((await ranges(client)).length, 3)
})

t.test('a pass drops a few partitions at most; the next pass goes on', async (t) => {
  const { client } = await database(t, 'many')
  const { keeper: making } = keeper()
  for (let step = 0; step < 3; step++) {
    await client.query('select setval(\'events_event_id_seq\', $1)', [(await ranges(client)).at(-1)!.end - 10])
    await making.keep(client)
  }
  const made = await ranges(client)
  t.equal(made.length, 8)
  await client.query('select setval(\'events_event_id_seq\', $1)', [made.at(-1)!.end + 10])
  const { keeper: keeping } = keeper({ retentionMs: 4000 })
  await keeping.keep(client)
  t.equal(keeping.dropped, 4, 'every range is settled and empty: four go in this pass')
  await keeping.keep(client)
  t.equal(keeping.dropped, 8, 'the rest in the next')
})

t.test('the rate is measured over a sliding window', async (t) => {
  const { client } = await database(t, 'window')
  // Room for a slow machine: the first pass stays in the window however late the second comes, and 6000 ids over at most 5 s are still over 1000 a second.
  const { keeper: keeping } = keeper({ rateWindowMs: 5000 })
  await keeping.keep(client)
  await client.query('select nextval(\'events_event_id_seq\') from generate_series(1, 6000)')
  await sleep(1100)
  await keeping.keep(client)
  t.ok(keeping.rate > 1000, 'ids drawn within the window count')
  await sleep(4000) // the first pass is now over 5000 ms back
  await keeping.keep(client)
  t.equal(keeping.rate, 0, 'once they fall out of it, they do not')
})

t.test('the keeper leaves a table that is not partitioned alone', async (t) => {
  const { client } = await database(t, 'unpartitioned', '0003_event_order_without_lock')
  const { keeper: keeping } = keeper({ retentionMs: 4000 })
  await keeping.keep(client)
  t.equal(keeping.partitions, 0)
  t.equal(await listPartitions(client), undefined)
})
