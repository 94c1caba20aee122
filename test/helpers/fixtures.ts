import { sql, type Insertable, type Kysely } from 'kysely'
import t from 'tap'
import { TABLES } from '../../db/fixtures.ts'
import { createDb } from '../../db/pool.ts'
import type {
  ArtifactsTable, Database, MessagesTable, RunsTable, TaskAttemptsTable, TasksTable, ThreadsTable
} from '../../db/schema.ts'
import { testDatabaseUrl, testPool } from './database.ts'

/*
 * Test data, written the way an orchestrator would: through a connection
 * of its own with write rights (the service's pool cannot write).
 */

let writerDb: Promise<Kysely<Database>> | undefined

/** A read-write connection to this file's database, closed when the file ends. */
export function writer (): Promise<Kysely<Database>> {
  writerDb ??= (async () => {
    const pool = testPool(await testDatabaseUrl(), 4)
    const db = createDb(pool)
    t.teardown(() => db.destroy())
    return db
  })()
  return writerDb
}

let clock = Date.parse('2026-01-01T00:00:00.000Z')
/** Strictly increasing timestamps, one second apart, so creation order is known. */
export const tick = (): string => new Date(clock += 1000).toISOString()

let sequence = 0
export const uid = (prefix: string) => `${prefix}-${++sequence}`

/** A raw JSON column value: pg must get JSON text (it would turn a JS array into a Postgres array). */
export const json = (value: unknown) => JSON.stringify(value)

export const makeRun = (fields: Partial<Insertable<RunsTable>> = {}): Insertable<RunsTable> => {
  const at = tick()
  return { run_id: uid('run'), goal: 'Ship the feature', summary: 'A run', status: 'running', created_at: at, updated_at: at, ...fields }
}

export const makeTask = (fields: Partial<Insertable<TasksTable>> & Pick<Insertable<TasksTable>, 'run_id'>): Insertable<TasksTable> => {
  const at = tick()
  return {
    task_id: uid('task'),
    title: 'Do the thing',
    summary: 'A task',
    status: 'ready',
    default_to: null,
    priority: 'normal',
    acceptance_json: json({ criteria: ['it works'] }),
    latest_attempt_no: null,
    created_at: at,
    updated_at: at,
    ...fields
  }
}

export const makeAttempt = (
  fields: Partial<Insertable<TaskAttemptsTable>> & Pick<Insertable<TaskAttemptsTable>, 'run_id' | 'task_id' | 'thread_id'>
): Insertable<TaskAttemptsTable> => {
  const at = tick()
  return {
    attempt_no: 1,
    assigned_to: 'worker-1',
    base_ref: null,
    base_commit: null,
    branch_name: null,
    worktree_path: null,
    workspace_status: null,
    result_commit: null,
    status: 'running',
    created_at: at,
    updated_at: at,
    ...fields
  }
}

export const makeThread = (
  fields: Partial<Insertable<ThreadsTable>> & Pick<Insertable<ThreadsTable>, 'run_id' | 'task_id'>
): Insertable<ThreadsTable> => {
  const at = tick()
  return {
    thread_id: uid('thread'),
    subject: 'About the task',
    created_by: 'orchestrator',
    assigned_to: 'worker-1',
    status: 'open',
    priority: 'normal',
    latest_message_id: null,
    created_at: at,
    updated_at: at,
    ...fields
  }
}

export const makeMessage = (
  fields: Partial<Insertable<MessagesTable>> & Pick<Insertable<MessagesTable>, 'thread_id'>
): Insertable<MessagesTable> => ({
  message_id: uid('message'),
  from_agent: 'worker-1',
  to_agent: 'orchestrator',
  kind: 'update',
  summary: 'Progress',
  body: 'Some progress was made.',
  payload_json: json({}),
  created_at: tick(),
  ...fields
})

export const makeArtifact = (
  fields: Partial<Insertable<ArtifactsTable>> & Pick<Insertable<ArtifactsTable>, 'message_id'>
): Insertable<ArtifactsTable> => ({
  artifact_id: uid('artifact'),
  path: 'out/report.txt',
  kind: 'file',
  metadata_json: json({ size: 1 }),
  created_at: tick(),
  ...fields
})

export interface Graph {
  runs?: Insertable<RunsTable>[]
  tasks?: Insertable<TasksTable>[]
  task_attempts?: Insertable<TaskAttemptsTable>[]
  threads?: Insertable<ThreadsTable>[]
  messages?: Insertable<MessagesTable>[]
  artifacts?: Insertable<ArtifactsTable>[]
}

/**
 * Inserts rows in dependency order (the fixture loader's), in one
 * transaction. Not loadFixture (db/fixtures.ts) itself: that one skips rows
 * whose key exists and looks up references, where a test wants a clash to
 * fail loudly and its JSON columns are already text (json() above).
 */
export async function insertGraph (graph: Graph): Promise<void> {
  const db = await writer()
  await db.transaction().execute(async (trx) => {
    for (const table of TABLES) {
      const rows = table === 'events' ? undefined : graph[table]
      if (rows !== undefined && rows.length > 0) await trx.insertInto(table).values(rows as never).execute()
    }
  })
}

/**
 * Takes an ACCESS EXCLUSIVE lock on `table` in a transaction of its own, so
 * that the service's reads of it wait; resolves once the lock is held, with
 * the function that releases it.
 */
export async function lockTable (table: 'runs' | 'events' | 'event_log_state'): Promise<() => Promise<void>> {
  const db = await writer()
  let release!: () => void
  const released = new Promise<void>((resolve) => { release = resolve })
  let locked!: () => void
  const isLocked = new Promise<void>((resolve) => { locked = resolve })
  const holder = db.transaction().execute(async (trx) => {
    await sql`lock table ${sql.table(table)} in access exclusive mode`.execute(trx)
    locked()
    await released
  })
  await isLocked
  return async () => {
    release()
    await holder
  }
}
