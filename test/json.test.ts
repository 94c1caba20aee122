import { sql, type RawBuilder } from 'kysely'
import pg from 'pg'
import t from 'tap'
import { Type } from 'typebox'
import { jsonArray, jsonObject, rowJson } from '../db/json.ts'
import { builder } from '../db/statement.ts'
import { testDatabaseUrl } from './helpers/database.ts'

// The JSON of the response bodies and of the event envelope, built as text from the schemas (db/json.ts), evaluated by Postgres.

const Thing = Type.Object({
  id: Type.String(),
  note: Type.Optional(Type.String()),
  count: Type.Optional(Type.Integer()),
  raw: Type.Unknown(),
  at: Type.String({ format: 'date-time' }),
  parts: Type.Array(Type.String()),
  extras: Type.Optional(Type.Array(Type.String()))
}, { $id: 'Thing' })

let client: pg.Client
t.before(async () => {
  client = new pg.Client({ connectionString: await testDatabaseUrl() })
  client.on('error', () => {}) // cut when the file's database is dropped
  await client.connect()
  t.teardown(() => client.end())
})

/** The text `expression` evaluates to over one row `h` of the given columns. */
async function evaluate (expression: RawBuilder<string>, row: RawBuilder<unknown>): Promise<string> {
  const compiled = sql`select ${expression} as json from (${row}) as h`.compile(builder)
  const result = await client.query(compiled.sql, [...compiled.parameters])
  return result.rows[0].json
}

const thing = (id: string, note: string | null, count: number | null, raw: string) =>
  sql`select ${id}::text as id, ${note}::text as note, ${count}::int as count, ${raw}::jsonb as raw, timestamptz '2026-11-21 09:28:40.1234+00' as at`

t.test('a row as a JSON object: every field of the schema, escaped, optional ones left out when NULL', async (t) => {
  const object = rowJson(Thing, 'h', { parts: sql`'["a"]'` })
  const id = 'quote " backslash \\ newline \n tab \t é 😀 \u0001'
  const raw = '{"big": 12345678901234567890, "inner": null, "list": [1, null]}'
  const full = await evaluate(object, thing(id, 'a note', 7, raw))
  t.same(JSON.parse(full), {
    id, note: 'a note', count: 7, raw: JSON.parse(raw), at: '2026-11-21T09:28:40.123400Z', parts: ['a']
  })
  t.match(full, /"big": 12345678901234567890[,}]/, 'raw JSON as jsonb prints it: no rounding')
  const sparse = await evaluate(object, thing('x', null, null, 'null'))
  t.same(JSON.parse(sparse), { id: 'x', raw: null, at: '2026-11-21T09:28:40.123400Z', parts: ['a'] }, 'NULL optional fields are left out, a raw JSON null kept')
  t.notMatch(sparse, /note|count|extras/)
})

t.test('a schema with no required field, or no field at all', async (t) => {
  const Notes = Type.Object({ note: Type.Optional(Type.String()), other: Type.Optional(Type.String()) })
  const row = (note: string | null, other: string | null) => sql`select ${note}::text as note, ${other}::text as other`
  t.equal(await evaluate(rowJson(Notes, 'h'), row(null, null)), '{}')
  t.same(JSON.parse(await evaluate(rowJson(Notes, 'h'), row(null, 'b'))), { other: 'b' })
  t.same(JSON.parse(await evaluate(rowJson(Notes, 'h'), row('a', 'b'))), { note: 'a', other: 'b' })
  t.equal(await evaluate(rowJson(Type.Object({}), 'h'), row(null, null)), '{}')
})

t.test('a required nested field must be given', async (t) => {
  t.throws(() => rowJson(Thing, 'h'), /Thing\.parts is nested and must be given/)
  t.throws(() => rowJson(Type.Object({ items: Type.Array(Type.String()) }), 'h'), /schema\.items is nested/)
})

t.test('objects of fixed keys, and arrays over rows, in order, filtered, [] when empty', async (t) => {
  const numbers = sql`select n from generate_series(1, 5) as n`
  const over = (aggregate: RawBuilder<string>) => sql<string>`(select ${aggregate} from (${numbers}) as g)`
  const odd = jsonArray(sql`g.n::text`, sql`g.n desc`, sql`g.n % 2 = 1`)
  const none = jsonArray(sql`g.n::text`, sql`g.n`, sql`g.n > 9`)
  const text = await evaluate(jsonObject({ odd: over(odd), none: over(none), all: over(jsonArray(sql`g.n::text`, sql`g.n`)) }), sql`select 1`)
  t.same(JSON.parse(text), { odd: [5, 3, 1], none: [], all: [1, 2, 3, 4, 5] })
})
