import type { ColumnType, Generated, Kysely } from 'kysely'

/**
 * The shared Postgres schema (docs/reference.md, "Tables the orchestrator writes"). The orchestrator writes
 * these tables; this service only reads them. Migrations in db/migrations
 * create exactly these columns.
 *
 * Where else the columns are written, and why each copy stays one: the
 * migrations (history, frozen as run, importing no app code); the fixture
 * row schemas (db/fixtures.ts: validation needs a runtime schema, and these
 * types have none); the wire resources (schemas/resources.ts: the contract's shapes,
 * which differ from the rows); the bench generator's SQL (bench/generate.ts:
 * rows made inside Postgres). test/fixtures.test.ts binds the first three
 * to the migrated tables, so a column added in one place and not the others
 * fails there.
 */

/** timestamptz: read as Date, written as Date or ISO string, defaulting to now(). */
type Timestamp = ColumnType<Date, Date | string | undefined, Date | string>

/** text NOT NULL with a default (''): an insert may leave it out. */
type TextWithDefault = ColumnType<string, string | undefined, string>

/** A jsonb column holding any JSON value (object, array, string, number, boolean or null). */
export type Json = ColumnType<unknown, string, string>

export interface RunsTable {
  run_id: string
  goal: string
  summary: TextWithDefault
  status: string
  created_at: Timestamp
  updated_at: Timestamp
}

export interface TasksTable {
  run_id: string
  task_id: string
  title: string
  summary: TextWithDefault
  status: string
  default_to: string | null
  priority: string
  acceptance_json: Json
  latest_attempt_no: number | null
  created_at: Timestamp
  updated_at: Timestamp
}

export interface TaskAttemptsTable {
  run_id: string
  task_id: string
  attempt_no: number
  assigned_to: string
  thread_id: string
  base_ref: string | null
  base_commit: string | null
  branch_name: string | null
  worktree_path: string | null
  workspace_status: string | null
  result_commit: string | null
  status: string
  created_at: Timestamp
  updated_at: Timestamp
}

export interface ThreadsTable {
  thread_id: string
  run_id: string
  task_id: string
  subject: string
  created_by: string
  assigned_to: string
  status: string
  priority: string
  latest_message_id: string | null
  created_at: Timestamp
  updated_at: Timestamp
}

export interface MessagesTable {
  message_id: string
  thread_id: string
  from_agent: string
  to_agent: string
  kind: string
  summary: string
  body: string
  payload_json: Json
  created_at: Timestamp
}

export interface ArtifactsTable {
  artifact_id: string
  message_id: string
  path: string
  kind: string
  metadata_json: Json
  created_at: Timestamp
}

export interface EventsTable {
  /** bigint: pg returns it as a string, so it is typed as one. */
  event_id: Generated<string>
  event_type: string
  run_id: TextWithDefault
  task_id: TextWithDefault
  thread_id: TextWithDefault
  summary: TextWithDefault
  payload: ColumnType<unknown, string | undefined, string>
  created_at: Timestamp
}

export interface Database {
  runs: RunsTable
  tasks: TasksTable
  task_attempts: TaskAttemptsTable
  threads: ThreadsTable
  messages: MessagesTable
  artifacts: ArtifactsTable
  events: EventsTable
}

/** A query builder over the schema: the type every db/ function that builds or runs a query with Kysely takes. */
export type Db = Kysely<Database>
