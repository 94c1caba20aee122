import { createHash } from 'node:crypto'
import { DummyDriver, Kysely, PostgresAdapter, PostgresIntrospector, PostgresQueryCompiler, type Compilable } from 'kysely'
import type pg from 'pg'
import type { Database, Db } from './schema.js'

/*
 * How a read runs: a statement built once, at startup, with a query
 * builder that never executes anything, then run through the pool as a
 * prepared statement. The reads themselves are in db/queries.ts.
 */

/** Builds statements only: they run through the pool (queryRow), never through a Kysely driver. */
export const builder: Db = new Kysely<Database>({
  dialect: {
    createAdapter: () => new PostgresAdapter(),
    createDriver: () => new DummyDriver(),
    /* c8 ignore next: Kysely asks for it only to introspect the schema, which this builder never does */
    createIntrospector: (db) => new PostgresIntrospector(db),
    createQueryCompiler: () => new PostgresQueryCompiler()
  }
})

/** What an argument is built with: the compiled statement's parameter that holds it says which argument goes there. */
const placeholder = (i: number) => `\u0000argument ${i}\u0000`

/**
 * A read built once, at startup, into one SQL text whose parameters are the
 * read's arguments, and run as a prepared statement named after that text:
 * Postgres parses and plans it once per connection rather than once per
 * request, and no request pays for building and compiling the query
 * (BENCHMARKS.md: together, most of a small run detail's cost).
 */
export class Statement<Args extends unknown[]> {
  readonly name: string
  readonly text: string
  readonly #slots: Array<{ argument: number } | { constant: unknown }>

  constructor (arity: number, build: (...args: Args) => Compilable<unknown>) {
    const placeholders = Array.from({ length: arity }, (_, i) => placeholder(i))
    const compiled = build(...(placeholders as unknown as Args)).compile()
    this.text = compiled.sql
    this.name = `ocp_${createHash('sha256').update(compiled.sql).digest('hex').slice(0, 24)}`
    this.#slots = compiled.parameters.map((value) => {
      const argument = placeholders.indexOf(value as string)
      return argument >= 0 ? { argument } : { constant: value }
    })
  }

  values (args: Args): unknown[] {
    return this.#slots.map((slot) => 'argument' in slot ? args[slot.argument] : slot.constant)
  }
}

/** SQLSTATE duplicate_prepared_statement. */
const DUPLICATE_PREPARED_STATEMENT = '42P05'

/**
 * Connections whose server session is shared with other connections (a
 * pooler handing one server session to several clients): there a statement
 * name may already have been prepared by another connection, so they run
 * statements unnamed. (The embedded database's bridge gives each connection
 * names of its own, as a server does.)
 */
const sharedSessions = new WeakSet<pg.PoolClient>()

/** The first row of a statement, run on a pooled connection as a prepared statement. */
export async function queryRow<Row extends pg.QueryResultRow, Args extends unknown[]> (
  pool: pg.Pool, statement: Statement<Args>, ...args: Args
): Promise<Row | undefined> {
  const values = statement.values(args)
  const client = await pool.connect()
  try {
    if (!sharedSessions.has(client)) {
      try {
        return (await client.query<Row>({ name: statement.name, text: statement.text, values })).rows[0]
      } catch (err) {
        if ((err as { code?: unknown }).code !== DUPLICATE_PREPARED_STATEMENT) throw err
        sharedSessions.add(client)
      }
    }
    return (await client.query<Row>({ text: statement.text, values })).rows[0]
  } finally {
    client.release()
  }
}
