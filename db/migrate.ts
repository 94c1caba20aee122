import { Kysely, PostgresDialect } from 'kysely'
import { DEFAULT_MIGRATION_TABLE, Migrator } from 'kysely/migration'
import pg from 'pg'
import { setTimeout as sleep } from 'node:timers/promises'
import { pathToFileURL } from 'node:url'
import { migrations } from './migrations/index.js'
import { prepareConversion, undoPreparation } from './migrations/0004_events_partitioned_by_id.js'
import { createJobPool, isHotStandby } from './pool.js'

export interface MigrationOutcome {
  /** Names of the migrations this call applied, in order (empty when already up to date). */
  applied: string[]
}

/**
 * Applies every pending migration to the database at `connectionString`,
 * over a connection of its own: the request pool is read-only and cannot.
 * Safe to run from several replicas at once (Kysely's migrator holds a lock).
 * A hot standby is refused up front, saying so, rather than with the error
 * of the first statement it cannot run.
 */
export async function migrateToLatest (connectionString: string): Promise<MigrationOutcome> {
  if (await isHotStandby(connectionString)) {
    throw new Error('the database is a hot standby (read-only): migrations are applied to its primary, and reach it by replication')
  }
  const db = new Kysely<unknown>({ dialect: new PostgresDialect({ pool: createJobPool(connectionString, 'ocp-api-migrate') }) })
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

/**
 * Names of the project's migrations that the database at `connectionString`
 * lacks (all of them when Kysely's migration table does not exist), read
 * without writing anything: a hot standby cannot be written, and a reading
 * role may not. With `waitMs`, asks again until none is missing or waitMs
 * has passed: a replica shows a migration once it has replayed it.
 */
export async function pendingMigrations (connectionString: string, waitMs = 0): Promise<string[]> {
  const client = new pg.Client({ connectionString, application_name: 'ocp-api-schema-check', options: '-c default_transaction_read_only=on' })
  // A connection lost between statements is reported by the next one; this keeps it from being an unhandled 'error'.
  client.on('error', () => {})
  await client.connect()
  try {
    const deadline = Date.now() + waitMs
    for (;;) {
      const pending = await missingMigrations(client)
      if (pending.length === 0 || Date.now() >= deadline) return pending
      await sleep(100)
    }
  } finally {
    await client.end()
  }
}

async function missingMigrations (client: pg.Client): Promise<string[]> {
  const { rows: [table] } = await client.query<{ present: boolean }>('select to_regclass($1) is not null as present', [DEFAULT_MIGRATION_TABLE])
  const applied = table!.present
    ? (await client.query<{ name: string }>(`select name from ${DEFAULT_MIGRATION_TABLE}`)).rows.map((row) => row.name)
    : []
  return Object.keys(migrations).filter((name) => !applied.includes(name))
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  // Without DATABASE_URL: the embedded database in PGLITE_DATA_DIR.
  const { loadConfig } = await import('../config.js')
  const { withDatabaseUrl } = await import('./embedded.js')
  // loadConfig() inside the chain: a bad setting is one line, as any failure here.
  Promise.resolve().then(() => withDatabaseUrl(loadConfig(), migrateToLatest)).then(({ applied }) => {
    console.log(applied.length === 0 ? 'migrate: already up to date' : `migrate: applied ${applied.join(', ')}`)
  }, (err: unknown) => {
    console.error(`migrate: ${(err as Error).message}`)
    process.exit(1)
  })
}
