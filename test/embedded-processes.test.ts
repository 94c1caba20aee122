import { execFile } from 'node:child_process'
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import pg from 'pg'
import t, { type Test } from 'tap'
import { startEmbeddedPostgres, withDatabaseUrl } from '../db/embedded.ts'
import { root, runScript } from './helpers/run.ts'

// The embedded database (db/embedded.ts) across processes: its data
// directory's lock, the scripts and the server started without
// DATABASE_URL, and a V8 setting that only a process of its own shows. Apart
// from test/embedded.test.ts (the bridge within one process) because each
// test here starts Node processes that compile PGlite: on a loaded machine
// the two together came near one file's time limit.

function tempDir (t: Test): string {
  const dir = mkdtempSync(join(tmpdir(), 'ocp-embedded-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  return dir
}

t.test('a data directory persists, and is refused to a second process while in use', async (t) => {
  const dataDir = tempDir(t)
  const first = await startEmbeddedPostgres({ dataDir })
  const client = new pg.Client({ connectionString: first.url })
  await client.connect()
  await client.query('create table kept (v text); insert into kept values ($$here$$)')
  await client.end()
  const busy = await runScript(['db/migrate.ts'], { PGLITE_DATA_DIR: dataDir })
  t.equal(busy.code, 1)
  t.match(busy.stderr, /the embedded database in .* is in use by process \d+/)
  const misconfigured = await runScript(['db/migrate.ts'], { PGLITE_DATA_DIR: dataDir, DATABASE_URL: 'not-a-url' })
  t.equal(misconfigured.code, 1)
  t.equal(misconfigured.stderr.trim(), 'migrate: invalid configuration: env/DATABASE_URL must match pattern "^postgres(ql)?://"', 'a bad setting is one line, no stack')
  await first.close()
  t.notOk(existsSync(join(dataDir, 'ocp-embedded.pid')), 'the lock goes with the process')
  const answer = await withDatabaseUrl({ PGLITE_DATA_DIR: dataDir }, async (url) => {
    const reader = new pg.Client({ connectionString: url })
    await reader.connect()
    try {
      return (await reader.query('select v from kept')).rows
    } finally {
      await reader.end()
    }
  })
  t.same(answer, [{ v: 'here' }])
  const stale = tempDir(t)
  writeFileSync(join(stale, 'ocp-embedded.pid'), '2147483646') // a process long gone
  await (await startEmbeddedPostgres({ dataDir: stale })).close()
  t.pass('a stale lock does not hold the data directory')
  const broken = tempDir(t)
  writeFileSync(join(broken, 'PG_VERSION'), '9\n')
  await t.rejects(startEmbeddedPostgres({ dataDir: broken }), /PGlite failed to initialize/)
  t.notOk(existsSync(join(broken, 'ocp-embedded.pid')), 'no lock left behind by a failed start')
  t.equal(await withDatabaseUrl({ DATABASE_URL: 'postgres://elsewhere/db', PGLITE_DATA_DIR: dataDir }, async (url) => url), 'postgres://elsewhere/db')
})

t.test('with no DATABASE_URL: migrate, seed and the server use the embedded database', async (t) => {
  const dataDir = tempDir(t)
  const env = { PGLITE_DATA_DIR: dataDir, PORT: '0', HOST: '127.0.0.1' }
  const migrated = await runScript('db/migrate.ts', env)
  t.equal(migrated.code, 0, migrated.stderr)
  t.match(migrated.stdout, /applied 0001_control_plane_schema/)
  const seeded = await runScript(['db/seed.ts', 'fixtures/demo.json'], env)
  t.equal(seeded.code, 0, seeded.stderr)
  t.match(seeded.stdout, /loaded fixtures\/demo\.json: 9 runs/)
  let checked = false
  const outcome = await runScript('server.ts', env, (stdout, child) => {
    const match = /Server listening at (http:\/\/127\.0\.0\.1:\d+)/.exec(stdout)
    if (match === null || checked) return
    checked = true
    void (async () => {
      t.equal((await fetch(`${match[1]}/ready`)).status, 200)
      const { runs } = await (await fetch(`${match[1]}/api/runs`)).json() as { runs: unknown[] }
      t.equal(runs.length, 9, 'the seeded runs are served')
    })().finally(() => child.kill('SIGTERM'))
  })
  t.ok(checked, 'it listened')
  t.equal(outcome.code, 0)
  t.match(outcome.stdout, /no DATABASE_URL: using the embedded database \(PGlite\), for development and CI only, not for production/)
  t.match(outcome.stdout, /database schema up to date/)
  t.notOk(existsSync(join(dataDir, 'ocp-embedded.pid')), 'closed on exit')
})

t.test('the embedded database turns off V8\'s Wasm code GC, whose race with a wrapper\'s tier-up crashes Node 24 (db/embedded.ts)', async (t) => {
  const churn = (mode: string) => new Promise<{ stdout: string, signal: string | null }>((resolve, reject) => {
    execFile(process.execPath, ['--trace-wasm-code-gc', ...process.execArgv, join(root, 'test/helpers/wasm-churn.ts'), mode], { cwd: root, maxBuffer: 64 << 20 },
      (err, stdout) => {
        if (err === null) resolve({ stdout, signal: null })
        // Without the setting, the race itself may kill the churn (SIGABRT, SIGILL).
        else if (mode === 'bare' && typeof err.signal === 'string') resolve({ stdout, signal: err.signal })
        else reject(err)
      })
  })
  const [bare, embedded] = await Promise.all([churn('bare'), churn('embedded')])
  if (bare.signal === null) {
    t.match(bare.stdout, /churned/)
    t.match(bare.stdout, /\[wasm-gc\]/, 'without it, PGlite\'s churn runs the code GC (so this test can tell)')
  } else {
    // Its trace may still sit in the killed process's buffer.
    t.pass(`without it, the churn was killed (${bare.signal}): the race itself`)
  }
  t.match(embedded.stdout, /churned/)
  t.notMatch(embedded.stdout, /\[wasm-gc\]/, 'once the embedded database has started, it never runs')
})
