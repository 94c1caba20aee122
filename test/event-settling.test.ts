import pg from 'pg'
import { pino } from 'pino'
import t from 'tap'
import { EventLogKeeper } from '../events/keeper/keeper.ts'
import { build } from './helpers/app.ts'
import { testDatabaseUrl } from './helpers/database.ts'
import { insertEvents, openStream } from './helpers/sse.ts'
import { PROMPTLY_MS, sleep, waitUntil } from './helpers/wait.ts'

// What the reader waits for, and what it does not (db/sql/keeper.sql, docs/stream.md
// "How the event order is settled"): an id still in flight holds back the
// stream, reads' X-Event-Cursor and event pages past it, and nothing else.

async function client () {
  const connection = new pg.Client({ connectionString: await testDatabaseUrl() })
  await connection.connect()
  return connection
}

async function listen (app: Awaited<ReturnType<typeof build>>) {
  await app.listen({ port: 0, host: '127.0.0.1' })
  return `http://127.0.0.1:${(app.server.address() as { port: number }).port}`
}

/** Opens a transaction that draws an event id and leaves it uncommitted. */
async function openWriter (eventType = 'in_flight') {
  const connection = await client()
  await connection.query('begin')
  const { rows: [row] } = await connection.query('insert into events (event_type) values ($1) returning event_id', [eventType])
  return { connection, id: Number(row.event_id) }
}

t.test('an id in flight holds back the stream, X-Event-Cursor and event pages, until it commits or rolls back', async (t) => {
  const app = await build(t, { EVENTS_POLL_INTERVAL_MS: 20 })
  const url = await listen(app)
  const [base] = await insertEvents({ event_type: 'base' })
  const stream = await openStream(url, `/api/events/stream?after_event_id=${base}`)
  t.teardown(stream.close)

  const held = await openWriter()
  const [after] = await insertEvents({ event_type: 'committed_above' })
  t.ok(after! > held.id, 'the later writer drew the higher id and committed first')
  await sleep(300)
  t.same(stream.events(), [], 'the stream waits: the event above the open one is not sent')

  const runs = await app.inject({ url: '/api/runs' })
  t.ok(Number(runs.headers['x-event-cursor']) < held.id, 'X-Event-Cursor stops below the id in flight')
  const page = await app.inject({ url: `/api/events?after_event_id=${base}` })
  t.same(page.json().events, [], 'the event page lists nothing past it either')
  t.ok(Number(page.headers['x-event-cursor']) < held.id, 'and its cursor stays below it')

  await held.connection.query('commit')
  await held.connection.end()
  await stream.waitFor((s) => s.events().length >= 2)
  t.same(stream.events().map((event) => event.event_id), [held.id, after], 'both, once, ascending, as soon as it commits')
  const settledRead = await app.inject({ url: '/api/runs' })
  t.ok(Number(settledRead.headers['x-event-cursor']) >= after!, 'X-Event-Cursor moves past both')

  // A rolled-back id is settled the moment its transaction ends.
  const rolledBack = await openWriter('rolled_back')
  const [later] = await insertEvents({ event_type: 'after_rollback' })
  await rolledBack.connection.query('rollback')
  await rolledBack.connection.end()
  await stream.waitFor((s) => s.events().length >= 3)
  t.same(stream.events().map((event) => event.event_id), [held.id, after, later], 'the hole left by the rollback holds nothing back')
})

t.test('a fetch-then-subscribe from X-Event-Cursor misses nothing while an id is in flight', async (t) => {
  const app = await build(t, { EVENTS_POLL_INTERVAL_MS: 20 })
  const url = await listen(app)
  await insertEvents({ event_type: 'before' })
  const held = await openWriter('late_commit')
  await insertEvents({ event_type: 'early_commit' })
  const read = await app.inject({ url: '/api/runs' })
  const cursor = read.headers['x-event-cursor'] as string
  await held.connection.query('commit')
  await held.connection.end()
  const stream = await openStream(url, `/api/events/stream?after_event_id=${cursor}`)
  t.teardown(stream.close)
  await stream.waitFor((s) => s.events().some((event) => event.event_type === 'late_commit') && s.events().some((event) => event.event_type === 'early_commit'))
  const ids = stream.events().map((event) => event.event_id)
  t.same(ids, [...ids].sort((a, b) => a - b), 'ascending')
  t.equal(new Set(ids).size, ids.length, 'each once')
})

t.test('a transaction that wrote no event never holds the stream back', async (t) => {
  const app = await build(t, { EVENTS_POLL_INTERVAL_MS: 20 })
  const url = await listen(app)
  const [base] = await insertEvents({ event_type: 'base' })
  const stream = await openStream(url, `/api/events/stream?after_event_id=${base}`)
  t.teardown(stream.close)
  // Holds a transaction id, as an orchestrator's long transaction would, but draws no event id.
  const bystander = await client()
  await bystander.query('begin')
  await bystander.query("insert into runs (run_id, goal, summary, status) values ('bystander', 'g', 's', 'running')")
  const ids = await insertEvents({ event_type: 'one' }, { event_type: 'two' })
  await stream.waitFor((s) => s.events().length >= 2) // not forever: the bystander never commits
  t.same(stream.events().map((event) => event.event_id), ids, 'delivered while the other transaction stays open')
  const page = await app.inject({ url: `/api/events?after_event_id=${base}` })
  t.same(page.json().events.map((event: { event_id: number }) => event.event_id), ids)
  await bystander.query('rollback')
  await bystander.end()
})

t.test('a writer left open delays no other writer, and delivery waits only past its id', async (t) => {
  const app = await build(t, { EVENTS_POLL_INTERVAL_MS: 20 })
  const url = await listen(app)
  const [below] = await insertEvents({ event_type: 'below' })
  const stream = await openStream(url, `/api/events/stream?after_event_id=${below! - 1}`)
  t.teardown(stream.close)
  const held = await openWriter()
  const started = Date.now()
  const others = await Promise.all(Array.from({ length: 8 }, (_, i) => insertEvents({ event_type: `other_${i}` })))
  t.ok(Date.now() - started < PROMPTLY_MS, 'eight other writers committed while it stays open')
  await stream.waitFor((s) => s.events().length >= 1)
  await sleep(200)
  t.same(stream.events().map((event) => event.event_id), [below], 'the event below it is delivered; those above wait')
  await held.connection.query('commit')
  await held.connection.end()
  await stream.waitFor((s) => s.events().length >= 10)
  t.same(stream.events().map((event) => event.event_id), [below, held.id, ...others.flat().sort((a, b) => a - b)])
})

t.test('the published position settles the order as any reader reads it: never past a writer in flight', async (t) => {
  const app = await build(t, { EVENTS_POLL_INTERVAL_MS: 20, EVENTS_KEEPER_INTERVAL_MS: 50 })
  const admin = await client()
  t.teardown(() => admin.end())
  const published = async () => Number((await admin.query('select settled from event_log_state')).rows[0].settled)
  const inStatement = async () => Number((await admin.query('select events_settled(0) as p')).rows[0].p)
  const waitTicks = async (n: number) => {
    const target = app.events.keeper!.ticks + n
    while (app.events.keeper!.ticks < target) await sleep(20)
  }
  await insertEvents({ event_type: 'base' })
  const held = await openWriter()
  const [above] = await insertEvents({ event_type: 'above' })
  await waitTicks(3)
  t.ok(await published() < held.id, 'the keeper publishes nothing at or above the open writer\'s id')
  t.ok(await inStatement() < held.id, 'nor does a statement settle past it, with the committed id above it visible')
  await held.connection.query('commit')
  await held.connection.end()
  t.ok(await inStatement() >= above!, 'once it has ended, a statement settles both at once (no hole: contiguity)')
  await waitTicks(2)
  t.ok(await published() >= above!, 'and the next ticks publish it')
})

t.test('delivery that waits on a writer is a metric, and a log line after five seconds', async (t) => {
  const lines: Array<{ level: number, time: number, msg: string, waitingPid?: number }> = []
  const stream = { write: (line: string) => { lines.push(JSON.parse(line)) } }
  const app = await build(t, { EVENTS_POLL_INTERVAL_MS: 50 }, { logger: { level: 'info', stream } })
  const held = await openWriter()
  // Delivery can start waiting no earlier than the commit above the open id.
  const waitCouldBegin = Date.now()
  await insertEvents({ event_type: 'above' })
  const pid = Number((await held.connection.query('select pg_backend_pid() as pid')).rows[0].pid)
  await waitUntil(() => lines.some((line) => line.msg.startsWith('event delivery waits past id')), 'the wait to be logged')
  const warning = lines.find((line) => line.msg.startsWith('event delivery waits past id'))
  t.ok(warning!.time - waitCouldBegin >= 5000, `a warning says what delivery waits for, not before five seconds (after ${warning!.time - waitCouldBegin} ms)`)
  t.equal(warning?.waitingPid, pid, 'and names the backend of the open writer')
  const metrics = (await app.inject({ url: '/metrics' })).body
  const wait = Number(/^event_settle_wait_seconds ([\d.]+)$/m.exec(metrics)?.[1])
  t.ok(wait >= 5, `event_settle_wait_seconds is ${wait}`)
  await held.connection.query('commit')
  await held.connection.end()
  await waitUntil(() => lines.some((line) => line.msg.startsWith('event delivery resumed')), 'the line saying delivery resumed')
  t.pass('and one more line when it resumes')
  await waitUntil(async () => /^event_settle_wait_seconds 0$/m.test((await app.inject({ url: '/metrics' })).body), 'the metric to be back to 0')
  t.pass('the metric is back to 0')
})

t.test('with no replica keeping the log, the wait\'s log line says how old the settled position is', async (t) => {
  const lines: Array<{ level: number, msg: string, settledAgeSeconds?: number }> = []
  const stream = { write: (line: string) => { lines.push(JSON.parse(line)) } }
  const app = await build(t, { EVENTS_POLL_INTERVAL_MS: 50 }, { logger: { level: 'info', stream } })
  await app.events.keeper!.stop()
  const hole = await openWriter('rolled_back')
  await insertEvents({ event_type: 'above' })
  await hole.connection.query('rollback')
  await hole.connection.end()
  await waitUntil(() => lines.some((line) => line.msg.startsWith('event delivery waits past id')), 'the wait to be logged', 60_000)
  t.match(lines.find((line) => line.msg.startsWith('event delivery waits past id')),
    { msg: /the settled position was last published \d+ s ago; it moves only while a replica keeps the event log on the primary/, settledAgeSeconds: Number })
})

t.test('the keeper that publishes the settled position survives a failing database: logged once, recovered by itself', async (t) => {
  const lines: Array<{ msg: string }> = []
  const log = pino({ level: 'info' }, { write: (line: string) => { lines.push(JSON.parse(line)) } })
  const admin = await client()
  t.teardown(() => admin.end())
  // The log's state away: every tick fails until it is back.
  await admin.query('alter table event_log_state rename to event_log_state_away')
  const keeper = new EventLogKeeper({ url: await testDatabaseUrl(), keeperIntervalMs: 20, retentionMs: undefined, log })
  t.teardown(() => keeper.stop())
  keeper.start()
  const failed = () => lines.filter((line) => line.msg === 'event log keeper failed; retrying').length
  while (failed() === 0) await sleep(20)
  await admin.query('alter table event_log_state_away rename to event_log_state')
  while (!lines.some((line) => line.msg === 'event log keeper recovered')) await sleep(50)
  t.equal(failed(), 1, 'the failure is logged once, however many ticks failed')
  const ticks = keeper.ticks
  while (keeper.ticks < ticks + 2) await sleep(20)
  t.pass('it ticks again')
})

t.test('a keeper whose lease another replica took publishes nothing, says so, follows, and takes it back once free', async (t) => {
  const lines: Array<{ msg: string }> = []
  const log = pino({ level: 'info' }, { write: (line: string) => { lines.push(JSON.parse(line)) } })
  const admin = await client()
  t.teardown(() => admin.end())
  const keeper = new EventLogKeeper({ url: await testDatabaseUrl(), keeperIntervalMs: 50, retentionMs: undefined, log })
  t.teardown(() => keeper.stop())
  keeper.start()
  await waitUntil(() => keeper.leading, 'it to take the lease')
  // After a partition pass, so that it holds the partitions' connection too, which it must let go.
  await waitUntil(() => keeper.passes > 0, 'its first partition pass')
  // Another replica takes the lease, as it would once this one's lapsed (in one transaction, so no tick renews it between).
  await admin.query('begin')
  await admin.query("update event_log_state set keeper_until = clock_timestamp() - interval '1 second'")
  const term = Number((await admin.query("select term from events_take_lease('another replica', 60000)")).rows[0].term)
  await admin.query('commit')
  await waitUntil(() => lines.some((line) => line.msg.startsWith('another replica keeps the event log now')), 'it to find the lease gone')
  t.notOk(keeper.leading, 'it follows')
  const { rows: [{ event_id: id }] } = await admin.query("insert into events (event_type) values ('unkept') returning event_id")
  const ticks = keeper.ticks
  await sleep(300)
  t.equal(keeper.ticks, ticks, 'and ticks no more')
  t.ok(Number((await admin.query('select settled from event_log_state')).rows[0].settled) < Number(id), 'nothing is published under a lease it no longer holds')
  await admin.query("select events_release_lease('another replica', $1)", [term])
  await waitUntil(() => keeper.leading, 'it to take the lease back once it is free')
  await waitUntil(async () => Number((await admin.query('select settled from event_log_state')).rows[0].settled) >= Number(id), 'its ticks to publish again')
})

t.test('stopping the keeper while a tick waits on the database logs no failure', async (t) => {
  const lines: Array<{ msg: string }> = []
  const log = pino({ level: 'info' }, { write: (line: string) => { lines.push(JSON.parse(line)) } })
  const admin = await client()
  const locker = await client()
  t.teardown(async () => { await locker.end(); await admin.end() })
  // The log's state locked: the tick waits until stop() ends its connection.
  await locker.query('begin')
  await locker.query('lock table event_log_state in access exclusive mode')
  const keeper = new EventLogKeeper({ url: await testDatabaseUrl(), keeperIntervalMs: 20, retentionMs: undefined, log })
  keeper.start()
  await waitUntil(async () => (await admin.query("select 1 from pg_stat_activity where application_name = 'ocp-api-keeper' and wait_event_type = 'Lock'")).rowCount === 1, 'the tick waiting on the lock')
  await keeper.stop()
  await locker.query('rollback')
  await sleep(100)
  t.same(lines.filter((line) => line.msg === 'event log keeper failed; retrying'), [], 'no failure logged')
})

t.test('stopping the keeper while it connects leaves no connection behind, nor the keeper\'s lock', async (t) => {
  const admin = await client()
  t.teardown(() => admin.end())
  const keeper = new EventLogKeeper({ url: await testDatabaseUrl(), keeperIntervalMs: 20, retentionMs: undefined, log: pino({ level: 'silent' }) })
  keeper.start()
  await keeper.stop()
  // The server drops the backend a moment after the client ends it.
  await waitUntil(async () => (await admin.query("select 1 from pg_stat_activity where application_name = 'ocp-api-keeper' and datname = current_database()")).rowCount === 0, 'its connection to be closed')
  t.equal(keeper.ticks, 0, 'and it never ticked')
})

t.test('a snapshot fact: an older transaction commits a higher id while a newer one holds a lower id open', async (t) => {
  const app = await build(t, { EVENTS_POLL_INTERVAL_MS: 20, EVENTS_KEEPER_INTERVAL_MS: 50 })
  const admin = await client()
  t.teardown(() => admin.end())
  // A takes its transaction id first; B, newer, draws the lower event id and stays open; A inserts the higher one and commits.
  const a = await client()
  await a.query('begin')
  await a.query("insert into runs (run_id, goal, summary, status) values ('fact-1', 'g', 's', 'running')")
  const b = await openWriter('newer_holds_lower')
  const { rows: [higher] } = await a.query("insert into events (event_type) values ('older_commits_higher') returning event_id")
  await a.query('commit')
  await a.end()
  t.ok(Number(higher.event_id) > b.id)
  const ticks = app.events.keeper!.ticks
  while (app.events.keeper!.ticks < ticks + 3) await sleep(20)
  const published = Number((await admin.query('select settled from event_log_state')).rows[0].settled)
  t.ok(published < b.id, `the keeper publishes nothing at or above the open id (settled ${published}, open ${b.id})`)
  t.ok(Number((await admin.query('select events_settled(0) as p')).rows[0].p) < b.id, 'nor does a statement, though its snapshot lists no running transaction below the committed one')
  const page = await app.inject({ url: `/api/events?after_event_id=${b.id - 1}` })
  t.same(page.json().events, [], 'the higher id is not listed while the lower one may commit')
  await b.connection.query('commit')
  await b.connection.end()
  // Listed once a keeper tick or a poll settles past it, and a read sees that.
  await waitUntil(async () => (await app.inject({ url: `/api/events?after_event_id=${b.id - 1}` })).json().events.length === 2, 'both to be listed')
  const after = await app.inject({ url: `/api/events?after_event_id=${b.id - 1}` })
  t.same(after.json().events.map((event: { event_id: number }) => event.event_id), [b.id, Number(higher.event_id)], 'both, ascending, once it commits')
})
