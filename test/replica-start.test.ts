import { Kysely, PostgresDialect } from 'kysely'
import pg from 'pg'
import t from 'tap'
import type { Database } from '../db/schema.ts'
import { START_WALK_IDS, startingPosition } from '../events/statements.ts'
import { build } from './helpers/app.ts'
import { needsServer, testDatabaseUrl } from './helpers/database.ts'
import { openStream } from './helpers/sse.ts'
import { sleep, waitUntil } from './helpers/wait.ts'

// A replica that starts while an event writer is open (every deploy does):
// it reports, within one poll of answering /ready, the settled position the
// running replicas report, whatever the history's holes, and a stream it
// opens without a cursor gets only what commits after it connected (or
// above that position), never the history below it.

async function client () {
  const connection = new pg.Client({ connectionString: await testDatabaseUrl() })
  await connection.connect()
  t.teardown(() => connection.end())
  return connection
}

async function listen (app: Awaited<ReturnType<typeof build>>) {
  await app.listen({ port: 0, host: '127.0.0.1' })
  return `http://127.0.0.1:${(app.server.address() as { port: number }).port}`
}

const cursorOf = async (url: string) => Number((await fetch(`${url}/api/runs`)).headers.get('x-event-cursor'))

/** The keeper's published position (event_log_state.settled). */
const publishedBy = async (db: pg.Client) => Number((await db.query('select settled from event_log_state')).rows[0].settled)

/** The position an expression (a call of events_settled) answers, on `db`. */
const positionOf = async (db: pg.Client, expression: string) => Number((await db.query(`select ${expression} as p`)).rows[0].p)

/** Commits `count` events in statements of up to 100,000 (one transaction each); the highest id. */
async function commitMany (db: pg.Client, count: number): Promise<number> {
  let last = 0
  for (let done = 0; done < count; done += 100_000) {
    last = Number((await db.query(`with i as (insert into events (event_type) select 'bulk' from generate_series(1, $1::integer) returning event_id)
      select max(event_id) as last from i`, [Math.min(100_000, count - done)])).rows[0].last)
  }
  return last
}

t.test('a replica started while a writer is open reports the running replicas\' position at once, and floods no tail stream', async (t) => {
  const config = { EVENTS_POLL_INTERVAL_MS: 50, EVENTS_KEEPER_INTERVAL_MS: 100 }
  const running = await build(t, config)
  const runningUrl = await listen(running)
  const db = await client()

  // History with holes: a rolled-back batch, then a jump of the sequence as
  // the range jump of retention makes (a million ids that never commit).
  await db.query("insert into events (event_type) select 'history' from generate_series(1, 1000)")
  await db.query('begin')
  await db.query("insert into events (event_type) select 'undone' from generate_series(1, 500)")
  await db.query('rollback')
  await db.query("insert into events (event_type) select 'history' from generate_series(1, 1000)")
  await db.query("select setval('events_event_id_seq', (select last_value from events_event_id_seq) + 1000000)")
  const top = Number((await db.query("insert into events (event_type) select 'history' from generate_series(1, 1000) returning event_id")).rows.at(-1).event_id)
  await waitUntil(async () => await cursorOf(runningUrl) === top, 'the running replica to settle the history')

  const writer = await client()
  await writer.query('begin')
  const held = Number((await writer.query("insert into events (event_type) values ('held_open') returning event_id")).rows[0].event_id)
  const above = await client()
  const committedAbove = Number((await above.query("insert into events (event_type) values ('committed_above') returning event_id")).rows[0].event_id)
  // Open longer than many of the keeper's ticks.
  await new Promise((resolve) => setTimeout(resolve, 500))
  t.equal(await cursorOf(runningUrl), held - 1, 'the running replica waits just below the open writer')

  const starting = await build(t, config)
  const startingUrl = await listen(starting)
  t.equal((await fetch(`${startingUrl}/ready`)).status, 200, 'the new replica is ready')
  t.equal(await cursorOf(startingUrl), held - 1, 'and reports the same position at once: the writer\'s, not the first hole of the history')
  const tail = await openStream(startingUrl, '/api/events/stream')
  t.teardown(tail.close)
  await tail.waitFor((stream) => stream.frames.length >= 1)

  await writer.query('commit')
  await tail.waitFor((stream) => stream.events().length >= 2)
  await new Promise((resolve) => setTimeout(resolve, 300))
  t.same(tail.events().map((event) => event.event_id), [held, committedAbove],
    'the tail stream gets the writer\'s event and the one above it, and nothing of the history')
})

t.test('with no replica running, a starting one still bounds the writers in flight by the census the keeper stored', async (t) => {
  const config = { EVENTS_POLL_INTERVAL_MS: 50, EVENTS_KEEPER_INTERVAL_MS: 100 }
  const first = await build(t, config)
  const firstUrl = await listen(first)
  const db = await client()
  await db.query('begin')
  await db.query("insert into events (event_type) select 'undone' from generate_series(1, 300)")
  await db.query('rollback')
  const top = Number((await db.query("insert into events (event_type) values ('history') returning event_id")).rows[0].event_id)
  await waitUntil(async () => await cursorOf(firstUrl) === top, 'the first replica to settle')

  const writer = await client()
  await writer.query('begin')
  const held = Number((await writer.query("insert into events (event_type) values ('held_open') returning event_id")).rows[0].event_id)
  // Two ticks ended: the second began after the writer opened, so its stored census holds it.
  const ticks = first.events.keeper!.ticks
  await waitUntil(() => first.events.keeper!.ticks >= ticks + 2, 'the keeper to store a census with the writer open')
  await first.close()

  const second = await build(t, config)
  const secondUrl = await listen(second)
  t.equal(await cursorOf(secondUrl), held - 1, 'the position is the open writer\'s, alone as the new replica is')
  await writer.query('commit')
  await waitUntil(async () => await cursorOf(secondUrl) === held, 'the position to move past the writer once it commits')
})

t.test('a session idle in transaction after reading pg_sequences holds back no replica that starts', { skip: needsServer('sessions in transaction side by side') }, async (t) => {
  const config = { EVENTS_POLL_INTERVAL_MS: 50, EVENTS_KEEPER_INTERVAL_MS: 100 }
  const running = await build(t, config)
  const runningUrl = await listen(running)
  const db = await client()
  const before = Number((await db.query("insert into events (event_type) values ('history') returning event_id")).rows[0].event_id)
  await waitUntil(async () => await publishedBy(db) === before, 'the keeper to publish the history')

  // A monitoring query's transaction, left open: reading the view takes the
  // sequence's ROW EXCLUSIVE lock, so the keeper's census counts the session
  // as a writer that may still commit an id, for as long as it stays open.
  const idle = await client()
  const idlePid = Number((await idle.query('select pg_backend_pid() as pid')).rows[0].pid)
  await idle.query('begin')
  await idle.query("select last_value from pg_sequences where sequencename = 'events_event_id_seq'")
  t.teardown(() => idle.query('rollback'))

  // Three times what one tick extends the position over (100,000 ids): it takes several.
  const last = await commitMany(db, 300_000)
  await waitUntil(async () => await cursorOf(runningUrl) === last, 'the running replica to settle the bulk', 60_000)
  await waitUntil(async () => await publishedBy(db) === last, 'the keeper to publish the bulk, the idle session open', 60_000)
  const state = (await db.query('select waiting_pid from event_log_state')).rows[0]
  t.equal(state.waiting_pid, idlePid, 'the keeper publishes the run while its census still counts the idle session as a writer')
  const activity = (await db.query('select state from pg_stat_activity where pid = $1', [idlePid])).rows[0]
  t.equal(activity.state, 'idle in transaction', 'the session is still open')

  const starting = await build(t, { ...config, DB_STATEMENT_TIMEOUT_MS: 1000 })
  const startingUrl = await listen(starting)
  t.equal((await fetch(`${startingUrl}/ready`)).status, 200, 'the new replica is ready')
  const first = await fetch(`${startingUrl}/api/runs`)
  t.equal(first.status, 200, 'its first read answers, within a statement timeout of 1 s')
  t.equal(Number(first.headers.get('x-event-cursor')), last, 'at the position of the running replica')
  t.equal(await cursorOf(runningUrl), last, 'which reports the same')

  const tail = await openStream(startingUrl, '/api/events/stream')
  t.teardown(tail.close)
  t.equal(tail.status, 200, 'it opens a stream at the tail')
  await tail.waitFor((stream) => stream.frames.length >= 1)
  const after = Number((await db.query("insert into events (event_type) values ('after') returning event_id")).rows[0].event_id)
  await tail.waitFor((stream) => stream.events().length >= 1)
  await sleep(300)
  t.same(tail.events().map((event) => event.event_id), [after], 'the tail stream gets the event committed after it opened, and none of the history')
})

t.test('a walk of the settled position stops after the ids it is given; by default it walks the whole visible run', { skip: needsServer('sessions in transaction side by side') }, async (t) => {
  const db = await client()
  const keeper = await build(t, { EVENTS_KEEPER_INTERVAL_MS: 100 })
  const drawn = async () => Number((await db.query('select drawn from events_id_drawn')).rows[0].drawn)
  await waitUntil(async () => await publishedBy(db) === await drawn(), 'the keeper to publish every id drawn')
  await keeper.close()

  // No tick publishes while the row is held.
  const holder = await client()
  await holder.query('begin')
  const position = Number((await holder.query('select settled from event_log_state for update')).rows[0].settled)
  const top = await commitMany(db, 1000)
  t.equal(top, position + 1000, 'a run of 1,000 visible ids just above the published position')
  const walk = (call: string) => positionOf(holder, call)
  t.equal(await walk(`events_settled(${position}, 10)`), position + 10, 'a walk of 10 ids advances 10 ids')
  t.equal(await walk(`events_settled(${position}, 999)`), position + 999, 'and 999, 999')
  t.equal(await walk(`events_settled(${position}, 1000)`), top, 'a walk as long as the run reaches its end')
  t.equal(await walk(`events_settled(${position}, 5000)`), top, 'and a longer one stops there')
  t.equal(await walk(`events_settled(${position})`), top, 'the default walks the whole run')
  t.match((await holder.query("select pg_get_function_arguments('events_settled'::regproc) as args")).rows[0].args,
    /max_ids integer DEFAULT 1000000\b/, 'up to 1,000,000 ids')
  t.equal(await publishedBy(holder), position, 'the published position has not moved')
  await holder.query('rollback')
})

t.test('a replica that starts above a long unpublished run walks it in steps that no statement timeout cuts', { skip: needsServer('sessions in transaction side by side') }, async (t) => {
  const db = await client()
  // The event log's row held: no keeper's tick publishes while the replica starts (its own blocks, and fails).
  const holder = await client()
  await holder.query('begin')
  const position = Number((await holder.query('select settled from event_log_state for update')).rows[0].settled)
  const top = await commitMany(db, Math.round(START_WALK_IDS * 2.5))
  const walk = (call: string) => positionOf(holder, call)
  t.equal(await walk(`events_settled(${position})`), top, 'every id from the published position to the top is visible')
  t.ok(await walk(`events_settled(${position}, ${START_WALK_IDS})`) < top, 'more than one step is needed')

  // The walk itself, statement by statement, each under a timeout of 1 s (a statement cut short would throw).
  const pool = new pg.Pool({ connectionString: await testDatabaseUrl(), max: 1, statement_timeout: 1000 })
  pool.on('error', () => {})
  let statements = 0
  const timed = new Kysely<Database>({ dialect: new PostgresDialect({ pool }), log: (event) => { if (event.level === 'query') statements++ } })
  t.teardown(() => timed.destroy())
  t.equal((await startingPosition(timed)).position, top, 'the walk reaches the top')
  t.ok(statements >= Math.ceil((top - position) / START_WALK_IDS), 'in statements of at most START_WALK_IDS ids each')

  // No poll and no wake-up before the first read: the hub's position is the one it started at.
  const starting = await build(t, { EVENTS_POLL_INTERVAL_MS: 60_000, EVENTS_WAKEUP: 'off', EVENTS_KEEPER_INTERVAL_MS: 100, DB_STATEMENT_TIMEOUT_MS: 1000 })
  const startingUrl = await listen(starting)
  t.equal(await starting.events.ready(), top, 'the replica starts at the top, walked in steps within a statement timeout of 1 s')
  t.equal((await fetch(`${startingUrl}/ready`)).status, 200, 'it is ready')
  const first = await fetch(`${startingUrl}/api/runs`)
  t.equal(first.status, 200, 'its first read answers')
  t.equal(Number(first.headers.get('x-event-cursor')), top, 'and reports the top position')
  t.equal(await publishedBy(holder), position, 'which no keeper published')
  await holder.query('rollback')
})
