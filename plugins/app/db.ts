import fp from 'fastify-plugin'
import type { FastifyInstance } from 'fastify'
import { startEmbeddedPostgres } from '../../db/embedded.ts'
import { createDb, createReadPool, isHotStandby, type ReadPool } from '../../db/pool.ts'
import type { Db } from '../../db/schema.ts'

declare module 'fastify' {
  interface FastifyInstance {
    /**
     * The read-only query builder over the shared Postgres (see db/pool.ts),
     * at `readDatabaseUrl`: for a read built with Kysely at request time
     * (the event log's statements, existence checks).
     */
    db: Db
    /**
     * The same pool as a pg.Pool, with the pipelined connections
     * (DB_PIPELINED_CONNECTIONS, db/pipeline.ts) that the API's
     * body-building reads go to, each a statement prepared once at start
     * (db/queries.ts, on db/statement.ts); a new JSON read goes there.
     * Also the gauges of both.
     */
    dbPool: ReadPool
    /** Where migrations go: DATABASE_URL, or the embedded database's loopback URL. */
    databaseUrl: string
    /** Where every read goes, HTTP and stream: DATABASE_READ_URL, else `databaseUrl`. */
    readDatabaseUrl: string
    /**
     * The writable primary, for the event log's keeper (partitions,
     * retention, its state row): `databaseUrl`, or undefined when
     * DATABASE_URL names a hot standby (the keeper is then off here).
     */
    keeperDatabaseUrl: string | undefined
    /**
     * Where the event wake-up (EVENTS_WAKEUP, events/wakeup.ts) opens its
     * replication connection: `readDatabaseUrl` when it names a hot standby
     * (or cannot be asked at start), else `databaseUrl`, the same server,
     * whose role may replicate where the reading role need not.
     */
    wakeupDatabaseUrl: string
  }
}

export default fp(async function dbPlugin (app) {
  const { config } = app
  let databaseUrl = config.DATABASE_URL
  let keeperDatabaseUrl: string | undefined
  if (databaseUrl === undefined) {
    // No DATABASE_URL: PGlite in this process (db/embedded.ts), for development and CI.
    const embedded = await startEmbeddedPostgres({ dataDir: config.PGLITE_DATA_DIR, port: config.PGLITE_PORT })
    databaseUrl = keeperDatabaseUrl = embedded.url
    app.log.warn({ dataDir: embedded.dataDir, url: embedded.url },
      'no DATABASE_URL: using the embedded database (PGlite), for development and CI only, not for production')
    // Registered first, so it runs after the pool below has closed (onClose hooks run in reverse).
    app.addHook('onClose', async () => { await embedded.close() })
  } else {
    if (config.DATABASE_READ_URL === undefined) {
      app.log.info({ database: redactedUrl(databaseUrl) }, 'using the Postgres server at DATABASE_URL')
    } else {
      app.log.info({ database: redactedUrl(databaseUrl), reads: redactedUrl(config.DATABASE_READ_URL) },
        'reads go to DATABASE_READ_URL; migrations and the event log\'s keeper to DATABASE_URL')
    }
    keeperDatabaseUrl = await keeperUrlOf(app, databaseUrl)
  }
  const readDatabaseUrl = config.DATABASE_READ_URL ?? databaseUrl
  const wakeupDatabaseUrl = readDatabaseUrl === databaseUrl ? databaseUrl : await wakeupUrlOf(app, databaseUrl, readDatabaseUrl)
  const pool = createReadPool({
    connectionString: readDatabaseUrl,
    max: config.DB_POOL_MAX,
    pipelined: config.DB_PIPELINED_CONNECTIONS,
    statementTimeoutMs: config.DB_STATEMENT_TIMEOUT_MS,
    connectTimeoutMs: config.DB_CONNECT_TIMEOUT_MS
  })
  // An idle connection that dies (server restart, network) must not crash
  // the process: the pool drops it and the next request opens another.
  pool.on('error', (err) => app.log.warn({ err }, 'idle database connection lost'))
  const db = createDb(pool)
  app.decorate('db', db)
  app.decorate('dbPool', pool)
  app.decorate('databaseUrl', databaseUrl)
  app.decorate('readDatabaseUrl', readDatabaseUrl)
  app.decorate('keeperDatabaseUrl', keeperDatabaseUrl)
  app.decorate('wakeupDatabaseUrl', wakeupDatabaseUrl)
  app.addHook('onClose', async () => { await db.destroy() })
}, { name: 'db', decorators: { fastify: ['config'] } })

/**
 * Whether the server at `url` (named by `variable`) is a hot standby, or
 * undefined when it cannot be asked at start (logged, with `assumed`: what
 * is done instead).
 */
async function isStandbyAtStart (app: FastifyInstance, url: string, variable: string, assumed: string): Promise<boolean | undefined> {
  try {
    return await isHotStandby(url, app.config.DB_CONNECT_TIMEOUT_MS)
  } catch (err) {
    app.log.warn({ err }, `could not ask ${variable} whether it names a hot standby: ${assumed}`)
    return undefined
  }
}

/**
 * `url` (DATABASE_URL) when it names a primary, undefined when it names a
 * hot standby, where nothing can be written. A server that cannot be asked
 * at start is taken for a primary: the service still starts (and answers
 * 503 until the database is back), and the keeper on a standby would only fail,
 * harmlessly, where the keeper wrongly off would let the log go unkept.
 */
async function keeperUrlOf (app: FastifyInstance, url: string): Promise<string | undefined> {
  const standby = await isStandbyAtStart(app, url, 'DATABASE_URL', 'taking it for the primary')
  if (standby !== true) return url
  app.log.info('DATABASE_URL names a hot standby: the event log\'s keeper is off here (an instance whose DATABASE_URL names the primary keeps it)')
  return undefined
}

/**
 * Where the wake-up connects when DATABASE_READ_URL is set. A standby's WAL
 * is what its reads see, so the wake-up streams the standby's, as the
 * reading role (which then needs REPLICATION). The primary's WAL is the
 * same whichever role streams it, and a replication connection can copy
 * the whole cluster (password hashes included), so there the wake-up
 * connects as DATABASE_URL's role, and the reading role needs no more than
 * to read. A read server that cannot be asked at start is taken for a
 * standby, as before this choice existed.
 */
async function wakeupUrlOf (app: FastifyInstance, databaseUrl: string, readUrl: string): Promise<string> {
  const standby = await isStandbyAtStart(app, readUrl, 'DATABASE_READ_URL', 'the event wake-up connects to it')
  if (standby !== false) return readUrl
  app.log.info('DATABASE_READ_URL names a primary: the event wake-up connects with DATABASE_URL (its role may replicate; the reading role need not)')
  return databaseUrl
}

/** The parameters of a connection URL that carry a password (libpq's, which pg reads too). */
const PASSWORD_PARAMETERS = ['password', 'sslpassword']

/** The URL without its passwords (its userinfo's, and any in its parameters), for the log. */
export function redactedUrl (url: string): string {
  const parsed = new URL(url)
  if (parsed.password !== '') parsed.password = '***'
  for (const name of PASSWORD_PARAMETERS) if (parsed.searchParams.has(name)) parsed.searchParams.set(name, '***')
  return parsed.toString()
}
