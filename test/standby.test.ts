import { Kysely, PostgresDialect } from 'kysely'
import t, { type Test } from 'tap'
import { buildApp } from '../app.ts'
import { loadConfig } from '../config.ts'
import { migrateToLatest, schemaState } from '../db/migrate.ts'
import { migrations } from '../db/migrations/index.ts'
import type { Database } from '../db/schema.ts'
import { addTask, createRun, dispatchTask, postMessage, recordChange } from '../db/writer.ts'
import { assertSchema } from './helpers/contract.ts'
import { testPool, withDatabase } from './helpers/database.ts'
import { makeArtifact, makeAttempt, makeMessage, makeRun, makeTask, makeThread } from './helpers/fixtures.ts'
import { runScript, type Outcome } from './helpers/run.ts'
import { openStream } from './helpers/sse.ts'
import { queryOn as query, startReplicatedPostgres, standbySkipReason } from './helpers/standby.ts'

// The service on a hot standby (docs/reference.md, "Read replicas"), on a primary and a
// streaming standby of the test's own. The service reads as a read-only
// role that the primary's pg_hba.conf rejects: a read that reached the
// primary would fail, and would show in the primary's log.

const names = Object.keys(migrations)
const lastMigration = names.at(-1)!

/**
 * Runs server.ts with `env` until `use` (given its base URL) is done, then
 * stops it with SIGTERM; with `use` absent, it is expected not to listen.
 */
async function serve (env: Record<string, string>, use?: (base: string) => Promise<void>): Promise<Outcome> {
  let using: Promise<void> | undefined
  let failure: unknown
  const outcome = await runScript('server.ts', { PORT: '0', HOST: '127.0.0.1', EVENTS_POLL_INTERVAL_MS: '50', ...env }, (stdout, child) => {
    const match = /Server listening at (http:\/\/127\.0\.0\.1:\d+)/.exec(stdout)
    if (match === null || using !== undefined) return
    if (use === undefined) { child.kill('SIGTERM'); return }
    using = use(match[1]!).catch((err: unknown) => { failure = err }).finally(() => child.kill('SIGTERM'))
  })
  await using
  if (failure !== undefined) throw failure
  return outcome
}

/** A read-write Kysely over `url`, as an orchestrator writes (on the primary). */
function writerOn (t: Test, url: string): Kysely<Database> {
  const db = new Kysely<Database>({ dialect: new PostgresDialect({ pool: testPool(url, 2) }) })
  t.teardown(() => db.destroy())
  return db
}

const skip = standbySkipReason()

t.test('the service on a primary and its hot standby', { skip }, async (t) => {
  const pg15 = await startReplicatedPostgres(t)
  const on = (url: string, database: string) => withDatabase(url, database)
  // The database every subtest below reads: migrated by the service's own start in the first.
  const database = 'ocp_replicated'
  await pg15.createDatabase(database)
  const primary = on(pg15.primaryUrl, database)
  const reader = on(pg15.readerUrl, database)
  const writer = writerOn(t, primary)
  const written = { runId: 'run-replicated', taskId: 'task-replicated', threadId: 'thread-replicated' }
  /** Every event id on the primary, in order. */
  const eventIdsOnPrimary = async () => (await query(primary, 'select event_id from events order by event_id')).map((row) => Number(row.event_id))

  await t.test('DATABASE_URL on the primary, DATABASE_READ_URL on the standby: migrations go to the primary, every read to the standby', async (t) => {
    const primaryLogBefore = pg15.log('primary').length
    const standbyLogBefore = pg15.log('standby').length
    const outcome = await serve({ DATABASE_URL: primary, DATABASE_READ_URL: reader }, async (base) => {
      const applied = await query(primary, 'select name from kysely_migration order by name')
      t.same(applied.map((row) => row.name), names, 'the start migrated the primary')

      // Fetch, then subscribe from the fetch's cursor (the README's recipe), then write on the primary.
      const list = await fetch(`${base}/api/runs`)
      t.same(await list.json(), { runs: [] })
      const cursor = list.headers.get('x-event-cursor')
      t.equal(cursor, '0')
      const stream = await openStream(base, `/api/events/stream?after_event_id=${cursor}`)
      t.teardown(stream.close)

      const { runId, taskId, threadId } = written
      await createRun(writer, makeRun({ run_id: runId, goal: 'Replicate' }))
      await addTask(writer, makeTask({ run_id: runId, task_id: taskId }))
      await dispatchTask(writer, makeAttempt({ run_id: runId, task_id: taskId, thread_id: threadId }), makeThread({ run_id: runId, task_id: taskId }))
      const message = makeMessage({ thread_id: threadId, message_id: 'message-replicated', summary: 'Replayed' })
      const lastEventId = await postMessage(writer, { run_id: runId, task_id: taskId }, message, [makeArtifact({ message_id: message.message_id })])
      await pg15.waitForReplay()
      const eventIds = await eventIdsOnPrimary()
      t.equal(eventIds.length, 5, 'run_created, task_added, task_dispatched, thread_claim, thread_update')

      const runs = await fetch(`${base}/api/runs`)
      const { runs: [item] } = await runs.json() as { runs: Array<{ run: { run_id: string } }> }
      t.match(item, { run: { run_id: runId, goal: 'Replicate' }, task_counts: { dispatched: 1 }, total_tasks: 1 }, 'the run list shows what the primary wrote')
      const detail = await fetch(`${base}/api/runs/${runId}`)
      t.equal(detail.status, 200)
      const { run } = await detail.json() as { run: unknown }
      assertSchema(t, 'RunDetail', run)
      t.match(run, { run: { run_id: runId }, total_tasks: 1, task_counts: { dispatched: 1 }, tasks: [{ task_id: taskId, latest_attempt_no: 1 }] }, 'and the run detail')
      t.equal(detail.headers.get('x-event-cursor'), String(lastEventId), 'its cursor is the last event replayed')
      const thread = await fetch(`${base}/api/threads/${threadId}`)
      const detailOfThread = (await thread.json() as { thread: unknown }).thread
      assertSchema(t, 'ThreadDetail', detailOfThread)
      t.match(detailOfThread, { thread: { thread_id: threadId, status: 'claimed' }, messages: [{ message_id: 'message-replicated', artifacts: [{ message_id: 'message-replicated' }] }] }, 'and the thread detail')

      await stream.waitFor((s) => s.events().some((event) => event.event_id === lastEventId))
      t.same(stream.events().map((event) => event.event_id), eventIds, 'the stream delivers every event written on the primary, once, in order')
    })
    t.equal(outcome.code, 0, outcome.stderr)
    t.match(outcome.stdout, /reads go to DATABASE_READ_URL; migrations and the event log's keeper to DATABASE_URL/)
    t.match(outcome.stdout, /database migrated/)
    t.notMatch(outcome.stdout, /keeper is off/)

    const primaryLog = pg15.log('primary').slice(primaryLogBefore)
    const standbyLog = pg15.log('standby').slice(standbyLogBefore)
    t.match(primaryLog, /user=postgres database=ocp_replicated application_name=ocp-api-migrate$/m, 'the primary saw the migrations')
    t.notMatch(primaryLog, /application_name=ocp-api$/m, 'and no connection of the request pool')
    t.notMatch(primaryLog, /ocp_reader/, 'and nothing of the reading role')
    t.match(standbyLog, /user=ocp_reader database=ocp_replicated application_name=ocp-api$/m, 'the request pool read the standby')
    t.match(standbyLog, /user=ocp_reader database=ocp_replicated application_name=ocp-api-schema-check$/m, 'which was checked for the migrations first')
  })

  await t.test('DATABASE_URL alone on the standby: starts, serves reads and streams, says the keeper is off', async (t) => {
    const primaryLogBefore = pg15.log('primary').length
    const outcome = await serve({ DATABASE_URL: reader }, async (base) => {
      const detail = await fetch(`${base}/api/runs/${written.runId}`)
      t.equal(detail.status, 200)
      t.match(await detail.json(), { run: { run: { run_id: written.runId }, total_tasks: 1 } })
      const thread = await fetch(`${base}/api/threads/${written.threadId}`)
      t.equal(thread.status, 200)

      const stream = await openStream(base, '/api/events/stream?after_event_id=0')
      t.teardown(stream.close)
      const later = await recordChange(writer, { event_type: 'run_status', run_id: written.runId, summary: 'Still replicating' })
      await stream.waitFor((s) => s.events().some((event) => event.event_id === later))
      t.same(stream.events().map((event) => event.event_id), await eventIdsOnPrimary(), 'the history, then what the primary writes next')
    })
    t.equal(outcome.code, 0, outcome.stderr)
    t.match(outcome.stdout, /DATABASE_URL names a hot standby: the event log's keeper is off here/)
    t.equal(outcome.stdout.match(/keeper is off/g)?.length, 1, 'said once')
    t.match(outcome.stdout, /"MIGRATE_ON_START":true.*nothing is migrated there, whatever MIGRATE_ON_START says/)
    t.notMatch(outcome.stdout, /database migrated|schema up to date/)
    t.notMatch(pg15.log('primary').slice(primaryLogBefore), /ocp_reader/, 'the primary saw nothing of it')
  })

  await t.test('the decorators: where reads, migrations and the keeper go', async (t) => {
    const env = { LOG_LEVEL: 'silent' }
    const split = await buildApp(loadConfig({ ...env, DATABASE_URL: primary, DATABASE_READ_URL: reader }))
    t.teardown(() => split.close())
    t.same([split.databaseUrl, split.readDatabaseUrl, split.keeperDatabaseUrl, split.wakeupDatabaseUrl], [primary, reader, primary, reader], 'the wake-up streams the standby\'s WAL, as the reading role')
    const standbyAlone = await buildApp(loadConfig({ ...env, DATABASE_URL: reader }))
    t.teardown(() => standbyAlone.close())
    t.same([standbyAlone.databaseUrl, standbyAlone.readDatabaseUrl, standbyAlone.keeperDatabaseUrl, standbyAlone.wakeupDatabaseUrl], [reader, reader, undefined, reader], 'no keeper on a standby')
    // The primary refuses the reading role (its pg_hba.conf): a read server that cannot be asked is taken for a standby.
    const unasked = on(pg15.primaryReaderUrl, database)
    const refused = await buildApp(loadConfig({ ...env, DATABASE_URL: primary, DATABASE_READ_URL: unasked }))
    t.teardown(() => refused.close())
    t.equal(refused.wakeupDatabaseUrl, unasked, 'a read server that cannot be asked: the wake-up connects to it')
  })

  await t.test('a migration pending on the standby: the service refuses to start, naming it', async (t) => {
    const behind = 'ocp_behind'
    await pg15.createDatabase(behind)
    await migrateToLatest(on(pg15.primaryUrl, behind))
    // As if this version of the service brought a migration the primary has not had yet.
    await query(on(pg15.primaryUrl, behind), 'delete from kysely_migration where name = $1', [lastMigration])
    const empty = 'ocp_empty'
    await pg15.createDatabase(empty)
    await pg15.waitForReplay()

    const alone = await serve({ DATABASE_URL: on(pg15.readerUrl, behind) })
    t.equal(alone.code, 1)
    t.match(alone.stderr, `failed to start: DATABASE_URL names a hot standby on which migration ${lastMigration} is pending: apply pending migrations to its primary`)
    const unmigrated = await serve({ DATABASE_URL: on(pg15.readerUrl, empty), MIGRATE_ON_START: 'true' })
    t.equal(unmigrated.code, 1)
    t.match(unmigrated.stderr, `on which migrations ${names.join(', ')} are pending`, 'no migration table: every migration is pending')
    t.notMatch(unmigrated.stdout, /database migrated/, 'and nothing was tried')

    const split = await serve({ DATABASE_URL: on(pg15.primaryUrl, behind), DATABASE_READ_URL: on(pg15.readerUrl, behind), MIGRATE_ON_START: 'false' })
    t.equal(split.code, 1)
    t.match(split.stderr, `failed to start: on the database at DATABASE_READ_URL, migration ${lastMigration} is pending`)
  })

  await t.test('migrations are never tried on a standby; a replica is waited for', async (t) => {
    await t.rejects(migrateToLatest(on(pg15.standbyUrl, 'ocp_empty')), /^the database is a hot standby \(read-only\): migrations are applied to its primary/)
    t.same((await schemaState(on(pg15.readerUrl, 'ocp_empty'), 200)).pending, names, 'still pending after the wait')

    await pg15.createDatabase('ocp_late')
    const waiting = schemaState(on(pg15.readerUrl, 'ocp_late'), 10_000)
    await migrateToLatest(on(pg15.primaryUrl, 'ocp_late'))
    t.same(await waiting, { pending: [], newer: [] }, 'the replica shows the migrations once it has replayed them')
  })
})
