import pg from 'pg'
import t from 'tap'
import { migrateToLatest } from '../db/migrate.ts'
import { build } from './helpers/app.ts'
import { ownCluster } from './helpers/cluster.ts'
import { needsServer } from './helpers/database.ts'
import { metricValue } from './helpers/metrics.ts'
import { openStream } from './helpers/sse.ts'
import { sleep, waitUntil } from './helpers/wait.ts'

// What a crash of the primary can undo, and what it must not: a hole the
// log has settled (an id drawn and rolled back) is never handed out again,
// even when the sequence's record of it had not reached the disk; and a
// prepared transaction that drew an event id holds delivery, across a
// restart too, named in the log and counted in /metrics, until it ends.

const skip = needsServer('a Postgres server of its own, to crash and restart')

async function connect (url: string) {
  const client = new pg.Client({ connectionString: url })
  client.on('error', () => {})
  await client.connect()
  return client
}

/**
 * A connection to the server at `url` once it has recovered from the crash
 * that killed its WAL writer `walwriterPid`. A connection can still be
 * accepted before the postmaster has noticed the death (and then be ended by
 * the restart), so the server counts as recovered only once a new WAL writer
 * runs: it starts after recovery.
 */
async function recoveredFrom (url: string, walwriterPid: number): Promise<pg.Client> {
  let recovered: pg.Client | undefined
  await waitUntil(async () => {
    const client = await connect(url).catch(() => undefined)
    const { rows } = await client?.query("select pid from pg_stat_activity where backend_type = 'walwriter'").catch(() => ({ rows: [] })) ?? { rows: [] }
    if (rows.length === 1 && rows[0].pid !== walwriterPid) {
      recovered = client
      return true
    }
    await client?.end().catch(() => {})
    return false
  }, 'the server to recover from the crash', 60_000)
  return recovered!
}

t.test('a crash never hands out again an id the log settled as a hole', { skip }, async (t) => {
  // No commit waits for the disk here, and the WAL writer is paused below:
  // a record reaches the disk only when something asks for it explicitly.
  const cluster = await ownCluster(t, '-c synchronous_commit=off')
  await migrateToLatest(cluster.url)
  const app = await build(t, { DATABASE_URL: cluster.url, EVENTS_POLL_INTERVAL_MS: 50, EVENTS_KEEPER_INTERVAL_MS: 100, EVENTS_WAKEUP: 'off' })
  await app.listen({ port: 0, host: '127.0.0.1' })
  const url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`
  const cursor = async () => Number((await fetch(`${url}/api/runs`)).headers.get('x-event-cursor'))

  const admin = await connect(cluster.url)
  await admin.query("insert into events (event_type) values ('base')")
  // After a checkpoint, the next nextval writes its own WAL record (the state a recovery starts from is the checkpoint's).
  await admin.query('checkpoint')
  const { rows: [walwriter] } = await admin.query("select pid from pg_stat_activity where backend_type = 'walwriter'")
  process.kill(walwriter.pid, 'SIGSTOP')
  t.teardown(() => { try { process.kill(walwriter.pid, 'SIGCONT') } catch {} })

  await admin.query('begin')
  const hole = Number((await admin.query("insert into events (event_type) values ('rolled_back') returning event_id")).rows[0].event_id)
  await admin.query('rollback')
  await waitUntil(async () => await cursor() >= hole, 'the service to settle the hole')
  const stream = await openStream(url, `/api/events/stream?after_event_id=${await cursor()}`)
  t.teardown(stream.close)
  await admin.end()

  // The crash: the WAL writer killed, the postmaster restarts every process and recovers from what reached the disk.
  process.kill(walwriter.pid, 'SIGKILL')
  const writer = await recoveredFrom(cluster.url, walwriter.pid)
  t.teardown(() => writer.end())
  const after = Number((await writer.query("insert into events (event_type) values ('after_crash') returning event_id")).rows[0].event_id)
  t.ok(after > hole, `the first id after the crash (${after}) is above the hole the log settled (${hole}): the settled position reached the disk before it was published`)
  await stream.waitFor((s) => s.events().length >= 1)
  t.same(stream.events().map((event) => event.event_id), [after], 'and the stream resumed from the settled position gets it')
})

t.test('a prepared transaction that drew an event id holds delivery, across a restart, named and counted', { skip }, async (t) => {
  const cluster = await ownCluster(t, '-c max_prepared_transactions=4')
  await migrateToLatest(cluster.url)
  const lines: Array<{ msg: string, waitingTransaction?: string }> = []
  const app = await build(t, { DATABASE_URL: cluster.url, EVENTS_POLL_INTERVAL_MS: 50, EVENTS_KEEPER_INTERVAL_MS: 100, LOG_LEVEL: 'warn' },
    { logger: { level: 'warn', stream: { write: (line: string) => { lines.push(JSON.parse(line)) } } } })
  await app.listen({ port: 0, host: '127.0.0.1' })
  const url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`

  const writer = await connect(cluster.url)
  const base = Number((await writer.query("insert into events (event_type) values ('base') returning event_id")).rows[0].event_id)
  const stream = await openStream(url, `/api/events/stream?after_event_id=${base}`)
  t.teardown(stream.close)
  await writer.query('begin')
  const prepared = Number((await writer.query("insert into events (event_type) values ('prepared') returning event_id")).rows[0].event_id)
  await writer.query("prepare transaction 'orphan-1'")
  const above = Number((await writer.query("insert into events (event_type) values ('above') returning event_id")).rows[0].event_id)

  await waitUntil(() => lines.some((line) => line.msg.startsWith('event delivery waits past id')), 'the wait to be logged', 60_000)
  t.match(lines.find((line) => line.msg.startsWith('event delivery waits past id')),
    { waitingTransaction: 'orphan-1', msg: /prepared transaction \('orphan-1'\).*COMMIT PREPARED or ROLLBACK PREPARED 'orphan-1'/ }, 'the log names the prepared transaction and says what to do')
  t.equal(metricValue((await app.inject({ url: '/metrics' })).body, 'event_settle_prepared_writers'), 1, '/metrics counts it')
  t.same(stream.events(), [], 'nothing above it is delivered')

  // A restart recovers the prepared transaction: it still holds delivery.
  await writer.end()
  cluster.stop()
  cluster.start()
  await sleep(1000)
  t.same(stream.events(), [], 'after a restart, the recovered prepared transaction still holds delivery')

  const admin = await connect(cluster.url)
  t.teardown(() => admin.end())
  await admin.query("commit prepared 'orphan-1'")
  await stream.waitFor((s) => s.events().length >= 2, 15_000).catch(() => {})
  // The stream may have been ended by the restart; a resumed one gets the same.
  const resumed = await openStream(url, `/api/events/stream?after_event_id=${base}`)
  t.teardown(resumed.close)
  await resumed.waitFor((s) => s.events().length >= 2)
  t.same(resumed.events().map((event) => event.event_id), [prepared, above], 'once committed, both in order')
  await waitUntil(async () => metricValue((await app.inject({ url: '/metrics' })).body, 'event_settle_prepared_writers') === 0, 'the count to fall back to 0')
})

t.test('a crash that loses commits streams saw: their ids are never handed out again, their cursors answer 410, and no replica serves them', { skip }, async (t) => {
  // Writers commit without waiting for the disk, and the WAL writer is paused below: what they commit is
  // visible, and delivered, before it is on disk.
  const cluster = await ownCluster(t, '-c synchronous_commit=off')
  await migrateToLatest(cluster.url)
  const config = { DATABASE_URL: cluster.url, EVENTS_POLL_INTERVAL_MS: 50, EVENTS_KEEPER_INTERVAL_MS: 100, EVENTS_WAKEUP: 'off' } as const
  const app = await build(t, config)
  await app.listen({ port: 0, host: '127.0.0.1' })
  const url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`
  const cursor = async () => Number((await fetch(`${url}/api/runs`)).headers.get('x-event-cursor'))
  const insert = async (client: pg.Client, type: string) =>
    (await client.query('insert into events (event_type) select $1 from generate_series(1, 3) returning event_id', [type])).rows.map((row) => Number(row.event_id))

  const admin = await connect(cluster.url)
  const kept = await insert(admin, 'kept')
  await waitUntil(async () => await cursor() >= kept.at(-1)!, 'the keeper to settle them')
  await admin.query('checkpoint')
  // The keeper's ticks commit synchronously, which would write the lost commits to disk too: held off.
  const blocker = await connect(cluster.url)
  await blocker.query('begin')
  await blocker.query('select 1 from event_log_state for update')
  const { rows: [walwriter] } = await admin.query("select pid from pg_stat_activity where backend_type = 'walwriter'")
  process.kill(walwriter.pid, 'SIGSTOP')
  t.teardown(() => { try { process.kill(walwriter.pid, 'SIGCONT') } catch {} })

  const watcher = await openStream(url, `/api/events/stream?after_event_id=${kept.at(-1)}`)
  t.teardown(watcher.close)
  const lost = await insert(admin, 'lost')
  await watcher.waitFor((s) => s.events().length >= 3)
  t.same(watcher.events().map((event) => event.event_id), lost, 'a stream delivered commits that are not on disk yet')
  // A Durable Streams long-poll waiting after them.
  const longPoll = fetch(`${url}/api/streams/events?offset=${lost.at(-1)!.toString(36).padStart(11, '0')}&live=long-poll`)
  await admin.end()

  process.kill(walwriter.pid, 'SIGKILL')
  const writer = await recoveredFrom(cluster.url, walwriter.pid)
  t.teardown(() => writer.end())
  t.equal((await writer.query('select count(*)::int as n from events where event_id = any($1)', [lost])).rows[0].n, 0, 'the crash lost them')

  await watcher.ended
  t.pass('the stream that delivered them ends (its client reconnects)')
  const polled = await longPoll
  t.equal(polled.status, 204, 'a long-poll waiting after them answers, with nothing')
  t.ok(parseInt(polled.headers.get('stream-next-offset')!, 36) <= kept.at(-1)!, 'and the offset to go on from is one that survived')
  const after = await insert(writer!, 'after_crash')
  t.ok(after[0]! > lost.at(-1)!, `the ids after the crash (${after[0]}...) are above every id the lost commits had: none is handed out again`)
  const resumed = await openStream(url, '/api/events/stream', { 'last-event-id': String(lost.at(-1)) })
  t.equal(resumed.status, 410, 'a stream resumed after a lost event: 410 before any byte, never 400 and never a skip')
  t.match(JSON.parse(resumed.body), { error: { code: 'cursor_expired', message: /lost in a failover or a crash/ } })
  const page = await fetch(`${url}/api/events?after_event_id=${lost[0]}`)
  t.equal(page.status, 410, 'GET /api/events from inside the lost ids: 410')

  // Every event the table holds, once each, in order: to a stream from a cursor that survived, a fresh one, and one
  // on a replica started after the crash; none of them is served from memory what is gone.
  const other = await build(t, config)
  await other.listen({ port: 0, host: '127.0.0.1' })
  const otherUrl = `http://127.0.0.1:${(other.server.address() as { port: number }).port}`
  for (const [name, base, path] of [['from a cursor that survived', url, `/api/events/stream?after_event_id=${kept.at(-1)}`], ['a fresh stream', url, '/api/events/stream?after_event_id=0'],
    ['on a replica started after the crash', otherUrl, '/api/events/stream?after_event_id=0']] as const) {
    const stream = await openStream(base, path)
    t.teardown(stream.close)
    const expected = path.endsWith('=0') ? [...kept, ...after] : after
    await stream.waitFor((s) => s.events().length >= expected.length)
    await sleep(200)
    t.same(stream.events().map((event) => event.event_id), expected, `${name}: the table's events, once each, in order`)
  }
  const durable = await fetch(`${url}/api/streams/events?offset=-1`)
  t.same((await durable.json() as Array<{ event_id: number }>).map((event) => event.event_id), [...kept, ...after], 'and a Durable Streams reader from -1')
})

t.test('a prepared transaction the census does not recognize is bounded by the holders it can be, not the whole census before', { skip }, async (t) => {
  const cluster = await ownCluster(t, '-c max_prepared_transactions=4')
  await migrateToLatest(cluster.url)
  const db = await connect(cluster.url)
  t.teardown(() => db.end())
  interface Census { drawn: string, mark: string, writers: string[], drawBounds: string[], lateBounds: string[] }
  const census = async (prior: Census): Promise<Census> => {
    const { rows: [row] } = await db.query(`select drawn::text, mark::text, writers, draw_bounds::text[], late_bounds::text[]
      from events_census($1::bigint, $2::bigint, $3::text[], $4::bigint[], $5::bigint[])`, [prior.drawn, prior.mark, prior.writers, prior.drawBounds, prior.lateBounds])
    return { drawn: row.drawn, mark: row.mark, writers: row.writers, drawBounds: row.draw_bounds, lateBounds: row.late_bounds }
  }
  const boundsOf = (c: Census, writer: RegExp) => c.drawBounds[c.writers.findIndex((w) => writer.test(w))]
  const session = async () => {
    const connection = await connect(cluster.url)
    t.teardown(() => connection.end())
    return connection
  }
  await db.query("insert into events (event_type) values ('base')")
  const base = (await db.query('select (select last_value from events_event_id_seq)::text as drawn, (select last_value from events_settle_mark)::text as mark')).rows[0]
  const quiet: Census = { drawn: base.drawn, mark: base.mark, writers: [], drawBounds: [], lateBounds: [] }

  // An old writer in flight, seen with its transaction id: low bounds.
  const old = await session()
  await old.query('begin')
  const oldXid = (await old.query("insert into events (event_type) values ('old') returning pg_current_xact_id()::text as xid")).rows[0].xid
  const c1 = await census(quiet)
  await db.query("insert into events (event_type) select 'meanwhile' from generate_series(1, 5)")
  const c2 = await census(c1)
  t.equal(boundsOf(c2, new RegExp(`:${oldXid}$`)), quiet.drawn, 'the old writer keeps its low bound')

  // A writer no census saw, prepared: it took the lock after c2 read pg_locks.
  const fresh = await session()
  await fresh.query('begin')
  const freshXid = (await fresh.query("insert into events (event_type) values ('fresh') returning pg_current_xact_id()::text as xid")).rows[0].xid
  await fresh.query("prepare transaction 'fresh'")
  const c3 = await census(c2)
  t.equal(boundsOf(c3, new RegExp(`:${freshXid}$`)), c2.drawn, 'a prepared transaction no census saw is bounded by the census before it, not by the old writer\'s bound')

  // A writer seen before it had a transaction id, then prepared (under another virtual id): it may be that one.
  const early = await session()
  await early.query('begin')
  await early.query("select nextval('events_event_id_seq')")
  const c4 = await census(c3)
  const earlyBound = boundsOf(c4, /:$/)!
  await db.query("insert into events (event_type) select 'meanwhile' from generate_series(1, 5)")
  const earlyXid = (await early.query("insert into events (event_type) values ('early') returning pg_current_xact_id()::text as xid")).rows[0].xid
  await early.query("prepare transaction 'early'")
  const c5 = await census(c4)
  t.equal(boundsOf(c5, new RegExp(`:${earlyXid}$`)), earlyBound, 'one seen without a transaction id keeps the bound of the holder it may be')
  for (const gid of ['fresh', 'early']) await db.query(`commit prepared '${gid}'`)
  await old.query('commit')
})
