import closeWithGrace from 'close-with-grace'
import type { FastifyInstance } from 'fastify'
import { ConfigError, deprecatedSettingsIn, listenFailure, loadConfig, type Config } from './config.ts'
import type {} from './plugins/app/db.ts' // the types of its decorators (the module itself loads with the app)
import { startTracing } from './tracing.ts'

/** How long a replica may take to show migrations this start has just applied to its primary. */
const REPLAY_WAIT_MS = 10_000

const pendingText = (names: string[]) => names.length === 1 ? `migration ${names[0]} is pending` : `migrations ${names.join(', ')} are pending`

/**
 * The schema before listening. A primary is migrated (MIGRATE_ON_START); a
 * hot standby cannot be, so it must already have every migration, which
 * reaches it from its primary. Reads elsewhere (DATABASE_READ_URL) need
 * every migration too, once replayed. A database a newer version migrated
 * is served, saying so once; a fork of the migrations is refused.
 */
async function prepareSchema (app: FastifyInstance, config: Config) {
  const { ForkedMigrationsError, migrateToLatest, newerVersionText, schemaState } = await import('./db/migrate.ts')
  let applied: string[] = []
  let newer: string[] | undefined
  if (app.keeperDatabaseUrl === undefined) { // DATABASE_URL names a hot standby (plugins/app/db.ts)
    let pending: string[]
    ({ pending, newer } = await schemaState(app.databaseUrl))
    if (pending.length > 0) {
      throw new Error(`DATABASE_URL names a hot standby on which ${pendingText(pending)}: apply pending migrations to ` +
        'its primary (npm run migrate with DATABASE_URL set to the primary), then start again; a standby is never migrated')
    }
    app.log.info({ MIGRATE_ON_START: config.MIGRATE_ON_START },
      'DATABASE_URL names a hot standby, which has every migration: nothing is migrated there, whatever MIGRATE_ON_START says')
  } else if (config.MIGRATE_ON_START) {
    ({ applied, newer } = await migrateToLatest(app.databaseUrl))
    app.log.info({ applied }, applied.length === 0 ? 'database schema up to date' : 'database migrated')
  } else {
    // Not migrated here, but a fork is still refused. A database that cannot be asked is served as before: its reads say why.
    ({ newer } = await schemaState(app.databaseUrl).catch((err: unknown) => {
      if (err instanceof ForkedMigrationsError) throw err
      app.log.warn({ err }, 'could not read the migrations applied to DATABASE_URL at start')
      return { newer: [] }
    }))
  }
  if (app.readDatabaseUrl !== app.databaseUrl) {
    const state = await schemaState(app.readDatabaseUrl, applied.length > 0 ? REPLAY_WAIT_MS : 0)
    if (state.pending.length > 0) {
      throw new Error(`on the database at DATABASE_READ_URL, ${pendingText(state.pending)}: apply pending migrations to ` +
        'the primary, and check that DATABASE_READ_URL names a replica of the database at DATABASE_URL')
    }
  }
  if (newer !== undefined && newer.length > 0) app.log.warn({ newer }, newerVersionText(newer))
}

async function main () {
  const config = loadConfig()
  // Tracing, when the OTEL_* variables ask for it, starts before the modules
  // it instruments (pg, pino, node:http) load: the application is imported after it.
  const tracing = await startTracing()
  const { buildApp } = await import('./app.ts')
  const app = await buildApp(config, tracing === undefined ? {} : { tracing: tracing.plugin })
  for (const warning of deprecatedSettingsIn(process.env)) app.log.warn(warning)
  await prepareSchema(app, config)
  // SIGTERM or SIGINT: stop accepting, end the event streams (clients
  // reconnect elsewhere), finish in-flight requests, close the pool; exit
  // anyway after SHUTDOWN_GRACE_MS.
  closeWithGrace({ delay: config.SHUTDOWN_GRACE_MS }, async ({ signal, err }) => {
    /* c8 ignore next: close-with-grace's own uncaught-exception path */
    if (err !== undefined) app.log.error({ err }, 'shutting down after an uncaught error')
    else app.log.info({ signal }, 'shutting down')
    await app.close()
    await tracing?.shutdown()
  })
  // A port in use names PORT (`npm start` checked it before building, but it may have been taken since).
  await app.listen({ host: config.HOST, port: config.PORT }).catch((err: unknown) => { throw listenFailure(err, config) })
}

main().catch((err: unknown) => {
  // A bad configuration or an unreachable database at start: say why, exit non-zero.
  console.error(err instanceof ConfigError ? err.message : `failed to start: ${(err as Error).message}`)
  process.exit(1)
})
