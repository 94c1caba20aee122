import { createHash } from 'node:crypto'
import { DummyDriver, Kysely, PostgresAdapter, PostgresIntrospector, PostgresQueryCompiler, type Compilable } from 'kysely'
import type pg from 'pg'
import type { PipelinedConnections } from './pipeline.ts'
import { ReadPool } from './pool.ts'
import type { Database, Db } from './schema.ts'

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
 * (when each request did both, they were most of a small read's cost).
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
const sharedSessions = new WeakSet<pg.ClientBase>()

/** Reads asked of one pool through queryRow, and how many of them shared another read's statement. */
export interface ReadCounts {
  reads: number
  shared: number
}

/**
 * Identical reads arriving together share one statement. A read waits for
 * its turn of the event loop's I/O to be handled (setImmediate) and for a
 * connection (db/pipeline.ts's, or the pool's); until its statement is
 * sent, every read of the same statement with the same arguments that
 * arrives (a live UI's viewers refetching a run on the same event, a
 * dashboard's panels, a crowd queued for an exhausted pool) joins it, and
 * all take its row. The statement is sent only after every read that
 * shares it has arrived, so its snapshot is younger than each of them:
 * every read still sees every commit that came before it. A read arriving
 * once the statement is on its way starts another: joining a statement
 * already sent could answer it from a snapshot older than the read itself
 * (a client refetching on an event would not see that event's change).
 */
class Gathering {
  readonly counts: ReadCounts = { reads: 0, shared: 0 }
  readonly #waiting = new Map<string, Promise<unknown>>()
  /** The reads of this turn, sent together once its I/O is handled. */
  #turn: Array<() => void> | undefined
  /** The pool's pipelined connections, which take a turn's reads as one batch. */
  readonly #pipeline: PipelinedConnections | undefined

  readonly pool: pg.Pool

  constructor (pool: pg.Pool) {
    this.pool = pool
    this.#pipeline = pool instanceof ReadPool ? pool.pipeline : undefined
  }

  /** Sends this turn's reads at once: on pipelined connections, as one batch (db/pipeline.ts). */
  #send (read: () => void): void {
    if (this.#turn !== undefined) {
      this.#turn.push(read)
      return
    }
    const turn = this.#turn = [read]
    setImmediate(() => {
      this.#turn = undefined
      const sendAll = () => { for (const each of turn) each() }
      if (this.#pipeline === undefined) sendAll()
      else this.#pipeline.batch(sendAll)
    })
  }

  read<Row extends pg.QueryResultRow> (statement: Statement<unknown[]>, values: unknown[]): Promise<Row | undefined> {
    this.counts.reads++
    const key = `${statement.name} ${JSON.stringify(values)}`
    const waiting = this.#waiting.get(key)
    if (waiting !== undefined) {
      this.counts.shared++
      return waiting as Promise<Row | undefined>
    }
    const row = new Promise<Row | undefined>((resolve) => this.#send(() => {
      resolve(execute<Row>(this.pool, statement, values, () => this.#waiting.delete(key)))
    }))
    this.#waiting.set(key, row)
    return row
  }
}

const gatherings = new WeakMap<pg.Pool, Gathering>()

function gatheringOf (pool: pg.Pool): Gathering {
  let gathering = gatherings.get(pool)
  if (gathering === undefined) gatherings.set(pool, gathering = new Gathering(pool))
  return gathering
}

/** What queryRow has done on this pool so far (the metrics). */
export function readCounts (pool: pg.Pool): Readonly<ReadCounts> {
  return gatheringOf(pool).counts
}

/**
 * The first row of a statement, run as a prepared statement on one of the
 * pool's pipelined connections (or, without them, a pooled one), shared
 * with the identical reads that arrive with it. The row may be another
 * read's too: read it, never change it.
 */
export function queryRow<Row extends pg.QueryResultRow, Args extends unknown[]> (
  pool: pg.Pool, statement: Statement<Args>, ...args: Args
): Promise<Row | undefined> {
  return gatheringOf(pool).read<Row>(statement as Statement<unknown[]>, statement.values(args))
}

/**
 * The statement's first row, frozen: the reads that shared it all hold it.
 * `closed` is called once a connection is had (or refused), before the
 * statement is sent.
 */
async function execute<Row extends pg.QueryResultRow> (
  pool: pg.Pool, statement: Statement<unknown[]>, values: unknown[], closed: () => void
): Promise<Row | undefined> {
  const row = await firstRow<Row>(pool, statement, values, closed)
  return row === undefined ? undefined : Object.freeze(row)
}

async function firstRow<Row extends pg.QueryResultRow> (
  pool: pg.Pool, statement: Statement<unknown[]>, values: unknown[], closed: () => void
): Promise<Row | undefined> {
  if (pool instanceof ReadPool && pool.pipeline !== undefined) {
    return await pool.pipeline.run((client) => rowOf<Row>(client, statement, values), closed)
  }
  const client = await pool.connect().finally(closed)
  try {
    return await rowOf<Row>(client, statement, values)
  } finally {
    client.release()
  }
}

/** The statement's first row on `client`: prepared under its name, or unnamed on a shared session. */
async function rowOf<Row extends pg.QueryResultRow> (client: pg.ClientBase, statement: Statement<unknown[]>, values: unknown[]): Promise<Row | undefined> {
  if (!sharedSessions.has(client)) {
    try {
      return (await client.query<Row>({ name: statement.name, text: statement.text, values })).rows[0]
    } catch (err) {
      if ((err as { code?: unknown }).code !== DUPLICATE_PREPARED_STATEMENT) throw err
      sharedSessions.add(client)
    }
  }
  return (await client.query<Row>({ text: statement.text, values })).rows[0]
}
