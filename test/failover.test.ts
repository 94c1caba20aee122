import pg from 'pg'
import t, { type Test } from 'tap'
import { buildApp } from '../app.ts'
import { loadConfig } from '../config.ts'
import { migrateToLatest } from '../db/migrate.ts'
import { withDatabase } from './helpers/database.ts'
import { openStream } from './helpers/sse.ts'
import { movableAddress } from './helpers/proxy.ts'
import { queryOn, startReplicatedPostgres, standbySkipReason } from './helpers/standby.ts'
import { waitUntil } from './helpers/wait.ts'

// A failover to an asynchronous standby that lost the primary's last
// commits: ids the clients saw may be handed out again by the new primary.
// A client resuming from a cursor the new primary never saw gets 410
// cursor_expired (and refetches), never a stream that skips events; what
// the new primary commits reaches every client once.

async function serve (t: Test, url: string, readUrl?: string) {
  const config = loadConfig({ DATABASE_URL: url, ...(readUrl !== undefined && { DATABASE_READ_URL: readUrl }), LOG_LEVEL: 'silent', MAX_EVENT_LOOP_DELAY_MS: '0' })
  const app = await buildApp({ ...config, EVENTS_POLL_INTERVAL_MS: 50, EVENTS_KEEPER_INTERVAL_MS: 100 })
  t.teardown(() => app.close())
  await app.listen({ port: 0, host: '127.0.0.1' })
  return { app, url: `http://127.0.0.1:${(app.server.address() as { port: number }).port}` }
}

async function insert (url: string, count: number, type: string): Promise<number[]> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    const { rows } = await client.query("insert into events (event_type, run_id) select $1, 'run-f' from generate_series(1, $2::int) returning event_id", [type, count])
    return rows.map((row) => Number(row.event_id))
  } finally {
    await client.end()
  }
}

/**
 * A primary and its streaming standby with a migrated database `name` (and
 * the run the tests write to), and a replica that lives through the
 * failover: its reads and its keeper each go to an address that a failover
 * moves (moveReads, moveKeeper: to the standby).
 */
async function beforeFailover (t: Test, name: string) {
  const pg15 = await startReplicatedPostgres(t)
  await pg15.createDatabase(name)
  const [primaryPort, standbyPort] = [pg15.primaryUrl, pg15.standbyUrl].map((url) => Number(new URL(url).port))
  const primary = withDatabase(pg15.primaryUrl, name)
  const standby = withDatabase(pg15.standbyUrl, name)
  await migrateToLatest(primary)
  await queryOn(primary, "insert into runs (run_id, goal, summary, status) values ('run-f', 'g', 's', 'running')")
  const readAddress = await movableAddress(t, primaryPort!)
  const keeperAddress = await movableAddress(t, primaryPort!)
  const at = (address: { port: number }) => primary.replace(`:${primaryPort}/`, `:${address.port}/`)
  const replica = await serve(t, at(keeperAddress), at(readAddress))
  return { pg15, primary, standby, replica, moveReads: () => readAddress.moveTo(standbyPort!), moveKeeper: () => keeperAddress.moveTo(standbyPort!) }
}

t.test('after a failover that lost commits, a cursor the new primary never saw answers 410, and nothing is skipped', { skip: standbySkipReason() }, async (t) => {
  const { pg15, primary, standby, replica, moveReads, moveKeeper } = await beforeFailover(t, 'ocp_failover')

  const kept = await insert(primary, 3, 'replicated')
  const keptCursor = kept.at(-1)!
  await waitUntil(async () => Number((await fetch(`${replica.url}/api/runs`)).headers.get('x-event-cursor')) >= keptCursor, 'the primary to settle them')
  // The standby has them, and the keeper's position past them.
  await waitUntil(async () => Number((await queryOn(standby, 'select settled from event_log_state'))[0]!.settled) >= keptCursor, 'the standby to replay the keeper\'s position')

  // The standby is cut off; what the primary commits now is lost with it.
  await pg15.detachStandby()
  const watcher = await openStream(replica.url, `/api/events/stream?after_event_id=${keptCursor}`)
  t.teardown(watcher.close)
  const lost = await insert(primary, 3, 'lost')
  await watcher.waitFor((s) => s.events().length >= 3)
  t.same(watcher.events().map((event) => event.event_id), lost, 'a client saw the events the standby never got')
  const lostCursor = lost.at(-1)!
  const lostOffset = (await fetch(`${replica.url}/api/streams/runs/run-f?offset=-1`)).headers.get('stream-next-offset')
  t.equal(parseInt(lostOffset!, 36), lostCursor, 'and a Durable Streams reader was handed the offset after them')

  pg15.crashPrimary()
  await pg15.promoteStandby()
  // The reads move to the new primary first; the keeper's address still names the old one, so no keeper runs yet.
  moveReads()
  await waitUntil(async () => (await fetch(`${replica.url}/api/events?after_event_id=${lostCursor}`)).status === 503, 'the lost cursor to be refused as transient')
  const pending = await fetch(`${replica.url}/api/events?after_event_id=${lostCursor}`)
  t.match(await pending.json(), { error: { code: 'unavailable', message: /just promoted/ } }, 'until the keeper records the new timeline, a cursor past what is settled: retry')
  t.same(watcher.events().map((event) => event.event_id), lost, 'and the replica that read the old primary delivers nothing meanwhile')

  moveKeeper()
  await watcher.ended
  t.pass('once the keeper records the new timeline, the stream past the epoch\'s base ends (its client reconnects)')

  await waitUntil(async () => (await fetch(`${replica.url}/api/events?after_event_id=${lostCursor}`)).status === 410, 'the lost cursor to answer 410')
  const page = await fetch(`${replica.url}/api/events?after_event_id=${lostCursor}`)
  t.match(await page.json(), { error: { code: 'cursor_expired', message: /lost in a failover/ } }, 'GET /api/events: 410 cursor_expired, saying why')
  const resumed = await openStream(replica.url, '/api/events/stream?run_id=run-f', { 'last-event-id': String(lostCursor) })
  t.equal(resumed.status, 410, 'the stream resumed from it: 410 before any byte')
  const durable = await fetch(`${replica.url}/api/streams/runs/run-f?offset=${lostOffset}`)
  t.match({ status: durable.status, body: await durable.json() }, { status: 410, body: { error: { code: 'cursor_expired' } } },
    'a Durable Streams read from the offset the old primary handed out: 410')

  // A client whose cursor the new primary had settled resumes; a client that refetched subscribes from the read's
  // cursor; a replica started on the new primary serves the same.
  const fresh = await serve(t, standby)
  const survivor = await openStream(replica.url, `/api/events/stream?run_id=run-f&after_event_id=${keptCursor}`)
  t.teardown(survivor.close)
  const read = await fetch(`${replica.url}/api/runs/run-f`)
  const cursor = Number(read.headers.get('x-event-cursor'))
  t.ok(cursor <= keptCursor || cursor > lostCursor, `the read's X-Event-Cursor (${cursor}) is not inside the reissued range`)
  const refetched = await openStream(replica.url, `/api/events/stream?run_id=run-f&after_event_id=${cursor}`)
  t.teardown(refetched.close)
  const elsewhere = await openStream(fresh.url, `/api/events/stream?run_id=run-f&after_event_id=${keptCursor}`)
  t.teardown(elsewhere.close)
  const after = await insert(standby, 3, 'after_failover')
  t.ok(after[0]! > lostCursor, `the new primary's ids (${after[0]}...) are past every id the old one may have handed out`)
  for (const [name, stream] of [['from a cursor the new primary had settled', survivor], ['from the refetched read\'s cursor', refetched], ['on a replica started after the failover', elsewhere]] as const) {
    await stream.waitFor((s) => s.events().length >= 3)
    await new Promise((resolve) => setTimeout(resolve, 200))
    t.same(stream.events().map((event) => event.event_id), after, `${name}: the new primary's events, once each, in order`)
  }
})

/** Reads a Durable Streams log from -1 to up-to-date, page after page: every event, and how many reads it took. */
async function readDurable (base: string, path: string): Promise<{ ids: number[], reads: number, statuses: number[] }> {
  const ids: number[] = []
  const statuses: number[] = []
  let offset = '-1'
  for (let reads = 1; reads <= 50; reads++) {
    const response = await fetch(`${base}${path}?offset=${offset}`)
    statuses.push(response.status)
    if (response.status !== 200) return { ids, reads, statuses }
    ids.push(...(await response.json() as Array<{ event_id: number }>).map((event) => event.event_id))
    offset = response.headers.get('stream-next-offset')!
    if (response.headers.get('stream-up-to-date') === 'true') return { ids, reads, statuses }
  }
  throw new Error(`not up to date after 50 reads: ${ids.length} events`)
}

t.test('a promotion that lost nothing ends no stream and refuses no cursor', { skip: standbySkipReason() }, async (t) => {
  const { pg15, primary, standby, replica, moveReads, moveKeeper } = await beforeFailover(t, 'ocp_lossless')

  const before = await insert(primary, 5, 'before')
  const stream = await openStream(replica.url, '/api/events/stream?run_id=run-f&after_event_id=0')
  t.teardown(stream.close)
  await stream.waitFor((s) => s.events().length >= 5)
  // Everything the primary wrote reaches the standby before it goes.
  await pg15.waitForReplay()
  pg15.crashPrimary()
  await pg15.promoteStandby()
  moveReads()
  moveKeeper()

  const after = await insert(standby, 3, 'after')
  t.ok(after[0]! > before.at(-1)!, 'the new primary\'s ids are above every one the old primary handed out')
  await stream.waitFor((s) => s.events().length >= 8)
  await new Promise((resolve) => setTimeout(resolve, 200))
  let ended = false
  void stream.ended.then(() => { ended = true })
  t.notOk(ended, 'the open stream never ended')
  t.same(stream.events().map((event) => event.event_id), [...before, ...after], 'and got every event, once, in order')
  const resumed = await openStream(replica.url, '/api/events/stream?run_id=run-f', { 'last-event-id': String(before.at(-1)) })
  t.teardown(resumed.close)
  t.equal(resumed.status, 200, 'a cursor of the old primary is served')
  await resumed.waitFor((s) => s.events().length >= 3)
  t.same(resumed.events().map((event) => event.event_id), after)
  const durable = await readDurable(replica.url, '/api/streams/runs/run-f')
  t.same(durable.ids, [...before, ...after], 'a Durable Streams reader from -1 reads everything')
  t.equal((await fetch(`${replica.url}/api/events?after_event_id=${before.at(-1)}`)).status, 200, 'no cursor is refused')
})

t.test('after a failover, every event the new primary holds is delivered once: the survivors above the position it had published, and what was written on it before the service reached it', { skip: standbySkipReason() }, async (t) => {
  const { pg15, primary, standby, replica, moveReads, moveKeeper } = await beforeFailover(t, 'ocp_survivors')

  const settledFirst = await insert(primary, 3, 'settled')
  await waitUntil(async () => Number((await fetch(`${replica.url}/api/runs`)).headers.get('x-event-cursor')) >= settledFirst.at(-1)!, 'the primary to settle them')
  // The keeper is held off (its row locked): what commits now is delivered, and replicated, above the position it published.
  const holder = new pg.Client({ connectionString: primary })
  holder.on('error', () => {})
  await holder.connect()
  await holder.query('begin')
  await holder.query('select 1 from event_log_state for update')
  const survivors = await insert(primary, 3, 'survivor')
  await pg15.waitForReplay()
  t.ok(Number((await queryOn(standby, 'select settled from event_log_state'))[0]!.settled) < survivors[0]!, 'the standby has the survivors, above the position it has published')
  await pg15.detachStandby()
  const watcher = await openStream(replica.url, `/api/events/stream?run_id=run-f&after_event_id=${settledFirst.at(-1)}`)
  t.teardown(watcher.close)
  const lost = await insert(primary, 3, 'lost')
  await watcher.waitFor((s) => s.events().length >= 6)
  const lostOffset = (await fetch(`${replica.url}/api/streams/runs/run-f?offset=-1`)).headers.get('stream-next-offset')!

  pg15.crashPrimary()
  await pg15.promoteStandby()
  // The orchestrator writes on the new primary before the service reaches it: more than a page of events.
  const early = await insert(standby, 1200, 'early')
  t.ok(early[0]! > lost.at(-1)!, `ids written before the service reached the new primary (${early[0]}...) are above every id the old one handed out (${lost.at(-1)})`)
  moveReads()
  moveKeeper()
  await watcher.ended
  t.pass('the stream that delivered lost events ends')
  const late = await insert(standby, 3, 'late')

  const table = [...settledFirst, ...survivors, ...early, ...late]
  for (const [name, path, headers, expected] of [
    ['a stream resumed from a survivor', '/api/events/stream?run_id=run-f', { 'last-event-id': String(survivors.at(-1)) }, [...early, ...late]],
    ['a stream resumed from below the survivors', '/api/events/stream?run_id=run-f', { 'last-event-id': String(settledFirst.at(-1)) }, [...survivors, ...early, ...late]],
    ['a fresh stream', '/api/events/stream?run_id=run-f&after_event_id=0', {}, table]
  ] as const) {
    const stream = await openStream(replica.url, path, headers)
    t.teardown(stream.close)
    t.equal(stream.status, 200, `${name}: served`)
    await stream.waitFor((s) => s.events().length >= expected.length)
    await new Promise((resolve) => setTimeout(resolve, 200))
    t.same(stream.events().map((event) => event.event_id), expected, `${name}: every event, once each, in order`)
  }
  const lostStream = await openStream(replica.url, '/api/events/stream?run_id=run-f', { 'last-event-id': String(lost.at(-1)) })
  t.equal(lostStream.status, 410, 'a cursor of a lost event: 410')
  const durable = await readDurable(replica.url, '/api/streams/runs/run-f')
  t.same({ ids: durable.ids, statuses: [...new Set(durable.statuses)] }, { ids: table, statuses: [200] }, `a Durable Streams reader from -1 reads every event, in ${durable.reads} pages, and is never told to start again`)
  const stale = await fetch(`${replica.url}/api/streams/runs/run-f?offset=${lostOffset}`)
  t.match({ status: stale.status, body: await stale.json() }, { status: 410, body: { error: { code: 'cursor_expired', message: /failover or a crash.*offset=-1/ } } },
    'the offset the old primary handed out: 410, naming the failover, and -1 is a way back')
})
