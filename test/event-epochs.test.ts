import pg from 'pg'
import t, { type Test } from 'tap'
import type { LogState } from '../events/statements.ts'
import { reportable } from '../events/reader.ts'
import { build } from './helpers/app.ts'
import { testBackend, testDatabaseUrl } from './helpers/database.ts'
import { insertEvents, openStream } from './helpers/sse.ts'
import { waitUntil } from './helpers/wait.ts'

// What an operator may do to the event log's sequence and table while the
// service runs, and what streams then see (docs/stream.md, "Failover,
// restarts and rewinds"): an event id is never handed out twice, so no
// stream ever skips, no cursor it was given is ever answered 400, and the
// history's floor never goes down. (A failover and a crash:
// failover.test.ts, event-crash.test.ts.)

interface LogLine { level: number, msg: string, err?: { message: string } }

async function serveLogged (t: Test) {
  const lines: LogLine[] = []
  const app = await build(t, { EVENTS_POLL_INTERVAL_MS: 50, EVENTS_KEEPER_INTERVAL_MS: 100, LOG_LEVEL: 'warn' },
    { logger: { level: 'warn', stream: { write: (line: string) => { lines.push(JSON.parse(line)) } } } })
  await app.listen({ port: 0, host: '127.0.0.1' })
  return { app, lines, url: `http://127.0.0.1:${(app.server.address() as { port: number }).port}` }
}

async function admin (t: Test): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: await testDatabaseUrl() })
  await client.connect()
  t.teardown(() => client.end())
  return client
}

const stateOf = async (client: pg.Client) =>
  (await client.query<{ epoch: number, floor: string, settled: string }>('select epoch, history_floor::text as floor, settled::text from event_log_state')).rows[0]!
const drawnOf = async (client: pg.Client) =>
  Number((await client.query<{ drawn: string }>('select (case when is_called then last_value else last_value - 1 end)::text as drawn from events_event_id_seq')).rows[0]!.drawn)

t.test('two ticks at once, from any sessions, never take each other\'s census for a sequence moved back', { skip: testBackend === 'embedded' && 'the embedded database runs one statement at a time' }, async (t) => {
  const [holder, late] = [await admin(t), await admin(t)]
  await insertEvents({ event_type: 'before' }, { event_type: 'before' })
  await holder.query('select events_keep_order()')
  const before = await stateOf(holder)
  // The holder locks the row; the late tick starts and waits for it.
  await holder.query('begin')
  await holder.query('select 1 from event_log_state for update')
  const lateTick = late.query<{ rewound: string | null, epoch: number }>('select rewound, epoch from events_keep_order()')
  await waitUntil(async () => (await holder.query("select 1 from pg_locks where not granted and locktype = 'transactionid'")).rowCount! > 0, 'the late tick to wait on the row')
  // Meanwhile ids are drawn, and the holder ticks, storing a census of the sequence above what the late tick saw at its start.
  await insertEvents({ event_type: 'meanwhile' }, { event_type: 'meanwhile' }, { event_type: 'meanwhile' })
  await holder.query('select events_keep_order()')
  await holder.query('commit')
  const { rows: [after] } = await lateTick
  t.same(after, { rewound: null, epoch: before.epoch }, 'the late tick reads the sequence after the row: no rewind, no new epoch')
  t.equal((await stateOf(holder)).floor, before.floor, 'and the floor stays')
})

t.test('ALTER SEQUENCE that keeps the value (CACHE 1, the setting writers need) is no rewind: streams go on', async (t) => {
  const { url, lines } = await serveLogged(t)
  const client = await admin(t)
  const before = await insertEvents({ event_type: 'before' }, { event_type: 'before' })
  const stream = await openStream(url, `/api/events/stream?after_event_id=${before[0]! - 1}`)
  t.teardown(stream.close)
  await stream.waitFor((s) => s.events().length >= 2)
  const { epoch } = await stateOf(client)
  await client.query('alter sequence events_event_id_seq cache 1')
  await client.query('alter sequence events_event_id_seq cache 1 increment 1')
  const after = await insertEvents({ event_type: 'after' })
  t.ok(after[0]! > before.at(-1)!, 'the ids go on')
  await stream.waitFor((s) => s.events().length >= 3)
  t.same(stream.events().map((event) => event.event_id), [...before, ...after], 'the stream receives them, once, in order')
  await waitUntil(async () => Number((await stateOf(client)).settled) >= after[0]!, 'a tick past them')
  t.equal((await stateOf(client)).epoch, epoch, 'no new epoch')
  const warnings = lines.filter((line) => line.level >= 40).map((line) => line.err === undefined ? line.msg : `${line.msg}: ${line.err.message}`)
  // Once, on the loaded CI machine, the poller failed a read beside the ALTER and retried: not
  // the keeper's business, which this checks; shown, for its cause is not known yet.
  const pollerRetries = warnings.filter((warning) => warning.startsWith('event poller cannot read events; retrying'))
  if (pollerRetries.length > 0) t.comment(`the poller retried a read: ${pollerRetries.join('; ')}`)
  t.same(warnings.filter((warning) => !pollerRetries.includes(warning)), [], 'and nothing else to warn about')
})

t.test('a sequence moved back goes forward again: ids never repeat, no stream ends, no cursor is refused', async (t) => {
  const { url, lines } = await serveLogged(t)
  const client = await admin(t)
  const before = await insertEvents({ event_type: 'before' }, { event_type: 'before' }, { event_type: 'before' })
  const last = before.at(-1)!
  const stream = await openStream(url, `/api/events/stream?after_event_id=${before[0]! - 1}`)
  t.teardown(stream.close)
  await stream.waitFor((s) => s.events().length >= 3)
  // The tick that publishes them raises the settle mark with them: from then on the check refuses their ids.
  await waitUntil(async () => Number((await stateOf(client)).settled) >= last, 'a tick past them')
  const { epoch } = await stateOf(client)

  // Below the settle mark, onto ids the table no longer holds (ALTER SEQUENCE ... RESTART after a DELETE): the first row
  // that draws there is refused, as a transaction to retry, and moves it forward. (Onto ids it holds, the insert meets
  // their primary key until the keeper's next tick moves it forward: below.)
  await client.query('delete from events where event_id = $1', [before[0]])
  await client.query(`alter sequence events_event_id_seq restart with ${before[0]}`)
  await t.rejects(insertEvents({ event_type: 'after restart' }), { code: '40001', message: /had been moved back .* moved forward again/ },
    'the insert that drew an id the log had settled fails, as a transaction to retry')
  const [restarted] = await insertEvents({ event_type: 'after restart' })
  t.ok(restarted! > last, `retried, it draws above every id handed out (${restarted} > ${last})`)

  // Without an insert, the keeper's next tick moves it forward, and says so.
  await client.query('select setval(\'events_event_id_seq\', 1)')
  await waitUntil(async () => await drawnOf(client) >= restarted!, 'the keeper to move the sequence forward again')
  await waitUntil(() => lines.some((line) => line.level === 50 && /moved back .* moved it forward again/.test(line.msg)), 'the keeper to log an error saying what happened')
  t.pass('the keeper logs an error saying what happened')
  const [next] = await insertEvents({ event_type: 'after setval' })
  t.ok(next! > restarted!, 'and the ids go on above')

  await stream.waitFor((s) => s.events().length >= 5)
  t.same(stream.events().map((event) => event.event_id), [...before, restarted, next], 'the open stream got every event once, in order: it never ended')
  const resumed = await openStream(url, '/api/events/stream', { 'last-event-id': String(last) })
  t.teardown(resumed.close)
  t.equal(resumed.status, 200, 'a stream resumed from a cursor before the rewind is served (never 400)')
  await resumed.waitFor((s) => s.events().length >= 2)
  t.same(resumed.events().map((event) => event.event_id), [restarted, next], 'with what came after it')
  t.equal((await stateOf(client)).epoch, epoch, 'no new epoch')
})

t.test('an id settled over the run of visible ids, deleted and drawn again after a rewind, is refused: streams have passed it', async (t) => {
  const { url } = await serveLogged(t)
  const client = await admin(t)
  // The ticks by hand, each step deterministic: the lease taken from the service's keeper (in one transaction, so no tick renews it between).
  await client.query('begin')
  await client.query('update event_log_state set keeper_until = clock_timestamp() - interval \'1 second\'')
  const { term } = (await client.query<{ term: string }>('select term::text from events_take_lease(\'the test\', 600000)')).rows[0]!
  await client.query('commit')
  t.teardown(() => client.query('select events_release_lease(\'the test\', $1)', [term]))
  const tick = async () => { await client.query('select events_keep_order()') }
  const markOf = async () => Number((await client.query<{ mark: string }>('select last_value::text as mark from events_settle_mark')).rows[0]!.mark)

  const [first] = await insertEvents({ event_type: 'before' })
  await tick()
  // A reader of the sequence left idle holds its lock: the census counts it in flight, below every id drawn since.
  const reader = await admin(t)
  await reader.query('begin')
  await reader.query('select pg_sequence_last_value(\'events_event_id_seq\')')
  await tick()
  const stream = await openStream(url, `/api/events/stream?after_event_id=${first! - 1}`)
  t.teardown(stream.close)
  const settledIds = await insertEvents({ event_type: 'settled' }, { event_type: 'settled' })
  await tick()
  const settled = Number((await stateOf(client)).settled)
  t.equal(settled, settledIds.at(-1), 'the tick settles the run of visible ids above what its census holds back')
  t.ok(await markOf() >= settled, 'and raises the settle mark to the position it publishes')
  await reader.query('rollback')
  await stream.waitFor((s) => s.events().length >= 3)

  // Deleted, and drawn again after a rewind: inserted now, it would be behind every stream.
  await client.query('delete from events where event_id = $1', [settledIds[0]])
  await client.query('select setval(\'events_event_id_seq\', $1)', [settledIds[0]! - 1])
  await t.rejects(insertEvents({ event_type: 'drawn again' }), { code: '40001', message: /had been moved back .* moved forward again/ },
    'the insert that drew a settled id fails, as a transaction to retry')
  const [retried] = await insertEvents({ event_type: 'drawn again' })
  t.ok(retried! > settled, `retried, it draws above every id settled (${retried} > ${settled})`)
  await tick()
  await stream.waitFor((s) => s.events().length >= 4)
  t.same(stream.events().map((event) => event.event_id), [first, ...settledIds, retried], 'the stream gets it, once, in order')
})

t.test('TRUNCATE ... RESTART IDENTITY: the events go, the ids go on, the floor rises, and no replica serves from memory what went', async (t) => {
  const { url } = await serveLogged(t)
  const client = await admin(t)
  const before = await insertEvents({ event_type: 'before' }, { event_type: 'before' }, { event_type: 'before' })
  const last = before.at(-1)!
  const stream = await openStream(url, `/api/events/stream?after_event_id=${before[0]! - 1}`)
  t.teardown(stream.close)
  await stream.waitFor((s) => s.events().length >= 3)
  await waitUntil(async () => Number((await stateOf(client)).settled) >= last, 'a tick past them')
  // A floor retention raised: it must never go down.
  await client.query('update event_log_state set history_floor = 1')
  await waitUntil(async () => (await fetch(`${url}/api/events?after_event_id=0`)).status === 410, 'the floor to reach the service')
  const { epoch } = await stateOf(client)

  await client.query('truncate events restart identity')
  const after = await insertEvents({ event_type: 'after' }, { event_type: 'after' })
  t.ok(after[0]! > last, `RESTART IDENTITY is undone: the ids go on (${after.join(', ')})`)
  const state = await stateOf(client)
  t.equal(Number(state.floor), last, 'the floor rises to the settled position: every event up to it is gone')
  t.equal(state.epoch, epoch + 1, 'a new epoch: every replica drops its memory of recent events')

  await stream.waitFor((s) => s.events().length >= 5)
  t.same(stream.events().map((event) => event.event_id), [...before, ...after], 'a stream at the floor goes on with the new events')
  const expired = await fetch(`${url}/api/events?after_event_id=0`)
  t.equal(expired.status, 410, 'a cursor below the floor: 410, as before the TRUNCATE')
  const older = await openStream(url, '/api/events/stream', { 'last-event-id': String(last - 1) })
  t.equal(older.status, 410, 'on the stream too')
  const page = await (await fetch(`${url}/api/events?after_event_id=${last}`)).json() as { events: Array<{ event_id: number }> }
  t.same(page.events.map((event) => event.event_id), after, 'from the floor: the new events only')
  const durable = await fetch(`${url}/api/streams/events?offset=-1`)
  t.same((await durable.json() as Array<{ event_id: number }>).map((event) => event.event_id), after, 'and a Durable Streams reader from -1 reads what the table holds, not the memory')
})

t.test('a position inside a range of ids skipped after a failover is reported as the start of the range', async (t) => {
  const state = { reissued: [[3, 103]] } as unknown as LogState
  t.equal(reportable(state, 50), 3, 'inside: the range\'s start, at which every client may resume')
  t.equal(reportable(state, 103), 3, 'its last id too')
  t.equal(reportable(state, 3), 3, 'the start itself')
  t.equal(reportable(state, 104), 104, 'past it: as it is')
})
