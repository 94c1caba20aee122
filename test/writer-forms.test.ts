import pg from 'pg'
import t from 'tap'
import { testDatabaseUrl } from './helpers/database.ts'

// Every way Postgres lets a writer put an event in the table, against the
// rule of the settle mark (db/sql/event-ids.sql, docs/orchestrators.md, "How to write an event"):
// either the event is settled only once its writer has ended, so that every
// stream gets it in order, or the insert fails, naming event_id and saying
// what to do. The keeper's ticks are run here by hand (no service runs on
// this file's database), so each step is deterministic.

async function session () {
  const client = new pg.Client({ connectionString: await testDatabaseUrl() })
  await client.connect()
  t.teardown(() => client.end())
  return client
}

const one = async <T = Record<string, string>>(client: pg.Client, text: string, values: unknown[] = []) => (await client.query(text, values)).rows[0] as T

t.test('the forms a writer may use, and those refused', async (t) => {
  const keeper = await session()
  const tick = async () => Number((await one<{ settled: string }>(keeper, 'select settled::text from events_keep_order()')).settled)
  const settled = async () => Number((await one<{ p: string }>(keeper, 'select events_settled(0)::text as p')).p)
  const insert = async (client: pg.Client, type: string, id?: number | string) => Number((await one<{ event_id: string }>(client,
    id === undefined ? 'insert into events (event_type) values ($1) returning event_id' : `insert into events (event_id, event_type) values (${id}, $1) returning event_id`, [type])).event_id)
  const refusal = { code: '23514', column: 'event_id', constraint: 'events_event_id_drawn_by_its_writer', message: /event_id \d+ cannot be inserted: the event log has settled every id up to \d+/, hint: /leave event_id out/ }

  const writer = await session()
  const other = await session()
  await insert(writer, 'base')
  await tick()
  await tick()

  await t.test('nextval first, the insert later in the same transaction (SQLAlchemy\'s explicit Sequence): waited for, then delivered', async (t) => {
    await writer.query('begin')
    const drawn = Number((await one(writer, "select nextval('events_event_id_seq')::text as id")).id)
    const above = await insert(other, 'committed_above')
    await tick()
    await tick()
    t.ok(await settled() < drawn, `the id drawn (${drawn}) holds the settled position while its writer is open, though ${above} committed above it`)
    t.equal(await insert(writer, 'nextval_first', drawn), drawn, 'the insert of the drawn id is accepted')
    await writer.query('commit')
    await tick()
    t.ok(await settled() >= above, 'settled past both once it commits')
  })

  await t.test('nextval inline in the insert (an ORM\'s rendered default): delivered', async (t) => {
    const id = await insert(writer, 'inline', "nextval('events_event_id_seq')")
    await tick()
    t.ok(await settled() >= id)
  })

  await t.test('an id drawn by one transaction and inserted by another (Hibernate\'s pooled and hi/lo ids)', async (t) => {
    const early = Number((await one(other, "select nextval('events_event_id_seq')::text as id")).id)
    await writer.query('begin')
    t.equal(await insert(writer, 'drawn_elsewhere_early', early), early, 'before a tick has settled the id, the insert is accepted')
    await insert(other, 'above_early')
    await tick()
    await tick()
    t.ok(await settled() < early, 'and the inserting transaction is waited for like a writer that drew it')
    await writer.query('commit')

    const late = Number((await one(other, "select nextval('events_event_id_seq')::text as id")).id)
    await tick()
    await tick()
    await t.rejects(insert(writer, 'drawn_elsewhere', late), refusal, 'once settled as a hole, refused with an error that names event_id and says what to do')
  })

  await t.test('an explicit id into a hole a rolled-back writer left', async (t) => {
    await writer.query('begin')
    const hole = await insert(writer, 'rolled_back')
    await writer.query('rollback')
    await insert(other, 'after_the_hole')
    await tick()
    await tick()
    t.ok(await settled() >= hole, 'the hole is settled')
    await t.rejects(insert(writer, 'into_the_hole', hole), refusal, 'so filling it is refused')
  })

  await t.test('an explicit id a deleted event had: refused once settled, even past a mark held back', async (t) => {
    // A reader of the sequence left idle: the census counts it in flight, below every id drawn since.
    const reader = await session()
    await reader.query('begin')
    await reader.query('select pg_sequence_last_value(\'events_event_id_seq\')')
    await tick()
    const deleted = await insert(other, 'deleted')
    t.ok(await tick() >= deleted, 'the tick settles the run of visible ids above what its census holds back')
    await reader.query('commit')
    await other.query('delete from events where event_id = $1', [deleted])
    await t.rejects(insert(writer, 'reinserted', deleted), refusal, 'so its id is refused: streams have passed it')
  })

  await t.test('an explicit id above the sequence (a fixture): moves the sequence past it, and is waited for', async (t) => {
    const top = Number((await one(keeper, 'select last_value::text as v from events_event_id_seq')).v)
    await writer.query('begin')
    t.equal(await insert(writer, 'fixture', top + 100), top + 100)
    await tick()
    t.ok(await settled() < top + 100, 'not settled while its writer is open')
    await writer.query('commit')
    t.equal(await insert(other, 'after_fixture'), top + 101, 'the sequence moved past it')
    await tick()
    t.ok(await settled() >= top + 101)
  })

  await t.test('COPY and multi-row inserts: each row as its form says', async (t) => {
    const rows = await writer.query("insert into events (event_type) values ('multi'), ('multi'), ('multi') returning event_id")
    t.equal(rows.rowCount, 3, 'a multi-row insert draws each id')
    const copied = await writer.query('copy events (event_type) from program \'printf "copied\\ncopied\\n"\'')
    t.equal(copied.rowCount, 2, 'COPY with the id left out draws each id')
    await tick()
    await tick()
    t.ok(await settled() >= Number(rows.rows[2].event_id) + 2, 'all settled')
    const hole = Number((await one(other, "select nextval('events_event_id_seq')::text as id")).id)
    await tick()
    await tick()
    await t.rejects(writer.query(`copy events (event_id, event_type) from program 'printf "${hole}\\tcopied_late\\n"'`), refusal, 'COPY of a settled id is refused')
    await t.rejects(writer.query(`insert into events (event_id, event_type) select ${hole}, 'bulk_late'`), refusal, 'and so is an insert ... select')
  })

  await t.test('a savepoint rolled back keeps its writer waited for', async (t) => {
    await writer.query('begin')
    await writer.query('savepoint s')
    const undone = await insert(writer, 'in_savepoint')
    await writer.query('rollback to savepoint s')
    await insert(other, 'above_savepoint')
    await tick()
    await tick()
    t.ok(await settled() < undone, 'the transaction still holds the sequence: its later ids may be below what commits meanwhile')
    const kept = await insert(writer, 'after_savepoint')
    await writer.query('commit')
    await tick()
    t.ok(await settled() >= kept)
  })

  await t.test('an event id never changes', async (t) => {
    const id = await insert(writer, 'fixed')
    await t.rejects(writer.query('update events set event_id = event_id + 1000000 where event_id = $1', [id]),
      { code: '23514', column: 'event_id', message: /cannot be changed/ })
    await writer.query("update events set summary = 'edited' where event_id = $1", [id])
    t.pass('other columns may change (streams do not send the change)')
  })

  await t.test('a reader of the sequence: who is waited for', async (t) => {
    const reader = await session()
    await reader.query('begin')
    await reader.query('select last_value from events_event_id_seq')
    await tick()
    const plain = await insert(other, 'plain_read')
    await tick()
    await tick()
    t.ok(await settled() >= plain, 'a SELECT from the sequence takes no lock a writer takes: nothing waits for it')
    await reader.query("select pg_sequence_last_value('events_event_id_seq')")
    await tick()
    const { census_writers: writers } = await one<{ census_writers: string[] }>(keeper, 'select census_writers from event_log_state')
    t.equal(writers.length, 1, 'pg_sequence_last_value (and so the pg_sequences view) takes the lock nextval takes: Postgres cannot tell it from a writer, and docs/stream.md says it is waited for')
    await reader.query('commit')
  })
})
