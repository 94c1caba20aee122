import t from 'tap'
import { migrateToLatest } from '../db/migrate.ts'
import { migrations } from '../db/migrations/index.ts'
import { extraDatabaseUrl, withAdmin } from './helpers/database.ts'
import { runScript, type Outcome } from './helpers/run.ts'

/*
 * A rollback, or the older replicas of a rolling deploy: this version on a
 * database that a newer one migrated (docs/operating.md, "Upgrades,
 * rolling deploys and rollbacks"). Here the newer version is simulated: a
 * row in kysely_migration that this version does not know, and what a
 * compatible migration adds (a column with a default, a table). This
 * version starts and serves, with MIGRATE_ON_START or without, saying
 * once which migrations are a newer version's; a database whose
 * migrations are another line (a fork) is refused. test/versions.test.ts
 * runs the previous release's own code.
 */

const names = Object.keys(migrations)
const NEWER = '9999_from_a_newer_version'

/** A fresh database of this file's own, migrated by this version. */
async function migratedDatabase (name: string): Promise<string> {
  const url = await extraDatabaseUrl(name)
  await migrateToLatest(url)
  return url
}

/** What a newer version's compatible migration leaves: its row, a column with a default, a table. */
async function migrateAsNewerVersion (url: string, name = NEWER): Promise<void> {
  await withAdmin(url, async (client) => {
    await client.query('alter table runs add column if not exists priority integer not null default 0')
    await client.query('create table if not exists run_labels (run_id text not null references runs, label text not null)')
    await client.query('insert into kysely_migration (name, timestamp) values ($1, $2)', [name, new Date(Date.now() + 1000).toISOString()])
    await client.query("insert into runs (run_id, goal, status) values ('run-newer', 'written by the newer version', 'running') on conflict do nothing")
  })
}

/**
 * Runs server.ts on `url` with `env`; once it listens, `use` gets its base
 * URL, then it is stopped with SIGTERM. With `use` absent, it is expected
 * not to listen.
 */
async function serve (url: string, env: Record<string, string>, use?: (base: string) => Promise<void>): Promise<Outcome> {
  let using: Promise<void> | undefined
  let failure: unknown
  const outcome = await runScript('server.ts', { DATABASE_URL: url, PORT: '0', HOST: '127.0.0.1', ...env }, (stdout, child) => {
    const match = /Server listening at (http:\/\/127\.0\.0\.1:\d+)/.exec(stdout)
    if (match === null || using !== undefined) return
    using = (use ?? (async () => { throw new Error('it listened') }))(match[1]!).catch((err: unknown) => { failure = err }).finally(() => child.kill('SIGTERM'))
  })
  await using
  if (failure !== undefined) throw failure
  return outcome
}

/** The lines of `stdout` at warn level (pino's 40). */
const warnings = (stdout: string) => stdout.split('\n').filter((line) => line.includes('"level":40'))

t.test('a database a newer version migrated: migrateToLatest leaves it, naming its migrations', async (t) => {
  const url = await migratedDatabase('fn')
  await migrateAsNewerVersion(url)
  t.same(await migrateToLatest(url), { applied: [], newer: [NEWER] })
  await withAdmin(url, (client) => client.query('delete from kysely_migration where name = $1', [names.at(-1)]))
  await t.rejects(migrateToLatest(url), new RegExp(`^migrations failed: the database holds migrations this version does not know \\(${NEWER}\\) and lacks ${names.at(-1)} of its own: another line of migrations \\(a fork\\)`),
    'one of its own missing besides: a fork, refused')
})

for (const migrateOnStart of ['true', 'false']) {
  t.test(`MIGRATE_ON_START=${migrateOnStart} on a database a newer version migrated: it serves, saying so once`, async (t) => {
    const url = await migratedDatabase(`serve_${migrateOnStart}`)
    await migrateAsNewerVersion(url)
    const outcome = await serve(url, { MIGRATE_ON_START: migrateOnStart }, async (base) => {
      const runs = await fetch(`${base}/api/runs`)
      t.equal(runs.status, 200)
      t.match(await runs.json(), { runs: [{ run: { run_id: 'run-newer', goal: 'written by the newer version' } }] }, 'its rows, read past the newer column')
      t.notMatch(await (await fetch(`${base}/api/runs/run-newer`)).text(), 'priority', 'whose column this version does not show')
    })
    t.equal(outcome.code, 0, outcome.stderr)
    const warned = warnings(outcome.stdout)
    t.equal(warned.length, 1, 'one warning')
    t.match(warned[0], `the database was migrated by a newer version of this service (migration ${NEWER}, unknown here)`)
    t.match(warned[0], `"newer":["${NEWER}"]`)
  })
}

t.test('a fork of the migrations is refused at start, with MIGRATE_ON_START or without', async (t) => {
  const url = await migratedDatabase('fork')
  // A migration of another line, named among this version's own.
  const among = `${names.at(-2)}_other_line`
  await migrateAsNewerVersion(url, among)
  for (const migrateOnStart of ['true', 'false']) {
    const outcome = await serve(url, { MIGRATE_ON_START: migrateOnStart })
    t.equal(outcome.code, 1)
    t.match(outcome.stderr, `failed to start: ${migrateOnStart === 'true' ? 'migrations failed: ' : ''}the database holds migrations this version does not know (${among}) that sort among its own (before ${names.at(-1)}): another line of migrations (a fork)`)
  }
})

t.test('npm run migrate on a database a newer version migrated: nothing to do, saying why', async (t) => {
  const url = await migratedDatabase('cli')
  await migrateAsNewerVersion(url)
  await migrateAsNewerVersion(url, `${NEWER}_again`)
  const outcome = await runScript('db/migrate.ts', { DATABASE_URL: url })
  t.equal(outcome.code, 0, outcome.stderr)
  t.match(outcome.stdout, /^migrate: already up to date\n$/)
  t.match(outcome.stderr, `migrate: the database was migrated by a newer version of this service (migrations ${NEWER}, ${NEWER}_again, unknown here)`)
})

t.test('MIGRATE_ON_START=false, and the database out of reach at start: it starts all the same, saying so', async (t) => {
  const outcome = await serve('postgres://postgres@127.0.0.1:1/none', { MIGRATE_ON_START: 'false' }, async (base) => {
    t.equal((await fetch(`${base}/health`)).status, 200)
  })
  t.equal(outcome.code, 0, outcome.stderr)
  t.match(outcome.stdout, /"level":40.*could not read the migrations applied to DATABASE_URL at start/)
})
