import closeWithGrace from 'close-with-grace'
import { buildApp } from './app.js'
import { ConfigError, loadConfig } from './config.js'
import { migrateToLatest } from './db/migrate.js'

async function main () {
  const config = loadConfig()
  const app = await buildApp(config)
  if (config.MIGRATE_ON_START) {
    const { applied } = await migrateToLatest(app.databaseUrl)
    app.log.info({ applied }, applied.length === 0 ? 'database schema up to date' : 'database migrated')
  }
  // SIGTERM or SIGINT: stop accepting, end the event streams (clients
  // reconnect elsewhere), finish in-flight requests, close the pool; exit
  // anyway after SHUTDOWN_GRACE_MS.
  closeWithGrace({ delay: config.SHUTDOWN_GRACE_MS }, async ({ signal, err }) => {
    /* c8 ignore next: close-with-grace's own uncaught-exception path */
    if (err !== undefined) app.log.error({ err }, 'shutting down after an uncaught error')
    else app.log.info({ signal }, 'shutting down')
    await app.close()
  })
  await app.listen({ host: config.HOST, port: config.PORT })
}

main().catch((err: unknown) => {
  // A bad configuration or an unreachable database at start: say why, exit non-zero.
  console.error(err instanceof ConfigError ? err.message : `failed to start: ${(err as Error).message}`)
  process.exit(1)
})
