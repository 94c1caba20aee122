import pg from 'pg'
import t from 'tap'
import { migrateToLatest } from '../db/migrate.js'
import { build } from './helpers/app.js'
import { ownCluster } from './helpers/cluster.js'
import { needsServer } from './helpers/database.js'
import { metricValue } from './helpers/metrics.js'
import { openStream } from './helpers/sse.js'
import { sleep, waitUntil } from './helpers/wait.js'

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

t.test('a crash never hands out again an id the log settled as a hole', { skip }, async (t) => {
  // No commit waits for the disk here, and the WAL writer is paused below:
  // a record reaches the disk only when something asks for it explicitly.
  const cluster = await ownCluster(t, '-c synchronous_commit=off')
  await migrateToLatest(cluster.url)
  const app = await build(t, { DATABASE_URL: cluster.url, EVENTS_POLL_INTERVAL_MS: 50, EVENTS_CLOCK_INTERVAL_MS: 100, EVENTS_WAKEUP: 'off' })
  await app.listen({ port: 0, host: '127.0.0.1' })
  const url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`
  const cursor = async () => Number((await fetch(`${url}/api/runs`)).headers.get('x-event-cursor'))

  const admin = await connect(cluster.url)
  await admin.query(`insert into events (event_type) values ('base')`)
  // After a checkpoint, the next nextval writes its own WAL record (the state a recovery starts from is the checkpoint's).
  await admin.query('checkpoint')
  const { rows: [walwriter] } = await admin.query(`select pid from pg_stat_activity where backend_type = 'walwriter'`)
  process.kill(walwriter.pid, 'SIGSTOP')
  t.teardown(() => { try { process.kill(walwriter.pid, 'SIGCONT') } catch {} })

  await admin.query('begin')
  const hole = Number((await admin.query(`insert into events (event_type) values ('rolled_back') returning event_id`)).rows[0].event_id)
  await admin.query('rollback')
  await waitUntil(async () => await cursor() >= hole, 'the service to settle the hole')
  const stream = await openStream(url, `/api/events/stream?after_event_id=${await cursor()}`)
  t.teardown(stream.close)
  await admin.end()

  // The crash: the WAL writer killed, the postmaster restarts every process and recovers from what reached the disk.
  // A connection can still be accepted before the postmaster has noticed the death (and then be ended by the
  // restart), so the server counts as recovered only once a new WAL writer runs: it starts after recovery.
  process.kill(walwriter.pid, 'SIGKILL')
  let writer: pg.Client | undefined
  await waitUntil(async () => {
    const client = await connect(cluster.url).catch(() => undefined)
    const { rows } = await client?.query(`select pid from pg_stat_activity where backend_type = 'walwriter'`).catch(() => ({ rows: [] })) ?? { rows: [] }
    if (rows.length === 1 && rows[0].pid !== walwriter.pid) {
      writer = client
      return true
    }
    await client?.end().catch(() => {})
    return false
  }, 'the server to recover from the crash', 30_000)
  t.teardown(() => writer!.end())
  const after = Number((await writer!.query(`insert into events (event_type) values ('after_crash') returning event_id`)).rows[0].event_id)
  t.ok(after > hole, `the first id after the crash (${after}) is above the hole the log settled (${hole}): the settled position reached the disk before it was published`)
  await stream.waitFor((s) => s.events().length >= 1, 30_000)
  t.same(stream.events().map((event) => event.event_id), [after], 'and the stream resumed from the settled position gets it')
})

t.test('a prepared transaction that drew an event id holds delivery, across a restart, named and counted', { skip }, async (t) => {
  const cluster = await ownCluster(t, '-c max_prepared_transactions=4')
  await migrateToLatest(cluster.url)
  const lines: Array<{ msg: string, waitingTransaction?: string }> = []
  const app = await build(t, { DATABASE_URL: cluster.url, EVENTS_POLL_INTERVAL_MS: 50, EVENTS_CLOCK_INTERVAL_MS: 100, LOG_LEVEL: 'warn' },
    { logger: { level: 'warn', stream: { write: (line: string) => { lines.push(JSON.parse(line)) } } } })
  await app.listen({ port: 0, host: '127.0.0.1' })
  const url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`

  const writer = await connect(cluster.url)
  const base = Number((await writer.query(`insert into events (event_type) values ('base') returning event_id`)).rows[0].event_id)
  const stream = await openStream(url, `/api/events/stream?after_event_id=${base}`)
  t.teardown(stream.close)
  await writer.query('begin')
  const prepared = Number((await writer.query(`insert into events (event_type) values ('prepared') returning event_id`)).rows[0].event_id)
  await writer.query(`prepare transaction 'orphan-1'`)
  const above = Number((await writer.query(`insert into events (event_type) values ('above') returning event_id`)).rows[0].event_id)

  await waitUntil(() => lines.some((line) => line.msg.startsWith('event delivery waits past id')), 'the wait to be logged', 15_000)
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
  await admin.query(`commit prepared 'orphan-1'`)
  await stream.waitFor((s) => s.events().length >= 2, 15_000).catch(() => {})
  // The stream may have been ended by the restart; a resumed one gets the same.
  const resumed = await openStream(url, `/api/events/stream?after_event_id=${base}`)
  t.teardown(resumed.close)
  await resumed.waitFor((s) => s.events().length >= 2, 15_000)
  t.same(resumed.events().map((event) => event.event_id), [prepared, above], 'once committed, both in order')
  await waitUntil(async () => metricValue((await app.inject({ url: '/metrics' })).body, 'event_settle_prepared_writers') === 0, 'the count to fall back to 0')
})
