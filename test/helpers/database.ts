import { createHash } from 'node:crypto'
import { readdirSync, readFileSync } from 'node:fs'
import { basename, dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import pg from 'pg'
import t from 'tap'
import { startEmbeddedPostgres } from '../../db/embedded.ts'
import { migrateToLatest } from '../../db/migrate.ts'
import { testBackend } from './backend.ts'
import { withDatabase } from './wait.ts'

/*
 * Every test file (tap runs each in its own process) gets a database of its
 * own, so files never see each other's rows.
 *
 * On the server backend (the default), a database cloned from a migrated
 * template on the Postgres of DATABASE_URL when it is set, else of
 * testcontainers when a Docker engine answers; otherwise the tests stop and
 * say so. On the embedded backend (TEST_BACKEND=embedded, `npm run
 * test:embedded`), a throwaway in-memory PGlite of the file's own, started in
 * the test process behind the same loopback bridge the service uses.
 */

export { needsServer, testBackend } from './backend.ts'

const migrationsDir = join(dirname(fileURLToPath(import.meta.url)), '../../db/migrations')

const NO_DATABASE = `The tests need a Postgres server, and none was found.
  - Point them at one:  DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm test
    (the role needs CREATEDB: each test file creates and drops a database of its own)
  - or start a Docker engine, and testcontainers will run postgres:15-alpine for them.`

let serverUrl: Promise<string> | undefined

/** The server's admin URL: DATABASE_URL, else a testcontainers Postgres, else a clear error. */
export function serverDatabaseUrl (): Promise<string> {
  serverUrl ??= (async () => {
    const fromEnv = process.env.DATABASE_URL
    if (fromEnv !== undefined && fromEnv !== '') return fromEnv
    /* c8 ignore start: the coverage run has DATABASE_URL; CI runs this path in a run of its own (.ci/run, "testcontainers") */
    try {
      const { getContainerRuntimeClient } = await import('testcontainers')
      await getContainerRuntimeClient()
    } catch {
      throw new Error(NO_DATABASE)
    }
    const { PostgreSqlContainer } = await import('@testcontainers/postgresql')
    const container = await new PostgreSqlContainer('postgres:15-alpine').start()
    t.teardown(async () => { await container.stop() })
    return container.getConnectionUri()
    /* c8 ignore stop */
  })()
  return serverUrl
}

export { withDatabase }

/** A short fingerprint of the migrations, so a changed migration gets a fresh template. */
function migrationsFingerprint (): string {
  const hash = createHash('sha256')
  for (const file of readdirSync(migrationsDir).sort()) hash.update(file).update(readFileSync(join(migrationsDir, file)))
  return hash.digest('hex').slice(0, 12)
}

/**
 * A pool of a test's own. An idle connection of it may be ended under it: a
 * file's teardown drops its database with force, perhaps before the
 * backends of a pool just ended are gone (pg-pool's end() does not wait for
 * them). That FATAL would be an unhandled 'error', ending the test's process.
 */
export function testPool (connectionString: string, max: number): pg.Pool {
  const pool = new pg.Pool({ connectionString, max })
  /* c8 ignore next: reached only when a backend is ended under an idle connection, a race no test times */
  pool.on('error', () => {})
  return pool
}

/** Work on a connection of its own, closed after it: no idle connection outlives the work (a connection held idle across a test can be ended under it). */
export async function withAdmin<T> (url: string, work: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    return await work(client)
  } finally {
    await client.end()
  }
}

const TEMPLATE_LOCK = 0x6f6370 // any fixed key: serialises template creation across test processes

/** Creates (once per server and migration set) the migrated template database. */
async function ensureTemplate (url: string): Promise<string> {
  const template = `ocp_test_template_${migrationsFingerprint()}`
  await withAdmin(url, async (admin) => {
    await admin.query('select pg_advisory_lock($1)', [TEMPLATE_LOCK])
    try {
      const exists = await admin.query('select 1 from pg_database where datname = $1', [template])
      if (exists.rowCount === 0) {
        const building = `${template}_building`
        await admin.query(`drop database if exists "${building}"`)
        await admin.query(`create database "${building}"`)
        await migrateToLatest(withDatabase(url, building))
        // Renamed only once complete, so a crash never leaves a half-built template in use.
        await admin.query(`alter database "${building}" rename to "${template}"`)
      }
    } finally {
      await admin.query('select pg_advisory_unlock($1)', [TEMPLATE_LOCK])
    }
  })
  return template
}

let fileDatabase: Promise<string> | undefined

/**
 * The URL of this test file's own freshly migrated database, created on
 * first use and dropped when the file's tests end.
 */
export function testDatabaseUrl (): Promise<string> {
  fileDatabase ??= testBackend === 'embedded' ? embeddedDatabaseUrl() : serverFileDatabaseUrl()
  return fileDatabase
}

async function embeddedDatabaseUrl (): Promise<string> {
  const embedded = await startEmbeddedPostgres({ dataDir: 'memory://' })
  t.teardown(() => embedded.close())
  await migrateToLatest(embedded.url)
  return embedded.url
}

function serverFileDatabaseUrl (): Promise<string> {
  return (async () => {
    const url = await serverDatabaseUrl()
    const template = await ensureTemplate(url)
    const slug = basename(process.argv[1] ?? 'test').replace(/\.test\.ts$/, '').replace(/[^a-z0-9]+/gi, '_').toLowerCase()
    const name = `ocp_test_${slug}_${process.pid}`.slice(0, 63)
    await withAdmin(url, async (admin) => {
      await admin.query(`drop database if exists "${name}" with (force)`)
      await admin.query(`create database "${name}" template "${template}"`)
    })
    t.teardown(() => withAdmin(url, (admin) => admin.query(`drop database if exists "${name}" with (force)`)))
    return withDatabase(url, name)
  })()
}

/**
 * Another database for this file, empty (no migration applied), gone when
 * the file's tests end: on the server, `<file database>_<suffix>`; on the
 * embedded backend, a PGlite of its own.
 */
export async function extraDatabaseUrl (suffix: string): Promise<string> {
  if (testBackend === 'embedded') {
    const embedded = await startEmbeddedPostgres({ dataDir: 'memory://' })
    t.teardown(() => embedded.close())
    return embedded.url
  }
  const url = await serverDatabaseUrl()
  const name = `${new URL(await testDatabaseUrl()).pathname.slice(1, 50)}_${suffix}`.slice(0, 63)
  await withAdmin(url, async (admin) => {
    await admin.query(`drop database if exists "${name}" with (force)`)
    await admin.query(`create database "${name}"`)
  })
  t.teardown(() => withAdmin(url, (admin) => admin.query(`drop database if exists "${name}" with (force)`)))
  return withDatabase(url, name)
}
