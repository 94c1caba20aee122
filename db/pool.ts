import { Kysely, PostgresDialect } from 'kysely'
import pg from 'pg'
import { PipelinedConnections } from './pipeline.ts'
import type { Database, Db } from './schema.ts'

export interface ReadPoolOptions {
  connectionString: string
  /** Most connections the pool opens. */
  max: number
  /** Server-side limit on one statement; the server cancels it past this. */
  statementTimeoutMs: number
  /** Limit on opening a connection and on waiting for a free one. */
  connectTimeoutMs: number
  applicationName?: string
  /** Connections that carry the API's reads several at a time (db/pipeline.ts), besides `max`; 0: those reads take turns on the pool's. */
  pipelined: number
}

/** The read pool, and the pipelined connections (if any) that the API's one-statement reads go to (db/statement.ts). */
export class ReadPool extends pg.Pool {
  readonly pipeline: PipelinedConnections | undefined

  constructor (config: pg.PoolConfig, pipeline?: PipelinedConnections) {
    super(config)
    this.pipeline = pipeline
  }

  /** Ends the pipelined connections with the pool. */
  override async end (): Promise<void> {
    await Promise.all([this.pipeline?.end(), super.end()])
  }
}

/** How long a connection stays open unused. */
const IDLE_MS = 30_000

/** Extra time the client waits beyond the server's statement timeout before giving up on a silent server. */
const CLIENT_TIMEOUT_MARGIN_MS = 1000

/**
 * The pool behind every request. Its sessions are read-only
 * (default_transaction_read_only), so this service cannot write
 * orchestration state even by mistake; statements are cancelled by the
 * server after statementTimeoutMs and abandoned by the client shortly after
 * (a server that stopped answering must not hang a request); timestamps
 * are read in UTC. JIT compilation is off: every statement here reads a
 * few rows by index, and the planner's cost estimate over a partitioned
 * log (an index scan per partition) crossed jit_above_cost for the
 * poller's read, which then spent far longer compiling than running.
 */
export function createReadPool (options: ReadPoolOptions): ReadPool {
  const connection: pg.ClientConfig = {
    connectionString: options.connectionString,
    connectionTimeoutMillis: options.connectTimeoutMs,
    query_timeout: options.statementTimeoutMs + CLIENT_TIMEOUT_MARGIN_MS,
    keepAlive: true,
    application_name: options.applicationName ?? 'ocp-api',
    options: [
      '-c default_transaction_read_only=on',
      `-c statement_timeout=${options.statementTimeoutMs}`,
      `-c idle_in_transaction_session_timeout=${options.statementTimeoutMs * 2}`,
      '-c TimeZone=UTC',
      '-c jit=off'
    ].join(' ')
  }
  const pipeline = options.pipelined > 0 ? new PipelinedConnections(connection, options.pipelined, IDLE_MS) : undefined
  const pool = new ReadPool({ ...connection, max: options.max, idleTimeoutMillis: IDLE_MS }, pipeline)
  // pg-pool listens for errors only on idle clients: a connection that dies
  // while checked out (a server crash mid-query) would emit an unhandled
  // 'error' and take the process down. The failing query rejects anyway,
  // and the request answers 503; this listener only keeps the process up.
  pool.on('connect', (client) => { client.on('error', () => {}) })
  return pool
}

/**
 * A pool of its own for a short job that writes (migrations, seeding): the
 * read pool is read-only. An idle connection the server ends (a restart, a
 * terminated backend, a database dropped just after: pool.end() does not
 * wait for its backends) would be an unhandled 'error' and end the
 * process; a statement that needed it reports the failure instead.
 */
export function createJobPool (connectionString: string, applicationName: string): pg.Pool {
  const pool = new pg.Pool({ connectionString, max: 1, application_name: applicationName })
  /* c8 ignore next: reached only when the server ends an idle connection, a race no test can time */
  pool.on('error', () => {})
  return pool
}

export function createDb (pool: pg.Pool): Db {
  return new Kysely<Database>({ dialect: new PostgresDialect({ pool }) })
}

/**
 * Whether the server at `connectionString` is a hot standby: in recovery,
 * replaying a primary's WAL, so that nothing can be written there.
 */
export async function isHotStandby (connectionString: string, connectTimeoutMs?: number): Promise<boolean> {
  const client = new pg.Client({ connectionString, connectionTimeoutMillis: connectTimeoutMs, application_name: 'ocp-api-role-check' })
  // A connection lost between statements is reported by the next one; this keeps it from being an unhandled 'error'.
  client.on('error', () => {})
  await client.connect()
  try {
    const { rows } = await client.query<{ standby: boolean }>('select pg_is_in_recovery() as standby')
    return rows[0]!.standby
  } finally {
    await client.end()
  }
}
