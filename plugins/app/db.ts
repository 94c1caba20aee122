import fp from 'fastify-plugin'
import type { Kysely } from 'kysely'
import type pg from 'pg'
import { createDb, createReadPool } from '../../db/pool.js'
import type { Database } from '../../db/schema.js'

declare module 'fastify' {
  interface FastifyInstance {
    /** The read-only query builder over the shared Postgres (see db/pool.ts). */
    db: Kysely<Database>
    /** The pool behind `db`, for its gauges. */
    dbPool: pg.Pool
  }
}

export default fp(async function dbPlugin (app) {
  const { config } = app
  const pool = createReadPool({
    connectionString: config.DATABASE_URL,
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
  app.addHook('onClose', async () => { await db.destroy() })
}, { name: 'db', decorators: { fastify: ['config'] } })
