import { Kysely, PostgresAdapter, PostgresDialect, sql, type MigrationLockOptions, type Transaction } from 'kysely'
import { DEFAULT_MIGRATION_LOCK_TABLE, DEFAULT_MIGRATION_TABLE, MIGRATION_LOCK_ID, Migrator, type Migration } from 'kysely/migration'
import pg from 'pg'
import { setTimeout as sleep } from 'node:timers/promises'
import { pathToFileURL } from 'node:url'
import { migrations } from './migrations/index.ts'
import { prepareConversion, undoPreparation } from './migrations/0004_events_partitioned_by_id.ts'
import { createJobPool, isHotStandby } from './pool.ts'

export interface MigrationOutcome {
  /** Names of the migrations this call applied, in order (empty when already up to date). */
  applied: string[]
  /** Present when the database holds migrations of a newer version: their names. */
  newer?: string[]
}

/** What the database's migrations are to this version. */
export interface SchemaState {
  /** This version's migrations that the database lacks. */
  pending: string[]
  /** Migrations the database holds that this version does not know, all after its own: a newer version's. */
  newer: string[]
}

const ownNames = Object.keys(migrations)

/** What a replica says, once, of a database a newer version migrated. */
export const newerVersionText = (newer: string[]) =>
  `the database was migrated by a newer version of this service (${newer.length === 1 ? 'migration' : 'migrations'} ${newer.join(', ')}, ` +
  'unknown here): this version serves it as long as they are compatible with it (docs/operating.md, "Upgrades, rolling deploys and rollbacks")'

/** A database that holds another line of migrations than this version's (schemaStateOf). */
export class ForkedMigrationsError extends Error {}

/**
 * The state of a database whose applied migrations are `applied`. A
 * database a newer version migrated holds every migration of this one,
 * then names this one does not know, sorting after its own: this version
 * runs on it (docs/operating.md, "Upgrades, rolling deploys and
 * rollbacks"). Names it does not know on a database that lacks one of its
 * own, or among its own, are another line of migrations (a fork): refused.
 */
function schemaStateOf (applied: string[]): SchemaState {
  const pending = ownNames.filter((name) => !applied.includes(name))
  const unknown = applied.filter((name) => !ownNames.includes(name)).sort()
  if (unknown.length > 0 && (pending.length > 0 || unknown[0]! < ownNames.at(-1)!)) {
    const why = pending.length > 0 ? `and lacks ${pending.join(', ')} of its own` : `that sort among its own (before ${ownNames.at(-1)})`
    throw new ForkedMigrationsError(`the database holds migrations this version does not know (${unknown.join(', ')}) ${why}: ` +
      'another line of migrations (a fork), not a newer version of this one, was applied to it')
  }
  return { pending, newer: unknown }
}

/** Stands for a newer version's migration, already applied: the Migrator runs only those not applied, so never this. */
const appliedByNewerVersion: Migration = {
  /* c8 ignore next: never run (above) */
  up: async () => { throw new Error('a newer version\'s migration cannot be applied by this one') }
}

/**
 * Kysely's Postgres adapter, with the migrations' lock taken on the row of
 * Kysely's own lock table rather than with its advisory lock: any login
 * may take an advisory lock's fixed key first and hold it, hanging every
 * migration; the row can be locked only by a role that may update the
 * table (its owner, the migrating role). Taken in the migrations'
 * transaction (migrateToLatest runs the Migrator inside one), it is
 * released when that transaction ends.
 */
class RowLockAdapter extends PostgresAdapter {
  override async acquireMigrationLock (db: Kysely<any>, { lockTable, lockRowId }: MigrationLockOptions): Promise<void> {
    await sql`select from ${sql.table(lockTable)} where id = ${lockRowId} for update`.execute(db)
  }

  override async releaseMigrationLock (): Promise<void> {}
}

class MigrationDialect extends PostgresDialect {
  override createAdapter (): PostgresAdapter {
    return new RowLockAdapter()
  }
}

/**
 * Kysely's migration table and lock table, and the lock's row, as its
 * Migrator makes them, but before the migrations' transaction: the row
 * must exist before it is locked, and a table made inside concurrent
 * transactions fails all but one of them (a table another transaction has
 * made but not committed is invisible to `if not exists`).
 */
async function createMigrationTables (db: Kysely<any>): Promise<void> {
  const statements: Array<() => Promise<unknown>> = [
    () => db.schema.createTable(DEFAULT_MIGRATION_TABLE).ifNotExists()
      .addColumn('name', 'varchar(255)', (col) => col.notNull().primaryKey())
      .addColumn('timestamp', 'varchar(255)', (col) => col.notNull()).execute(),
    () => db.schema.createTable(DEFAULT_MIGRATION_LOCK_TABLE).ifNotExists()
      .addColumn('id', 'varchar(255)', (col) => col.notNull().primaryKey())
      .addColumn('is_locked', 'integer', (col) => col.notNull().defaultTo(0)).execute(),
    () => db.insertInto(DEFAULT_MIGRATION_LOCK_TABLE).values({ id: MIGRATION_LOCK_ID, is_locked: 0 }).onConflict((oc) => oc.doNothing()).execute()
  ]
  for (const statement of statements) {
    // Made by another replica at the same moment: its commit fails this `create` (unique_violation), after which the table is there.
    await statement().catch((err: { code?: string }) => err.code === '23505' ? statement() : Promise.reject(err))
  }
}

/**
 * Applies every pending migration to the database at `connectionString`,
 * over a connection of its own: the request pool is read-only and cannot.
 * Safe to run from several replicas at once: the migrations run in one
 * transaction, which locks the row of Kysely's lock table first. A
 * database a newer version migrated is left as it is (`newer` names its
 * migrations); a fork is refused (schemaStateOf). A hot standby is refused
 * up front, saying so, rather than with the error of the first statement
 * it cannot run.
 */
export async function migrateToLatest (connectionString: string): Promise<MigrationOutcome> {
  if (await isHotStandby(connectionString)) {
    throw new Error('the database is a hot standby (read-only): migrations are applied to its primary, and reach it by replication')
  }
  const db = new Kysely<unknown>({ dialect: new MigrationDialect({ pool: createJobPool(connectionString, 'ocp-api-migrate') }) })
  try {
    await createMigrationTables(db)
    // Migration 0004's one scan, outside the migrations' transaction, where it blocks no writer.
    const prepared = await prepareConversion(db)
    try {
      return await db.transaction().execute(migrateIn)
    } catch (err) {
      if (prepared) await undoPreparation(db).catch(() => {})
      throw err
    }
  } finally {
    await db.destroy()
  }
}

/** migrateToLatest's work, in the transaction `trx`. */
async function migrateIn (trx: Transaction<unknown>): Promise<MigrationOutcome> {
  let newer: string[] = []
  // The Migrator asks for the migrations once it holds the lock: the applied ones are read then.
  const getMigrations = async () => {
    const { rows } = await sql<{ name: string }>`select name from ${sql.table(DEFAULT_MIGRATION_TABLE)}`.execute(trx)
    newer = schemaStateOf(rows.map((row) => row.name)).newer
    return { ...migrations, ...Object.fromEntries(newer.map((name) => [name, appliedByNewerVersion])) }
  }
  const { error, results = [] } = await new Migrator({ db: trx, provider: { getMigrations } }).migrateToLatest()
  if (error !== undefined) {
    const failed = results.find((result) => result.status === 'Error')
    const where = failed ? `migration ${failed.migrationName} failed` : 'migrations failed'
    throw new Error(`${where}: ${(error as Error).message}`, { cause: error })
  }
  const applied = results.map((result) => result.migrationName)
  return newer.length > 0 ? { applied, newer } : { applied }
}

/**
 * The state of the database at `connectionString` (schemaStateOf; every
 * migration is pending when Kysely's migration table does not exist),
 * read without writing anything: a hot standby cannot be written, and a
 * reading role may not. With `waitMs`, asks again until none is pending or
 * waitMs has passed: a replica shows a migration once it has replayed it.
 */
export async function schemaState (connectionString: string, waitMs = 0): Promise<SchemaState> {
  const client = new pg.Client({ connectionString, application_name: 'ocp-api-schema-check', options: '-c default_transaction_read_only=on' })
  // A connection lost between statements is reported by the next one; this keeps it from being an unhandled 'error'.
  client.on('error', () => {})
  await client.connect()
  try {
    const deadline = Date.now() + waitMs
    for (;;) {
      const state = schemaStateOf(await appliedMigrations(client))
      if (state.pending.length === 0 || Date.now() >= deadline) return state
      await sleep(100)
    }
  } finally {
    await client.end()
  }
}

async function appliedMigrations (client: pg.Client): Promise<string[]> {
  const { rows: [table] } = await client.query<{ present: boolean }>('select to_regclass($1) is not null as present', [DEFAULT_MIGRATION_TABLE])
  return table!.present
    ? (await client.query<{ name: string }>(`select name from ${DEFAULT_MIGRATION_TABLE}`)).rows.map((row) => row.name)
    : []
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  // Without DATABASE_URL: the embedded database in PGLITE_DATA_DIR.
  const { loadConfig } = await import('../config.ts')
  const { withDatabaseUrl } = await import('./embedded.ts')
  // loadConfig() inside the chain: a bad setting is one line, as any failure here.
  Promise.resolve().then(() => withDatabaseUrl(loadConfig(), migrateToLatest)).then(({ applied, newer }) => {
    console.log(applied.length === 0 ? 'migrate: already up to date' : `migrate: applied ${applied.join(', ')}`)
    if (newer !== undefined) console.warn(`migrate: ${newerVersionText(newer)}`)
  }, (err: unknown) => {
    console.error(`migrate: ${(err as Error).message}`)
    process.exit(1)
  })
}
