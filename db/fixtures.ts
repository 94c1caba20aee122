import { Ajv, type ErrorObject } from 'ajv'
import addFormats from 'ajv-formats'
import { readFile } from 'node:fs/promises'
import { Type, type Static, type TSchema } from 'typebox'
import type { Transaction } from 'kysely'
import type { Database } from './schema.ts'
import type { Writer } from './writer.ts'

/*
 * Fixtures: a JSON document of rows for the seven tables, loaded in one
 * transaction, idempotently (rows whose key exists are left as they are, so
 * loading twice changes nothing). A bad document is refused whole, with
 * the path of the first problem in it (`tasks[3].status is required`), and
 * nothing is written. Events need their event_id, since that is their key.
 *
 * The row schemas below restate the tables' columns: a JSON Schema is needed
 * at run time, and db/schema.ts is types only. test/fixtures.test.ts holds
 * them to the migrated tables and to db/schema.ts.
 */

const Text = Type.String()
/** A text column with a default (''): a row may leave it out. */
const TextWithDefault = Type.Optional(Text)
const OptionalText = Type.Optional(Type.Union([Type.String(), Type.Null()]))
const Timestamp = Type.Optional(Type.String({ format: 'date-time' }))
const AnyJson = Type.Unknown()
const row = <Properties extends Record<string, TSchema>>(properties: Properties) => Type.Object(properties, { additionalProperties: false })

const tables = {
  runs: row({ run_id: Text, goal: Text, summary: TextWithDefault, status: Text, created_at: Timestamp, updated_at: Timestamp }),
  tasks: row({
    run_id: Text,
    task_id: Text,
    title: Text,
    summary: TextWithDefault,
    status: Text,
    default_to: OptionalText,
    priority: Text,
    acceptance_json: AnyJson,
    latest_attempt_no: Type.Optional(Type.Union([Type.Integer(), Type.Null()])),
    created_at: Timestamp,
    updated_at: Timestamp
  }),
  task_attempts: row({
    run_id: Text,
    task_id: Text,
    attempt_no: Type.Integer(),
    assigned_to: Text,
    thread_id: Text,
    base_ref: OptionalText,
    base_commit: OptionalText,
    branch_name: OptionalText,
    worktree_path: OptionalText,
    workspace_status: OptionalText,
    result_commit: OptionalText,
    status: Text,
    created_at: Timestamp,
    updated_at: Timestamp
  }),
  threads: row({
    thread_id: Text,
    run_id: Text,
    task_id: Text,
    subject: Text,
    created_by: Text,
    assigned_to: Text,
    status: Text,
    priority: Text,
    latest_message_id: OptionalText,
    created_at: Timestamp,
    updated_at: Timestamp
  }),
  messages: row({
    message_id: Text, thread_id: Text, from_agent: Text, to_agent: Text, kind: Text, summary: Text, body: Text, payload_json: AnyJson, created_at: Timestamp
  }),
  artifacts: row({ artifact_id: Text, message_id: Text, path: Text, kind: Text, metadata_json: AnyJson, created_at: Timestamp }),
  events: row({
    event_id: Type.Integer({ minimum: 1 }),
    event_type: Text,
    run_id: TextWithDefault,
    task_id: TextWithDefault,
    thread_id: TextWithDefault,
    summary: TextWithDefault,
    payload: Type.Optional(AnyJson),
    created_at: Timestamp
  })
}

type Table = keyof typeof tables
/** A fixture row of each table, as its schema above admits it. */
export type FixtureRows = { [T in Table]: Static<typeof tables[T]> }
/** Tables in the order rows must go in (each after those it references). */
export const TABLES = Object.keys(tables) as Table[]

export const FixtureSchema = Type.Object(
  Object.fromEntries(TABLES.map((table) => [table, Type.Optional(Type.Array(tables[table]))])),
  { additionalProperties: false }
)

export type Row = Record<string, unknown>
export type Fixture = Partial<Record<Table, Row[]>>

export class FixtureError extends Error {
  override name = 'FixtureError'
}

const ajv = new Ajv({ allErrors: false, strict: false })
addFormats.default(ajv)
const validateShape = ajv.compile(FixtureSchema)

/** `/tasks/3/status` as `tasks[3].status`. */
function pathOf (pointer: string, property?: string): string {
  const parts = pointer.split('/').slice(1).map((part) => part.replaceAll('~1', '/').replaceAll('~0', '~'))
  if (property !== undefined) parts.push(property)
  return parts.reduce((path, part) => /^\d+$/.test(part) ? `${path}[${part}]` : path === '' ? part : `${path}.${part}`, '') || '(document)'
}

function describe (error: ErrorObject): string {
  if (error.keyword === 'required') return `${pathOf(error.instancePath, (error.params as { missingProperty: string }).missingProperty)} is required`
  if (error.keyword === 'additionalProperties') {
    return `${pathOf(error.instancePath, (error.params as { additionalProperty: string }).additionalProperty)} is not a column of this table`
  }
  return `${pathOf(error.instancePath)} ${error.message!}`
}

/** Parses and checks a fixture document's shape; throws a FixtureError naming the path of the problem. */
export function parseFixture (text: string): Fixture {
  let document: unknown
  try {
    document = JSON.parse(text)
  } catch (err) {
    throw new FixtureError(`invalid JSON: ${(err as Error).message}`)
  }
  // (A raw JSON column such as acceptance_json is required too: present, even if null.)
  if (!validateShape(document)) throw new FixtureError(describe(validateShape.errors![0]!))
  return document as Fixture
}

/**
 * The references the database enforces, checked first so that a dangling
 * one is reported by its path. `key` is the key a row points at, in a form
 * that compares equal to the same key of the target row.
 */
interface Reference {
  table: Table
  target: Table
  key: (row: Row) => string
  describe: string
  inDatabase: (trx: Transaction<Database>, row: Row) => Promise<unknown>
}
const references: Reference[] = [
  {
    table: 'tasks',
    target: 'runs',
    key: (r) => JSON.stringify([r.run_id]),
    describe: 'run_id names no run',
    inDatabase: (trx, r) => trx.selectFrom('runs').select('run_id').where('run_id', '=', r.run_id as string).executeTakeFirst()
  },
  {
    table: 'task_attempts',
    target: 'tasks',
    key: (r) => JSON.stringify([r.run_id, r.task_id]),
    describe: 'run_id and task_id name no task',
    inDatabase: (trx, r) => trx.selectFrom('tasks').select('task_id')
      .where('run_id', '=', r.run_id as string).where('task_id', '=', r.task_id as string).executeTakeFirst()
  },
  {
    table: 'messages',
    target: 'threads',
    key: (r) => JSON.stringify([r.thread_id]),
    describe: 'thread_id names no thread',
    inDatabase: (trx, r) => trx.selectFrom('threads').select('thread_id').where('thread_id', '=', r.thread_id as string).executeTakeFirst()
  },
  {
    table: 'artifacts',
    target: 'messages',
    key: (r) => JSON.stringify([r.message_id]),
    describe: 'message_id names no message',
    inDatabase: (trx, r) => trx.selectFrom('messages').select('message_id').where('message_id', '=', r.message_id as string).executeTakeFirst()
  }
]

const JSON_COLUMNS = new Set(['acceptance_json', 'payload_json', 'metadata_json', 'payload'])

/** A row as the driver should send it: JSON columns as JSON text (pg would turn a JS array into a Postgres array). */
const toDatabase = (entry: Row): Row => Object.fromEntries(Object.entries(entry)
  .map(([column, value]) => [column, JSON_COLUMNS.has(column) ? JSON.stringify(value ?? null) : value]))

export interface LoadOutcome {
  /** Rows written per table; rows whose key already existed are not counted. */
  inserted: Record<string, number>
}

/** Loads a fixture in one transaction: all of it, idempotently, or nothing. */
export async function loadFixture (db: Writer, fixture: Fixture): Promise<LoadOutcome> {
  return db.transaction().execute(async (trx) => {
    for (const reference of references) {
      // The target rows' own key has the same columns (run_id; run_id and task_id; thread_id; message_id).
      const known = new Set((fixture[reference.target] ?? []).map(reference.key))
      for (const [index, entry] of (fixture[reference.table] ?? []).entries()) {
        const key = reference.key(entry)
        if (known.has(key)) continue
        if (await reference.inDatabase(trx, entry) === undefined) {
          throw new FixtureError(`${reference.table}[${index}]: ${reference.describe} (neither in the fixture nor in the database)`)
        }
        known.add(key)
      }
    }
    const inserted: Record<string, number> = {}
    for (const table of TABLES) {
      const rows = fixture[table] ?? []
      if (rows.length === 0) continue
      const result = await trx.insertInto(table).values(rows.map(toDatabase) as never).onConflict((conflict) => conflict.doNothing()).executeTakeFirst()
      inserted[table] = Number(result.numInsertedOrUpdatedRows)
    }
    return { inserted }
  })
}

/** Reads, checks and loads a fixture file. */
export async function loadFixtureFile (db: Writer, path: string): Promise<LoadOutcome> {
  const text = await readFile(path, 'utf8').catch((err: NodeJS.ErrnoException) => { throw new FixtureError(`cannot read ${path}: ${err.code}`) })
  return loadFixture(db, parseFixture(text))
}
