import pg from 'pg'
import t, { type Test } from 'tap'
import { buildApp } from '../app.js'
import { loadConfig } from '../config.js'
import { migrateToLatest } from '../db/migrate.js'
import { withDatabase } from './helpers/database.js'
import { openStream } from './helpers/sse.js'
import { startReplicatedPostgres, standbySkipReason } from './helpers/standby.js'
import { waitUntil } from './helpers/wait.js'

// A failover to an asynchronous standby that lost the primary's last
// commits: ids the clients saw may be handed out again by the new primary.
// A client resuming from a cursor the new primary never saw gets 410
// cursor_expired (and refetches), never a stream that skips events; what
// the new primary commits reaches every client once.

async function serve (t: Test, url: string) {
  const config = loadConfig({ DATABASE_URL: url, LOG_LEVEL: 'silent', MAX_EVENT_LOOP_DELAY_MS: '0' })
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
  const primary = withDatabase(pg15.primaryUrl, 'ocp_failover')
  const standby = withDatabase(pg15.standbyUrl, 'ocp_failover')
  await migrateToLatest(primary)
  await new pg.Client({ connectionString: primary }).connect().then(async (c) => { await c.query(`insert into runs (run_id, goal, summary, status) values ('run-f', 'g', 's', 'running')`); await c.end() })

  const old = await serve(t, primary)
  const kept = await insert(primary, 3, 'replicated')
  await waitUntil(async () => Number((await fetch(`${old.url}/api/runs`)).headers.get('x-event-cursor')) >= kept.at(-1)!, 'the old primary to settle them')
  await pg15.waitForReplay()
  const keptCursor = kept.at(-1)!

  // The standby is cut off; what the primary commits now is lost with it.
  await pg15.detachStandby()
  const watcher = await openStream(old.url, `/api/events/stream?after_event_id=${keptCursor}`)
  const lost = await insert(primary, 3, 'lost')
  await watcher.waitFor((s) => s.events().length >= 3, 15_000)
  watcher.close()
  const lostCursor = lost.at(-1)!
  const lostOffset = (await fetch(`${old.url}/api/streams/runs/run-f?offset=-1`)).headers.get('stream-next-offset')
  t.equal(parseInt(lostOffset!, 36), lostCursor, 'and a Durable Streams reader was handed the offset after them')
  t.same(watcher.events().map((event) => event.event_id), lost, 'a client saw the events the standby never got')

  await old.app.close()
  pg15.crashPrimary()
  await pg15.promoteStandby()
  const next = await serve(t, standby)

  // Until the keeper records the new timeline, the cursor is refused as transient; then, for good, as 410.
  await waitUntil(async () => (await fetch(`${next.url}/api/events?after_event_id=${lostCursor}`)).status === 410, 'the lost cursor to answer 410')
  const page = await fetch(`${next.url}/api/events?after_event_id=${lostCursor}`)
  t.match(await page.json(), { error: { code: 'cursor_expired', message: /lost in a failover/ } }, 'GET /api/events: 410 cursor_expired, saying why')
  const resumed = await openStream(next.url, `/api/events/stream?run_id=run-f`, { 'last-event-id': String(lostCursor) })
  t.equal(resumed.status, 410, 'the stream resumed from it: 410 before any byte')
  const durable = await fetch(`${next.url}/api/streams/runs/run-f?offset=${lostOffset}`)
  t.match({ status: durable.status, body: await durable.json() }, { status: 410, body: { error: { code: 'cursor_expired' } } },
    'a Durable Streams read from the offset the old primary handed out: 410')

  // A client whose cursor the new primary saw resumes, and a client that refetched subscribes from the read's cursor.
  const survivor = await openStream(next.url, `/api/events/stream?run_id=run-f&after_event_id=${keptCursor}`)
  t.teardown(survivor.close)
  const read = await fetch(`${next.url}/api/runs/run-f`)
  const cursor = Number(read.headers.get('x-event-cursor'))
  t.ok(cursor <= keptCursor || cursor > lostCursor, `the read's X-Event-Cursor (${cursor}) is not inside the reissued range`)
  const refetched = await openStream(next.url, `/api/events/stream?run_id=run-f&after_event_id=${cursor}`)
  t.teardown(refetched.close)
  const fresh = await insert(standby, 3, 'after_failover')
  t.ok(fresh[0]! > lostCursor, `the new primary's ids (${fresh[0]}...) are past every id the old one may have handed out`)
  for (const [name, stream] of [['from a cursor the new primary saw', survivor], ['from the refetched read\'s cursor', refetched]] as const) {
    await stream.waitFor((s) => s.events().length >= 3, 15_000)
    await new Promise((resolve) => setTimeout(resolve, 200))
    t.same(stream.events().map((event) => event.event_id), fresh, `${name}: the new primary's events, once each, in order`)
  }
})
