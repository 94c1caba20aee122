import pg from 'pg'
import t from 'tap'
import { Kysely, PostgresDialect, sql } from 'kysely'
import { Migrator } from 'kysely/migration'
import { migrateToLatest } from '../db/migrate.ts'
import { migrations } from '../db/migrations/index.ts'
import { extraDatabaseUrl, testPool } from './helpers/database.ts'
import { runScript as run } from './helpers/run.ts'
import { openStream } from './helpers/sse.ts'
import { LONG_WAIT_MS, PROMPTLY_MS } from './helpers/wait.ts'
import { runAsUser } from './helpers/docs.ts'
import { root } from './helpers/run.ts'
import { createServer } from 'node:net'

// The two entry points as a user runs them: the server and `npm run migrate`.

t.test('migrateToLatest applies pending migrations once', async (t) => {
  const url = await extraDatabaseUrl('migrate_fn')
  t.same(await migrateToLatest(url), { applied: Object.keys(migrations) })
  t.same(await migrateToLatest(url), { applied: [] }, 'nothing left to apply')
  await t.rejects(migrateToLatest('postgres://postgres@127.0.0.1:1/none'), /ECONNREFUSED|connect/)
})

t.test('a failing migration is reported by name, and rolls back', async (t) => {
  const url = await extraDatabaseUrl('migrate_fail')
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  await client.query('create table runs (x int)') // a "runs" that is not ours: 0001 cannot index it
  await t.rejects(migrateToLatest(url), /^migration 0001_control_plane_schema failed: column "created_at" does not exist/)
  const tables = await client.query('select count(*)::int as n from pg_tables where tablename = \'tasks\'')
  t.equal(tables.rows[0].n, 0, 'nothing of the failed migration remains')
  await client.end()
})

t.test('every migration can be rolled back', async (t) => {
  const url = await extraDatabaseUrl('migrate_down')
  await migrateToLatest(url)
  const pool = testPool(url, 1)
  const db = new Kysely<unknown>({ dialect: new PostgresDialect({ pool }) })
  const migrator = new Migrator({ db, provider: { getMigrations: async () => migrations } })
  for (const name of Object.keys(migrations).reverse()) {
    const { error, results } = await migrator.migrateDown()
    t.equal(error, undefined, `${name} rolls back`)
    t.equal(results?.[0]?.migrationName, name)
  }
  const left = await sql<{ n: number }>`select count(*)::int as n from pg_tables where schemaname = 'public' and tablename not like 'kysely_%'`.execute(db)
  t.equal(left.rows[0]?.n, 0, 'no table is left')
  await db.destroy()
  t.same(await migrateToLatest(url), { applied: Object.keys(migrations) }, 'and it migrates up again')
})

t.test('npm run migrate: applies, reports, and fails with the reason', async (t) => {
  const url = await extraDatabaseUrl('migrate_cli')
  // A process starting TypeScript each: the unreachable database's beside the two that take turns.
  const unreachable = run('db/migrate.ts', { DATABASE_URL: 'postgres://postgres@127.0.0.1:1/none' })
  const first = await run('db/migrate.ts', { DATABASE_URL: url })
  t.equal(first.code, 0, first.stderr)
  t.match(first.stdout, /applied 0001_control_plane_schema/)
  const again = await run('db/migrate.ts', { DATABASE_URL: url })
  t.match(again.stdout, /already up to date/)
  const down = await unreachable
  t.equal(down.code, 1)
  t.match(down.stderr, /^migrate: .*ECONNREFUSED/)
})

t.test('the server refuses a bad configuration, naming the variable', async (t) => {
  // Three processes starting TypeScript, side by side.
  const [outcome, notPostgres, badRetention] = await Promise.all([
    run('server.ts', { DATABASE_URL: 'postgres://x/y', PORT: '99999' }),
    run('server.ts', { DATABASE_URL: 'mysql://x/y' }),
    run('server.ts', { DATABASE_URL: 'postgres://x/y', EVENTS_RETENTION: '30 days' })
  ])
  t.equal(outcome.code, 1)
  t.match(outcome.stderr, /PORT must be <= 65535/)
  t.equal(notPostgres.code, 1)
  t.match(notPostgres.stderr, /DATABASE_URL must match/)
  t.equal(badRetention.code, 1)
  t.match(badRetention.stderr, /EVENTS_RETENTION must match pattern/)
})

t.test('a port in use is named by PORT: npm start says so before it builds, the server when it listens', async (t) => {
  const taken = createServer()
  await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve))
  t.teardown(() => taken.close())
  const { port } = taken.address() as { port: number }
  const inUse = `port ${port} is in use: set PORT to another port\n`
  const url = await extraDatabaseUrl('port_in_use')
  // Three processes, side by side; the port stays taken until the test ends. The last is the server
  // itself (the image's command, or a port taken after the check).
  const [started, badSetting, outcome] = await Promise.all([
    runAsUser(['npm', 'start'], root, { HOST: '127.0.0.1', PORT: String(port) }),
    runAsUser(['npm', 'start'], root, { LOG_LEVEL: 'loud' }),
    run('server.ts', { DATABASE_URL: url, HOST: '127.0.0.1', PORT: String(port), LOG_LEVEL: 'silent' })
  ])
  t.equal(started.code, 1)
  t.match(started.stderr, new RegExp(`^${inUse}`))
  t.notMatch(started.stdout, /> ocp-api@\S+ build\n/, 'before the build')
  t.equal(badSetting.code, 1)
  t.match(badSetting.stderr, /^invalid configuration: env\/LOG_LEVEL must be equal to one of the allowed values\n/)
  t.equal(outcome.code, 1)
  t.equal(outcome.stderr, inUse)
})

t.test('the server exits non-zero when the database is unreachable at start', async (t) => {
  const outcome = await run('server.ts', { DATABASE_URL: 'postgres://postgres@127.0.0.1:1/none', PORT: '0' })
  t.equal(outcome.code, 1)
  t.match(outcome.stderr, /failed to start/)
})

t.test('the server migrates, serves, and stops on SIGTERM', async (t) => {
  const url = await extraDatabaseUrl('server')
  let checked = false
  // A deprecated setting's name still works, with a warning at start.
  const outcome = await run('server.ts', { DATABASE_URL: url, PORT: '0', HOST: '127.0.0.1', EVENTS_CLOCK_INTERVAL_MS: '500' }, (stdout, child) => {
    const match = /Server listening at (http:\/\/127\.0\.0\.1:\d+)/.exec(stdout)
    if (match === null || checked) return
    checked = true
    void (async () => {
      const health = await fetch(`${match[1]}/health`)
      t.same(await health.json(), { status: 'ok' })
      const runs = await fetch(`${match[1]}/api/runs`)
      t.same(await runs.json(), { runs: [] }, 'the migrated schema is served')
    })().finally(() => child.kill('SIGTERM'))
  })
  t.ok(checked, 'it listened')
  t.equal(outcome.code, 0, 'a clean exit on SIGTERM')
  t.match(outcome.stdout, /database migrated/)
  t.match(outcome.stdout, /shutting down/)
  t.match(outcome.stdout, /"level":40,.*"msg":"EVENTS_CLOCK_INTERVAL_MS is deprecated: use EVENTS_KEEPER_INTERVAL_MS"/, 'warned of once')
})

t.test('SIGTERM ends open event streams and exits cleanly within the grace', async (t) => {
  const url = await extraDatabaseUrl('sigterm')
  await migrateToLatest(url)
  let streamEnded: Promise<void> | undefined
  const started = { at: 0 }
  const outcome = await run('server.ts', { DATABASE_URL: url, PORT: '0', HOST: '127.0.0.1', SHUTDOWN_GRACE_MS: String(LONG_WAIT_MS) }, (stdout, child) => {
    const match = /Server listening at (http:\/\/127\.0\.0\.1:\d+)/.exec(stdout)
    if (match === null || streamEnded !== undefined) return
    let stopped = false
    streamEnded = (async () => {
      const stream = await openStream(match[1]!, '/api/events/stream')
      await stream.waitFor((s) => s.frames.length >= 1)
      started.at = Date.now()
      stopped = child.kill('SIGTERM')
      await stream.ended
    })().finally(() => {
      // A stream that never opened must not leave the server running (the test would wait for it forever);
      // never a second SIGTERM, which forces the exit this test checks is clean.
      if (!stopped) child.kill('SIGTERM')
    })
  })
  await streamEnded
  t.equal(outcome.code, 0, 'exit 0')
  t.ok(Date.now() - started.at < PROMPTLY_MS, 'well within the grace')
  t.match(outcome.stdout, /"signal":"SIGTERM"/)
})

t.test('LOG_FORMAT=pretty writes readable lines instead of JSON', async (t) => {
  const url = await extraDatabaseUrl('pretty')
  await migrateToLatest(url)
  let stopped = false
  const outcome = await run('server.ts', { DATABASE_URL: url, PORT: '0', HOST: '127.0.0.1', LOG_FORMAT: 'pretty' }, (stdout, child) => {
    if (stopped || !/Server listening/.test(stdout)) return
    stopped = true
    child.kill('SIGTERM')
  })
  t.ok(stopped)
  t.equal(outcome.code, 0)
  t.match(outcome.stdout, /INFO.*Server listening at/)
  t.notMatch(outcome.stdout, /^\{"level"/m, 'no JSON lines')
})

t.test('a restart on a migrated database finds it up to date', async (t) => {
  const url = await extraDatabaseUrl('restart')
  await migrateToLatest(url)
  let listened = false
  const outcome = await run('server.ts', { DATABASE_URL: url, PORT: '0', HOST: '127.0.0.1' }, (stdout, child) => {
    if (listened || !/Server listening/.test(stdout)) return
    listened = true
    child.kill('SIGINT')
  })
  t.ok(listened)
  t.equal(outcome.code, 0)
  t.match(outcome.stdout, /database schema up to date/)
})

t.test('MIGRATE_ON_START=false leaves the schema alone', async (t) => {
  const url = await extraDatabaseUrl('nomigrate')
  let checked = false
  await run('server.ts', { DATABASE_URL: url, PORT: '0', HOST: '127.0.0.1', MIGRATE_ON_START: 'false' }, (stdout, child) => {
    const match = /Server listening at (http:\/\/127\.0\.0\.1:\d+)/.exec(stdout)
    if (match === null || checked) return
    checked = true
    void (async () => {
      const res = await fetch(`${match[1]}/api/runs`)
      t.equal(res.status, 500, 'no tables: the unforeseen, as a bare 500')
      t.same(await res.json(), { error: { code: 'internal', message: 'internal server error' } })
    })().finally(() => child.kill('SIGTERM'))
  })
  t.ok(checked)
})
