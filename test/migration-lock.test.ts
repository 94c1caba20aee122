import pg from 'pg'
import t, { type Test } from 'tap'
import { migrateToLatest } from '../db/migrate.ts'
import { migrations } from '../db/migrations/index.ts'
import { extraDatabaseUrl, needsServer, serverDatabaseUrl, withAdmin } from './helpers/database.ts'
import { waitUntil } from './helpers/wait.ts'

/*
 * The migrations' lock (docs/database.md, "Roles and privileges"): the row
 * of Kysely's kysely_migration_lock, locked by the migrations' transaction,
 * rather than Kysely's advisory lock on a fixed key, which a login with no
 * grants could take first and hold, hanging every migration and every
 * start with MIGRATE_ON_START. Two migrations at once still take turns.
 */

const skip = needsServer('roles are the server\'s, not the embedded database\'s')

/** The key of Kysely's own migration lock (PostgresAdapter's LOCK_ID in kysely). */
const KYSELY_LOCK_KEY = '3853314791062309107'

const stranger = `ocp_test_lock_stranger_${process.pid}`

async function connect (t: Test, url: string): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  t.teardown(() => client.end())
  return client
}

/** Until a migration of `url` waits on a lock. */
async function migrationWaiting (url: string): Promise<void> {
  await waitUntil(() => withAdmin(url, async (client) => (await client.query(`select count(*)::int as n from pg_stat_activity
    where datname = current_database() and application_name = 'ocp-api-migrate' and wait_event_type = 'Lock'`)).rows[0].n === 1), 'a migration waiting on a lock')
}

/** How many times each migration was applied, by name. */
async function appliedCounts (url: string): Promise<Record<string, number>> {
  return withAdmin(url, async (client) => {
    const { rows } = await client.query<{ name: string, n: number }>('select name, count(*)::int as n from kysely_migration group by name order by name')
    return Object.fromEntries(rows.map((row) => [row.name, row.n]))
  })
}

const once = Object.fromEntries(Object.keys(migrations).map((name) => [name, 1]))

t.test('a login with no grants holding Kysely\'s advisory lock stalls no migration', { skip }, async (t) => {
  const url = await extraDatabaseUrl('stranger')
  const server = await serverDatabaseUrl()
  await withAdmin(server, async (admin) => {
    await admin.query(`drop role if exists ${stranger}`)
    await admin.query(`create role ${stranger} login`)
  })
  t.teardown(() => withAdmin(server, (admin) => admin.query(`drop role if exists ${stranger}`)))
  const held = await connect(t, url)
  await held.query(`set role ${stranger}`)
  await held.query(`select pg_advisory_lock(${KYSELY_LOCK_KEY})`)
  const asStranger = new URL(url)
  asStranger.username = stranger
  await t.rejects(migrateToLatest(asStranger.toString()), { code: '42501', message: /permission denied for schema public/ }, 'it may not make the lock\'s table itself')

  t.same(await migrateToLatest(url), { applied: Object.keys(migrations) }, 'every migration applied, the advisory lock held')
  t.same(await appliedCounts(url), once)
  t.equal((await held.query('select count(*)::int as n from pg_locks where locktype = \'advisory\' and granted and pid = pg_backend_pid()')).rows[0].n, 1, 'still held')
  await t.rejects(held.query('select from kysely_migration_lock for update'), { code: '42501' }, 'nor can it lock the row that serializes migrations')
})

t.test('two migrations at once take turns: both succeed, each migration applied once', { skip }, async (t) => {
  const url = await extraDatabaseUrl('together')
  const [first, second] = await Promise.all([migrateToLatest(url), migrateToLatest(url)])
  t.same([...first!.applied, ...second!.applied], Object.keys(migrations), 'one applied them all, the other none')
  t.same(await appliedCounts(url), once)
})

t.test('the lock\'s tables made by another at the same moment: the migration goes on', { skip }, async (t) => {
  const url = await extraDatabaseUrl('race')
  // Another replica's `create table` of the lock table, not yet committed: this one's waits, then fails on its commit.
  const other = await connect(t, url)
  await other.query('begin')
  await other.query('create table kysely_migration_lock (id varchar(255) not null primary key, is_locked integer not null default 0)')
  const migrating = migrateToLatest(url)
  await migrationWaiting(url)
  await other.query('commit')
  t.same(await migrating, { applied: Object.keys(migrations) })
  t.same(await appliedCounts(url), once)
})

t.test('the row lock held: a migration waits for it, then runs', { skip }, async (t) => {
  const url = await extraDatabaseUrl('wait')
  await migrateToLatest(url)
  const holder = await connect(t, url)
  await holder.query('begin')
  await holder.query('select from kysely_migration_lock for update')
  let done = false
  const migrating = migrateToLatest(url).finally(() => { done = true })
  await migrationWaiting(url)
  t.notOk(done, 'waiting on the row')
  await holder.query('rollback')
  t.same(await migrating, { applied: [] }, 'then done, up to date')
})
