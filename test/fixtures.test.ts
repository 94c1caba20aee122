import { mkdtempSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { sql } from 'kysely'
import t from 'tap'
import { FixtureSchema, loadFixture, loadFixtureFile, parseFixture, TABLES, type Fixture, type FixtureRows } from '../db/fixtures.ts'
import type { Database } from '../db/schema.ts'
import { seed } from '../db/seed.ts'
import { build } from './helpers/app.ts'
import { testDatabaseUrl } from './helpers/database.ts'
import { root, runScript } from './helpers/run.ts'
import { writer } from './helpers/fixtures.ts'

// Fixtures: fixtures/demo.json loads, twice without change; a bad fixture is
// refused with the path of its problem, and nothing is written.

const demo = join(root, 'fixtures', 'demo.json')
const dir = mkdtempSync(join(tmpdir(), 'ocp-fixtures-'))
const file = (name: string, content: unknown) => {
  const path = join(dir, name)
  writeFileSync(path, typeof content === 'string' ? content : JSON.stringify(content))
  return path
}

const counts = async () => {
  const db = await writer()
  const result: Record<string, number> = {}
  for (const table of ['runs', 'tasks', 'task_attempts', 'threads', 'messages', 'artifacts', 'events'] as const) {
    result[table] = Number((await db.selectFrom(table).select((eb) => eb.fn.countAll<string>().as('n')).executeTakeFirstOrThrow()).n)
  }
  return result
}

const run = { run_id: 'fx-run', goal: 'g', summary: 's', status: 'running' }
const task = { run_id: 'fx-run', task_id: 'fx-task', title: 't', summary: 's', status: 'ready', priority: 'low', acceptance_json: null }

t.test('fixtures/demo.json loads, and loading it again changes nothing', async (t) => {
  const first = await seed(await testDatabaseUrl(), demo)
  t.match(first, /^seed: loaded .*demo\.json: 9 runs, 42 tasks, 40 task_attempts, 40 threads, 47 messages, 28 artifacts, 321 events$/)
  const after = await counts()
  t.match(await seed(await testDatabaseUrl(), demo), /nothing new$/, 'a second load inserts nothing')
  t.same(await counts(), after, 'and changes nothing')

  const app = await build(t)
  const runs = (await app.inject('/api/runs')).json().runs as Array<{ run: { run_id: string, status: string } }>
  t.same(new Set(runs.map((item) => item.run.status)), new Set(['done', 'running', 'failed']), 'runs in several states')
  let blocked = 0
  for (const item of runs) blocked += (await app.inject(`/api/runs/${item.run.run_id}/blocked`)).json().blocked.length
  t.equal(blocked, 2, 'blocked tasks with their questions')
  const events = (await app.inject('/api/events?limit=1000')).json().events as Array<{ event_type: string }>
  t.equal(events.length, 321)
})

t.test('a bad fixture is refused with the path of its problem', async (t) => {
  const cases: Array<[string, unknown, RegExp]> = [
    ['invalid JSON', '{"runs": [', /^invalid JSON: /],
    ['not an object', [], /^\(document\) must be object$/],
    ['unknown table', { widgets: [] }, /^widgets is not a column of this table$/],
    ['wrong type', { runs: [run], tasks: [task, task, task, { ...task, task_id: 'x', status: 7 }] }, /^tasks\[3\]\.status must be string$/],
    ['missing field', { runs: [{ ...run, goal: undefined }] }, /^runs\[0\]\.goal is required$/],
    ['missing raw JSON', { runs: [run], tasks: [{ ...task, acceptance_json: undefined }] }, /^tasks\[0\]\.acceptance_json is required$/],
    ['unknown column', { runs: [{ ...run, colour: 'red' }] }, /^runs\[0\]\.colour is not a column of this table$/],
    ['bad timestamp', { runs: [{ ...run, created_at: 'yesterday' }] }, /^runs\[0\]\.created_at must match format "date-time"$/],
    ['event without id', { events: [{ event_type: 'task_added' }] }, /^events\[0\]\.event_id is required$/]
  ]
  for (const [name, content, message] of cases) {
    t.throws(() => parseFixture(typeof content === 'string' ? content : JSON.stringify(content)), { name: 'FixtureError', message }, name)
  }
})

t.test('a dangling reference is refused by path, and nothing is written', async (t) => {
  const before = await counts()
  const db = await writer()
  const dangling: Array<[Fixture, RegExp]> = [
    [{ runs: [{ ...run, run_id: 'fx-new' }], tasks: [{ ...task, run_id: 'fx-missing' }] }, /^tasks\[0\]: run_id names no run/],
    [{ task_attempts: [{ run_id: 'nope', task_id: 'nope', attempt_no: 1, assigned_to: 'a', thread_id: 't', status: 's' }] }, /^task_attempts\[0\]: run_id and task_id name no task/],
    [{ messages: [{ message_id: 'm', thread_id: 'nope', from_agent: 'a', to_agent: 'b', kind: 'k', summary: 's', body: 'b', payload_json: {} }] }, /^messages\[0\]: thread_id names no thread/],
    [{ artifacts: [{ artifact_id: 'a', message_id: 'nope', path: 'p', kind: 'k', metadata_json: [] }] }, /^artifacts\[0\]: message_id names no message/]
  ]
  for (const [fixture, message] of dangling) await t.rejects(loadFixture(db, fixture), { name: 'FixtureError', message })
  // A failure inside the database (an attempt number out of integer range) rolls back the rows before it.
  await t.rejects(loadFixture(db, { runs: [{ ...run, run_id: 'fx-atomic' }], tasks: [{ ...task, run_id: 'fx-atomic', latest_attempt_no: 1e10 }] }))
  t.same(await counts(), before, 'nothing was written')
  await t.rejects(loadFixtureFile(db, join(dir, 'missing.json')), { message: /^cannot read .*missing\.json: ENOENT$/ })
})

t.test('rows referencing rows already in the database load; raw JSON of every kind passes through', async (t) => {
  const db = await writer()
  await loadFixture(db, { runs: [{ ...run, run_id: 'fx-base' }] })
  const { inserted } = await loadFixture(db, {
    tasks: ['text', 3.25, null, [1, { a: null }], { nested: { deep: true } }].map((acceptance, i) => ({ ...task, run_id: 'fx-base', task_id: `fx-${i}`, acceptance_json: acceptance }))
  })
  t.same(inserted, { tasks: 5 })
  const app = await build(t)
  const tasks = (await app.inject('/api/runs/fx-base/tasks')).json().tasks as Array<{ acceptance_json: unknown }>
  t.same(tasks.map((item) => item.acceptance_json), ['text', 3.25, null, [1, { a: null }], { nested: { deep: true } }])
})

t.test('a column with a default may be left out, as in an insert', async (t) => {
  const db = await writer()
  const bareRun = { run_id: 'fx-defaults', goal: 'g', status: 'running' }
  const bareTask = { run_id: 'fx-defaults', task_id: 'fx-task', title: 't', status: 'ready', priority: 'low', acceptance_json: null }
  t.same((await loadFixture(db, { runs: [bareRun], tasks: [bareTask] })).inserted, { runs: 1, tasks: 1 })
  const app = await build(t)
  const detail = (await app.inject('/api/runs/fx-defaults')).json().run
  t.equal(detail.run.summary, '', 'a run\'s summary defaults to \'\'')
  t.equal(detail.tasks[0].summary, '', 'and a task\'s')
})

t.test('npm run seed: the command line reports, and refuses bad fixtures with exit 1', async (t) => {
  const runSeed = (args: string[], env: Record<string, string>) => runScript(['db/seed.ts', ...args], env)
  const url = await testDatabaseUrl()
  // Four processes, each starting TypeScript: side by side, none depending on another's outcome.
  const [good, bad, usage, misconfigured] = await Promise.all([
    runSeed([file('good.json', { runs: [{ ...run, run_id: 'fx-cli' }] })], { DATABASE_URL: url }),
    runSeed([file('bad.json', { runs: [{ ...run, status: 1 }] })], { DATABASE_URL: url }),
    runSeed([], { DATABASE_URL: url }),
    runSeed([file('empty.json', { runs: [] })], { DATABASE_URL: 'not-a-url' })
  ])
  t.equal(good.code, 0)
  t.match(good.stdout, /seed: loaded .*good\.json: 1 runs/)
  t.equal(bad.code, 1)
  t.match(bad.stderr, /seed: refused, nothing written: runs\[0\]\.status must be string/)
  t.equal(usage.code, 2)
  t.match(usage.stderr, /usage: /)
  t.equal(misconfigured.code, 1)
  t.equal(misconfigured.stderr.trim(), 'seed: invalid configuration: env/DATABASE_URL must match pattern "^postgres(ql)?://"', 'a bad setting is one line, no stack')
})

/** Whether two unions of column names are the same set. */
type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false
/** true when every table's columns in db/schema.ts are those of its fixture row schema (else boolean): checked by the type check. */
type ColumnsAgree = { [T in keyof Database]: Same<keyof Database[T], keyof FixtureRows[T]> }[keyof Database]
const schemaTypesAgree: Same<ColumnsAgree, true> = true

t.test('the fixture row schemas have exactly the migrated tables\' columns (and db/schema.ts the same, by the type check)', async (t) => {
  t.ok(schemaTypesAgree)
  const db = await writer()
  for (const table of TABLES) {
    const { rows } = await sql<{ column_name: string }>`
      select column_name from information_schema.columns
      where table_schema = current_schema() and table_name = ${table} order by column_name`.execute(db)
    const items = (FixtureSchema.properties[table] as unknown as { items: { properties: Record<string, unknown> } }).items
    t.same(Object.keys(items.properties).sort(), rows.map((row) => row.column_name), table)
  }
})
