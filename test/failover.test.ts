import pg from 'pg'
import t, { type Test } from 'tap'
import { buildApp } from '../app.js'
import { loadConfig } from '../config.js'
import { migrateToLatest } from '../db/migrate.js'
import { withDatabase } from './helpers/database.js'
import { openStream } from './helpers/sse.js'
import { movableAddress } from './helpers/proxy.js'
import { queryOn, startReplicatedPostgres, standbySkipReason } from './helpers/standby.js'
import { waitUntil } from './helpers/wait.js'

// A failover to an asynchronous standby that lost the primary's last
// commits: ids the clients saw may be handed out again by the new primary.
// A client resuming from a cursor the new primary never saw gets 410
// cursor_expired (and refetches), never a stream that skips events; what
// the new primary commits reaches every client once.

async function serve (t: Test, url: string, readUrl?: string) {
  const config = loadConfig({ DATABASE_URL: url, ...(readUrl !== undefined && { DATABASE_READ_URL: readUrl }), LOG_LEVEL: 'silent', MAX_EVENT_LOOP_DELAY_MS: '0' })
  const app = await buildApp({ ...config, EVENTS_POLL_INTERVAL_MS: 50, EVENTS_CLOCK_INTERVAL_MS: 100 })
  t.teardown(() => app.close())
  await app.listen({ port: 0, host: '127.0.0.1' })
  return { app, url: `http://127.0.0.1:${(app.server.address() as { port: number }).port}` }
}

async function insert (url: string, count: number, type: string): Promise<number[]> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    const { rows } = await client.query(`insert into events (event_type, run_id) select $1, 'run-f' from generate_series(1, $2::int) returning event_id`, [type, count])
    return rows.map((row) => Number(row.event_id))
  } finally {
    await client.end()
  }
}

t.test('after a failover that lost commits, a cursor the new primary never saw answers 410, and nothing is skipped', { skip: standbySkipReason() }, async (t) => {
  const pg15 = await startReplicatedPostgres(t)
  await pg15.createDatabase('ocp_failover')
  const [primaryPort, standbyPort] = [pg15.primaryUrl, pg15.standbyUrl].map((url) => Number(new URL(url).port))
  const primary = withDatabase(pg15.primaryUrl, 'ocp_failover')
  const standby = withDatabase(pg15.standbyUrl, 'ocp_failover')
  await migrateToLatest(primary)
  await queryOn(primary, `insert into runs (run_id, goal, summary, status) values ('run-f', 'g', 's', 'running')`)

  // A replica that lives through the failover: its reads and its upkeep each go to an address that a failover moves.
  const readAddress = await movableAddress(t, primaryPort!)
  const upkeepAddress = await movableAddress(t, primaryPort!)
  const at = (address: { port: number }) => primary.replace(`:${primaryPort}/`, `:${address.port}/`)
  const replica = await serve(t, at(upkeepAddress), at(readAddress))

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
  await watcher.waitFor((s) => s.events().length >= 3, 15_000)
  t.same(watcher.events().map((event) => event.event_id), lost, 'a client saw the events the standby never got')
  const lostCursor = lost.at(-1)!
  const lostOffset = (await fetch(`${replica.url}/api/streams/runs/run-f?offset=-1`)).headers.get('stream-next-offset')
  t.equal(parseInt(lostOffset!, 36), lostCursor, 'and a Durable Streams reader was handed the offset after them')

  pg15.crashPrimary()
  await pg15.promoteStandby()
  // The reads move to the new primary first; the upkeep's address still names the old one, so no keeper runs yet.
  readAddress.moveTo(standbyPort!)
  await waitUntil(async () => (await fetch(`${replica.url}/api/events?after_event_id=${lostCursor}`)).status === 503, 'the lost cursor to be refused as transient')
  const pending = await fetch(`${replica.url}/api/events?after_event_id=${lostCursor}`)
  t.match(await pending.json(), { error: { code: 'unavailable', message: /just promoted/ } }, 'until the keeper records the new timeline, a cursor past what is settled: retry')
  t.same(watcher.events().map((event) => event.event_id), lost, 'and the replica that read the old primary delivers nothing meanwhile')

  upkeepAddress.moveTo(standbyPort!)
  await watcher.ended
  t.pass('once the keeper records the new timeline, the stream past the epoch\'s base ends (its client reconnects)')

  await waitUntil(async () => (await fetch(`${replica.url}/api/events?after_event_id=${lostCursor}`)).status === 410, 'the lost cursor to answer 410')
  const page = await fetch(`${replica.url}/api/events?after_event_id=${lostCursor}`)
  t.match(await page.json(), { error: { code: 'cursor_expired', message: /lost in a failover/ } }, 'GET /api/events: 410 cursor_expired, saying why')
  const resumed = await openStream(replica.url, `/api/events/stream?run_id=run-f`, { 'last-event-id': String(lostCursor) })
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
    await stream.waitFor((s) => s.events().length >= 3, 15_000)
    await new Promise((resolve) => setTimeout(resolve, 200))
    t.same(stream.events().map((event) => event.event_id), after, `${name}: the new primary's events, once each, in order`)
  }
})
