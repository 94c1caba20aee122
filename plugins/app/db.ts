import fp from 'fastify-plugin'
import type { FastifyInstance } from 'fastify'
import { startEmbeddedPostgres } from '../../db/embedded.js'
import { createDb, createReadPool, isHotStandby, type ReadPool } from '../../db/pool.js'
import type { Db } from '../../db/schema.js'

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
     * The writable primary, for the event log's upkeep (partitions,
     * retention, its clock row): `databaseUrl`, or undefined when
     * DATABASE_URL names a hot standby (the upkeep is then off here).
     */
    upkeepDatabaseUrl: string | undefined
  }
}

export default fp(async function dbPlugin (app) {
  const { config } = app
  let databaseUrl = config.DATABASE_URL
  let upkeepDatabaseUrl: string | undefined
  if (databaseUrl === undefined) {
    // No DATABASE_URL: PGlite in this process (db/embedded.ts), for development and CI.
    const embedded = await startEmbeddedPostgres({ dataDir: config.PGLITE_DATA_DIR, port: config.PGLITE_PORT })
    databaseUrl = upkeepDatabaseUrl = embedded.url
    app.log.warn({ dataDir: embedded.dataDir, url: embedded.url },
      'no DATABASE_URL: using the embedded database (PGlite), for development and CI only, not for production')
    // Registered first, so it runs after the pool below has closed (onClose hooks run in reverse).
    app.addHook('onClose', async () => { await embedded.close() })
  } else {
    if (config.DATABASE_READ_URL === undefined) {
      app.log.info({ database: redactedUrl(databaseUrl) }, 'using the Postgres server at DATABASE_URL')
    } else {
      app.log.info({ database: redactedUrl(databaseUrl), reads: redactedUrl(config.DATABASE_READ_URL) },
        'reads go to DATABASE_READ_URL; migrations and the event log\'s upkeep to DATABASE_URL')
    }
    upkeepDatabaseUrl = await upkeepUrlOf(app, databaseUrl)
  }
  const readDatabaseUrl = config.DATABASE_READ_URL ?? databaseUrl
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
  app.decorate('upkeepDatabaseUrl', upkeepDatabaseUrl)
  app.addHook('onClose', async () => { await db.destroy() })
}, { name: 'db', decorators: { fastify: ['config'] } })

/**
 * `url` (DATABASE_URL) when it names a primary, undefined when it names a
 * hot standby, where nothing can be written. A server that cannot be asked
 * at start is taken for a primary: the service still starts (and answers
 * 503 until the database is back), and upkeep on a standby would only fail,
 * harmlessly, where upkeep wrongly off would let the log go unkept.
 */
async function upkeepUrlOf (app: FastifyInstance, url: string): Promise<string | undefined> {
  let standby: boolean
  try {
    standby = await isHotStandby(url, app.config.DB_CONNECT_TIMEOUT_MS)
  } catch (err) {
    app.log.warn({ err }, 'could not ask DATABASE_URL whether it names a hot standby: taking it for the primary')
    return url
  }
  if (!standby) return url
  app.log.info('DATABASE_URL names a hot standby: the event log\'s upkeep is off here (an instance whose DATABASE_URL names the primary keeps it)')
  return undefined
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
