import { sql } from 'kysely'
import pg from 'pg'
import t, { type Test } from 'tap'
import { builder, queryRow, Statement } from '../db/statement.js'
import { testDatabaseUrl } from './helpers/database.js'

// The reads run as prepared statements named after their text (db/queries.ts).

/** A statement with two arguments and a constant (the LIMIT), in an order of its own. */
const repeat = (marker: string) => new Statement(2, (word: string, times: number) => builder
  .selectNoFrom([sql<string>`repeat(${word}, ${times}::int)`.as('text'), sql.lit(marker).as('marker')])
  .limit(1))

async function onePool (t: Test): Promise<pg.Pool> {
  const pool = new pg.Pool({ connectionString: await testDatabaseUrl(), max: 1 })
  pool.on('error', () => {}) // an idle connection cut when the file's database is dropped
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
