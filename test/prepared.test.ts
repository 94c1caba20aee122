import { sql } from 'kysely'
import pg from 'pg'
import t, { type Test } from 'tap'
import { builder, queryRow, readCounts, Statement } from '../db/statement.ts'
import { testDatabaseUrl, testPool } from './helpers/database.ts'
import { waitUntil } from './helpers/wait.ts'

// The reads run as prepared statements named after their text (db/queries.ts).

/** A statement with two arguments and a constant (the LIMIT), in an order of its own. */
const repeat = (marker: string) => new Statement(2, (word: string, times: number) => builder
  .selectNoFrom([sql<string>`repeat(${word}, ${times}::int)`.as('text'), sql.lit(marker).as('marker')])
  .limit(1))

async function onePool (t: Test): Promise<pg.Pool> {
  const pool = testPool(await testDatabaseUrl(), 1)
  t.teardown(() => pool.end())
  return pool
}

t.test('a statement is built once and runs prepared under a name taken from its text', async (t) => {
  const statement = repeat('named')
  t.match(statement.name, /^ocp_[0-9a-f]{24}$/)
  t.equal(repeat('named').name, statement.name, 'the same text, the same name')
  t.not(repeat('other').name, statement.name, 'another text, another name')
  t.same(statement.values(['ab', 3]), ['ab', 3, 1], 'each argument in its place, the constant kept')

  const pool = await onePool(t)
  t.same(await queryRow(pool, statement, 'ab', 3), { text: 'ababab', marker: 'named' })
  t.same(await queryRow(pool, statement, 'x', 2), { text: 'xx', marker: 'named' }, 'and again, with other arguments')
  const prepared = await pool.query('select name from pg_prepared_statements where name = $1', [statement.name])
  t.equal(prepared.rowCount, 1, 'prepared on the connection, once')
})

t.test('a connection whose session already holds the name (a shared session) runs statements unnamed', async (t) => {
  const statement = repeat('shared')
  const pool = await onePool(t)
  // As another connection of a shared session would have left it:
  await pool.query(`prepare "${statement.name}" as select 'someone else''s' as text`)
  t.same(await queryRow(pool, statement, 'ab', 2), { text: 'abab', marker: 'shared' }, 'the right answer, not the name\'s holder')
  t.same(await queryRow(pool, statement, 'c', 1), { text: 'c', marker: 'shared' }, 'and from then on')
})

t.test('an error of the statement reaches the caller, and the connection goes back to the pool', async (t) => {
  const pool = await onePool(t)
  await t.rejects(queryRow(pool, repeat('failing'), 'ab', 'not a number' as unknown as number), { code: '22P02' })
  t.same(await queryRow(pool, repeat('after'), 'ok', 1), { text: 'ok', marker: 'after' })
})

/** The rows tagged `tag` in gathered_rows, with the server's clock, then a sleep of `seconds`. */
const countAfterSleep = new Statement(2, (tag: string, seconds: number) => builder
  .selectNoFrom([
    sql<string>`(select count(*) from gathered_rows where tag = ${tag})::text`.as('rows'),
    sql<string>`clock_timestamp()::text`.as('at'),
    sql<string>`pg_sleep(${seconds}::float8)::text`.as('slept')
  ]))

async function tablePool (t: Test): Promise<pg.Pool> {
  const pool = await onePool(t)
  await pool.query('create table if not exists gathered_rows (tag text not null)')
  return pool
}

t.test('identical reads arriving together share one statement, and its row', async (t) => {
  const pool = await tablePool(t)
  await pool.query("insert into gathered_rows values ('together')")
  const before = { ...readCounts(pool) }
  const [first, second, other] = await Promise.all([
    queryRow(pool, countAfterSleep, 'together', 0),
    queryRow(pool, countAfterSleep, 'together', 0),
    queryRow(pool, countAfterSleep, 'apart', 0)
  ])
  t.equal(first, second, 'the same row: one statement ran for both')
  t.ok(Object.isFrozen(first), 'frozen: no read can change it under another')
  t.same(first, { rows: '1', at: first?.at, slept: '' })
  t.not(other?.at, first?.at, 'other arguments, a statement of their own')
  t.same(readCounts(pool), { reads: before.reads + 3, shared: before.shared + 1 })
})

/** Whether a statement of this file's database sleeps in pg_sleep right now: it has its snapshot (taken before it runs). */
async function sleepingStatement (admin: pg.Pool): Promise<boolean> {
  const { rowCount } = await admin.query(`select 1 from pg_stat_activity
    where datname = current_database() and pid <> pg_backend_pid() and wait_event = 'PgSleep'`)
  return rowCount === 1
}

t.test('a read arriving once the identical statement is on its way runs its own, and sees what committed before it', async (t) => {
  const pool = await tablePool(t)
  const writer = await onePool(t)
  const early = queryRow(pool, countAfterSleep, 'later', 0.3)
  let earlyAnswered = false
  void early.then(() => { earlyAnswered = true }, () => {})
  // Its snapshot taken: it sleeps in its statement, or (on a slow machine) is already answered.
  await waitUntil(async () => earlyAnswered || await sleepingStatement(writer), 'the early read\'s statement to run')
  await writer.query("insert into gathered_rows values ('later')")
  const late = queryRow(pool, countAfterSleep, 'later', 0.3)
  t.same((await early)?.rows, '0', 'the early read: its snapshot before the commit')
  t.same((await late)?.rows, '1', 'the late read: not the early one\'s row, a snapshot after the commit')
})

t.test('identical reads waiting for a connection share the statement until it is sent', async (t) => {
  const pool = await tablePool(t)
  const writer = await onePool(t)
  // The pool's only connection, held until the test cancels the statement (a fixed hold could end before the second read arrives).
  const holding = t.rejects(queryRow(pool, countAfterSleep, 'holding', 60), { code: '57014' }, 'the holding read, cancelled, gives the connection back')
  await waitUntil(() => sleepingStatement(writer), 'the holding read to take the connection')
  const before = { ...readCounts(pool) }
  const first = queryRow(pool, countAfterSleep, 'queued', 0)
  await new Promise((resolve) => setTimeout(resolve, 50)) // turns later: the first read waits for the connection
  await writer.query("insert into gathered_rows values ('queued')")
  const second = queryRow(pool, countAfterSleep, 'queued', 0)
  await writer.query(`select pg_cancel_backend(pid) from pg_stat_activity
    where datname = current_database() and pid <> pg_backend_pid() and wait_event = 'PgSleep'`)
  await holding
  const [a, b] = await Promise.all([first, second])
  t.equal(a, b, 'one statement for both')
  t.equal(a?.rows, '1', 'sent once both had arrived: it sees the row committed between them')
  t.same(readCounts(pool), { reads: before.reads + 2, shared: before.shared + 1 })
})

t.test('a read whose connection is refused leaves no statement behind for the next', async (t) => {
  const pool = new pg.Pool({ connectionString: 'postgres://postgres@127.0.0.1:1/none', connectionTimeoutMillis: 2000 })
  t.teardown(() => pool.end())
  await t.rejects(queryRow(pool, repeat('refused'), 'ab', 1))
  await t.rejects(queryRow(pool, repeat('refused'), 'ab', 1), 'a statement of its own, refused again')
  t.same(readCounts(pool), { reads: 2, shared: 0 })
})

t.test('an error of a shared statement reaches every read that shared it', async (t) => {
  const pool = await onePool(t)
  const failing = repeat('shared failure')
  const reads = [queryRow(pool, failing, 'ab', 'x' as unknown as number), queryRow(pool, failing, 'ab', 'x' as unknown as number)]
  for (const read of reads) await t.rejects(read, { code: '22P02' })
})
