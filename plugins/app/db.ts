import fp from 'fastify-plugin'
import type { Kysely } from 'kysely'
import type pg from 'pg'
import { startEmbeddedPostgres } from '../../db/embedded.js'
import { createDb, createReadPool } from '../../db/pool.js'
import type { Database } from '../../db/schema.js'

declare module 'fastify' {
  interface FastifyInstance {
    /** The read-only query builder over the shared Postgres (see db/pool.ts). */
    db: Kysely<Database>
    /** The pool behind `db`, for its gauges. */
    dbPool: pg.Pool
    /** Where the database is: DATABASE_URL, or the embedded database's loopback URL. */
    databaseUrl: string
  }
}

export default fp(async function dbPlugin (app) {
  const { config } = app
  let databaseUrl = config.DATABASE_URL
  if (databaseUrl === undefined) {
    // No DATABASE_URL: PGlite in this process (db/embedded.ts), for development and CI.
    const embedded = await startEmbeddedPostgres({ dataDir: config.PGLITE_DATA_DIR, port: config.PGLITE_PORT })
    databaseUrl = embedded.url
    app.log.warn({ dataDir: embedded.dataDir, url: embedded.url },
      'no DATABASE_URL: using the embedded database (PGlite), for development and CI only, not for production')
    // Registered first, so it runs after the pool below has closed (onClose hooks run in reverse).
    app.addHook('onClose', async () => { await embedded.close() })
  } else {
    app.log.info({ database: redactedUrl(databaseUrl) }, 'using the Postgres server at DATABASE_URL')
  }
  const pool = createReadPool({
    connectionString: databaseUrl,
    max: config.DB_POOL_MAX,
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
  app.addHook('onClose', async () => { await db.destroy() })
}, { name: 'db', decorators: { fastify: ['config'] } })

/** The URL without its password, for the log. */
export function redactedUrl (url: string): string {
  const parsed = new URL(url)
  if (parsed.password !== '') parsed.password = '***'
  return parsed.toString()
}
