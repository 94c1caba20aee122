import { Kysely, Migrator, PostgresDialect } from 'kysely'
import pg from 'pg'
import { pathToFileURL } from 'node:url'
import { migrations } from './migrations/index.js'
import { prepareConversion, undoPreparation } from './migrations/0004_events_partitioned_by_id.js'

export interface MigrationOutcome {
  /** Names of the migrations this call applied, in order (empty when already up to date). */
  applied: string[]
}

/**
 * Applies every pending migration to the database at `connectionString`,
 * over a connection of its own: the request pool is read-only and cannot.
 * Safe to run from several replicas at once (Kysely's migrator holds a lock).
 */
export async function migrateToLatest (connectionString: string): Promise<MigrationOutcome> {
  const db = new Kysely<unknown>({
    dialect: new PostgresDialect({
      pool: new pg.Pool({ connectionString, max: 1, application_name: 'ocp-api-migrate' })
    })
  })
  try {
    // Migration 0004's one scan, outside the migrations' transaction, where it blocks no writer.
    const prepared = await prepareConversion(db)
    const migrator = new Migrator({ db, provider: { getMigrations: async () => migrations } })
    const { error, results = [] } = await migrator.migrateToLatest()
    if (error !== undefined) {
      if (prepared) await undoPreparation(db).catch(() => {})
      const failed = results.find((result) => result.status === 'Error')
      const where = failed ? `migration ${failed.migrationName} failed` : 'migrations failed'
      throw new Error(`${where}: ${(error as Error).message}`, { cause: error })
    }
    return { applied: results.map((result) => result.migrationName) }
  } finally {
    await db.destroy()
  }
}


if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  // Without DATABASE_URL: the embedded database in PGLITE_DATA_DIR.
  const { loadConfig } = await import('../config.js')
  const { withDatabaseUrl } = await import('./embedded.js')
  withDatabaseUrl(loadConfig(), migrateToLatest).then(({ applied }) => {
    console.log(applied.length === 0 ? 'migrate: already up to date' : `migrate: applied ${applied.join(', ')}`)
  }, (err: unknown) => {
    console.error(`migrate: ${(err as Error).message}`)
    process.exit(1)
  })
}
