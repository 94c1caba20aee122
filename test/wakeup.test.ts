import { readFileSync, writeFileSync } from 'node:fs'
import pg from 'pg'
import { pino } from 'pino'
import t from 'tap'
import { migrateToLatest } from '../db/migrate.ts'
import { EventHub } from '../events/hub.ts'
import { isRefusal } from '../events/wakeup.ts'
import { build, serve } from './helpers/app.ts'
import { ownCluster } from './helpers/cluster.ts'
import { movableAddress } from './helpers/proxy.ts'
import { needsServer, testDatabaseUrl, withDatabase } from './helpers/database.ts'
import { openStream, type RawStream } from './helpers/sse.ts'
import { READER_ROLE, standbySkipReason, startReplicatedPostgres } from './helpers/standby.ts'
import { PROMPTLY_MS, sleep, waitUntil } from './helpers/wait.ts'

// The event wake-up (EVENTS_WAKEUP, events/wakeup.ts): new
// events reach the streams as they commit, long before the safety net's
// poll; a lost WAL stream degrades to polling and comes back by itself;
// a database that refuses replication leaves the hub polling, logged once.

const skip = needsServer('a Postgres server of its own that allows replication connections')

interface LogLine { msg: string, level: number }
const logTo = (lines: LogLine[]) => ({ level: 'info', stream: { write: (line: string) => { lines.push(JSON.parse(line)) } } })

async function query (url: string, text: string): Promise<pg.QueryResultRow[]> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    return (await client.query(text)).rows
  } finally {
    await client.end()
  }
}

/** A writer's connection per database, kept open: the time measured below is the commit's and the delivery's, not a connection's. */
const writers = new Map<string, Promise<pg.Client>>()
t.teardown(async () => { for (const writer of writers.values()) await (await writer).end().catch(() => {}) })
function writerOn (url: string): Promise<pg.Client> {
  let writer = writers.get(url)
  if (writer === undefined) {
    const client = new pg.Client({ connectionString: url })
    client.on('error', () => {}) // its server stops at the end of its subtest
    writers.set(url, writer = client.connect().then(() => client))
  }
  return writer
}

/** Inserts one event and resolves with the ms from just before the insert (its commit) until `stream` received it. */
async function deliveryMs (url: string, stream: RawStream, timeoutMs: number): Promise<number> {
  const writer = await writerOn(url)
  const started = Date.now()
  const { rows: [row] } = await writer.query("insert into events (event_type) values ('task_running') returning event_id")
  const id = Number(row!.event_id)
  await stream.waitFor((s) => s.events().some((event) => event.event_id === id), timeoutMs)
  return Date.now() - started
}

t.test('on a database that allows replication', { skip }, async (t) => {
  const cluster = await ownCluster(t)
  await migrateToLatest(cluster.url)
  // The server asks for a status update after 2.5 s of silence and cuts the connection after 5 s without one
  // (1 s, then 2 s, were cut again on a loaded CI machine, the wake-up's answer late, right after it came back).
  await query(cluster.url, "alter system set wal_sender_timeout = '5s'")
  await query(cluster.url, 'select pg_reload_conf()')
  const hbaFile = String((await query(cluster.url, 'show hba_file'))[0]!.hba_file)
  const hba = readFileSync(hbaFile, 'utf8')
  const setReplication = async (allowed: boolean) => {
    writeFileSync(hbaFile, allowed ? hba : hba.split('\n').filter((line) => !/^\s*(local|host)\s+replication\s/.test(line)).join('\n'))
    await query(cluster.url, 'select pg_reload_conf()')
  }
  t.teardown(() => setReplication(true).catch(() => {}))

  const lines: LogLine[] = []
  // The timed poll: every 60 s while the wake-up is live, every 1.5 s while it is not.
  const app = await build(t, { DATABASE_URL: cluster.url, EVENTS_WAKEUP: 'wal', EVENTS_POLL_INTERVAL_MS: 1500, EVENTS_WAKEUP_POLL_INTERVAL_MS: 60_000 }, { logger: logTo(lines) })
  await app.listen({ port: 0, host: '127.0.0.1' })
  const { port } = app.server.address() as { port: number }
  const wakeup = app.events.wakeup!
  await waitUntil(() => wakeup.live, 'the wake-up streams WAL', 60_000)
  const stream = await openStream(`http://127.0.0.1:${port}`, '/api/events/stream?after_event_id=0')
  t.teardown(() => stream.close())
  await sleep(200)

  const live = await deliveryMs(cluster.url, stream, 5000)
  t.ok(live < 500, `an event is delivered ${live} ms after its commit, where the next timed poll is up to 60 s away`)
  t.ok(wakeup.wakes > 0, 'woken by WAL')

  await sleep(11_000)
  t.ok(wakeup.live && wakeup.lost === 0, 'the connection outlives wal_sender_timeout (5 s) twice over: the server\'s keepalives are answered')

  // The WAL sender killed, and replication refused for a while: the hub polls every 1.5 s.
  await setReplication(false)
  const walSenders = await query(cluster.url, "select pg_terminate_backend(pid) as ended from pg_stat_replication where application_name = 'ocp-api-wakeup'")
  t.equal(walSenders.length, 1, 'one WAL sender serves the wake-up')
  await waitUntil(() => !wakeup.live, 'the wake-up notices')
  t.equal(wakeup.lost, 1, 'the loss is counted')
  const polled = await deliveryMs(cluster.url, stream, 5000)
  t.pass(`while it is away, polling delivers (${polled} ms)`)
  await sleep(2000) // reconnections are tried, and refused, meanwhile
  const metrics = (await app.inject({ url: '/metrics' })).body
  t.match(metrics, /^event_wakeup_live 0$/m, 'the metric says it is away')
  t.match(metrics, /^event_wakeup_lost_total 1$/m, 'and counts the loss')

  await setReplication(true)
  await waitUntil(() => wakeup.live, 'the wake-up comes back by itself', 60_000)
  // The 1.5 s poll scheduled while it was away fires once more; the next is 60 s away,
  // so a delivery within seconds is the wake-up's (a loaded machine may take some hundreds of ms).
  await sleep(1600)
  const wakesBefore = wakeup.wakes
  const back = await deliveryMs(cluster.url, stream, 5000)
  t.ok(back < 1000, `and delivers as events commit again (${back} ms), where the next timed poll is 60 s away`)
  t.ok(wakeup.wakes > wakesBefore, 'woken by WAL again')
  t.equal(lines.filter((line) => line.msg.startsWith('event wake-up lost its WAL stream')).length, 1, 'the outage is logged once, however many reconnections failed')
  t.equal(lines.filter((line) => line.msg.startsWith('event wake-up is streaming WAL again')).length, 1, 'and its end once')
  t.match((await app.inject({ url: '/metrics' })).body, /^event_wakeup_live 1$/m)
  t.equal(stream.events().length, 3, 'every event once')
})

t.test('a server stopping cleanly does not wait on the wake-up, which comes back once it is started again', { skip }, async (t) => {
  const cluster = await ownCluster(t)
  await migrateToLatest(cluster.url)
  // The timed poll: every 60 s while the wake-up is live, every 1.5 s while it is not.
  const { app, url } = await serve(t, { DATABASE_URL: cluster.url, EVENTS_WAKEUP: 'wal', EVENTS_POLL_INTERVAL_MS: 1500, EVENTS_WAKEUP_POLL_INTERVAL_MS: 60_000 })
  const wakeup = app.events.wakeup!
  await waitUntil(() => wakeup.live, 'the wake-up streams WAL', 60_000)
  const stream = await openStream(url, '/api/events/stream?after_event_id=0')
  t.teardown(() => stream.close())

  // At shutdown the WAL sender waits until its client confirms all WAL sent: a wake-up that
  // confirmed nothing held `pg_ctl stop -m fast` up forever. A clean stop takes about a second.
  const boundSeconds = PROMPTLY_MS / 1000
  const stopping = Date.now()
  const stopped = await cluster.stopClean(boundSeconds).then(() => true, () => false)
  const stopMs = Date.now() - stopping
  t.ok(stopped && stopMs < boundSeconds * 1000, stopped ? `pg_ctl stop -m fast finished in ${stopMs} ms, within ${boundSeconds} s` : `pg_ctl stop -m fast still waiting after ${stopMs} ms`)
  if (!stopped) return
  await waitUntil(() => !wakeup.live, 'the wake-up notices')

  cluster.start()
  await waitUntil(() => wakeup.live, 'the wake-up comes back by itself', 60_000)
  t.equal(wakeup.lost, 1, 'the loss is counted')
  // As above: the 1.5 s poll scheduled while it was away fires once more, the next is 60 s away.
  await sleep(1600)
  const wakesBefore = wakeup.wakes
  const back = await deliveryMs(cluster.url, stream, 5000)
  t.ok(back < 1000, `an event committed after the restart reaches the open stream in ${back} ms, where the next timed poll is 60 s away`)
  t.ok(wakeup.wakes > wakesBefore, 'woken by WAL')
})

t.test('with synchronous_standby_names = \'*\', the wake-up is never a synchronous standby', { skip: standbySkipReason() }, async (t) => {
  // A real standby: with synchronous_standby_names set and no synchronous standby, every commit waits.
  const pair = await startReplicatedPostgres(t)
  const database = 'ocp_wakeup_sync'
  await pair.createDatabase(database)
  const primary = withDatabase(pair.primaryUrl, database)
  await migrateToLatest(primary)
  // Keepalives ask for a status update every second, so the wake-up has reported its position well before the commit.
  await query(pair.primaryUrl, "alter system set synchronous_standby_names = '*'")
  await query(pair.primaryUrl, 'alter system set synchronous_commit = on')
  await query(pair.primaryUrl, "alter system set wal_sender_timeout = '2s'")
  await query(pair.primaryUrl, 'select pg_reload_conf()')
  const app = await build(t, { DATABASE_URL: primary, EVENTS_WAKEUP: 'wal' })
  await waitUntil(() => app.events.wakeup!.live, 'the wake-up streams WAL', 60_000)
  const wakeupState = "select write_lsn is not null as written, flush_lsn is null as unflushed, sync_state from pg_stat_replication where application_name = 'ocp-api-wakeup'"
  await waitUntil(async () => (await query(pair.primaryUrl, wakeupState))[0]?.written === true, 'the wake-up to report how far it has received', 60_000)

  const writer = new pg.Client({ connectionString: primary })
  await writer.connect()
  t.teardown(() => writer.end().catch(() => {}))
  const committing = Date.now()
  const committed = await Promise.race([
    writer.query("insert into events (event_type) values ('task_running')").then(() => true),
    sleep(5000).then(() => false)
  ])
  t.ok(committed, `a commit completes (in ${Date.now() - committing} ms): it waits on the standby, not on the wake-up`)
  if (!committed) await query(pair.primaryUrl, "select pg_cancel_backend(pid) from pg_stat_activity where wait_event = 'SyncRep'")
  t.match(await query(pair.primaryUrl, wakeupState), [{ unflushed: true, sync_state: 'async' }], 'the wake-up reports no flush position: async, neither sync nor potential')
  t.same((await query(pair.primaryUrl, "select sync_state from pg_stat_replication where application_name <> 'ocp-api-wakeup'")).map((row) => row.sync_state), ['sync'], 'the standby is the synchronous one')
})

t.test('reads on the primary as a role without REPLICATION: the wake-up connects with DATABASE_URL', { skip }, async (t) => {
  const cluster = await ownCluster(t)
  await migrateToLatest(cluster.url)
  // The roles of deploy/postgres/grants.sql, as the compose deployment makes them: the reader may not replicate.
  await query(cluster.url, 'create role ocp_reader login noreplication; create role ocp_writer login noreplication')
  await query(cluster.url, readFileSync(new URL('../deploy/postgres/grants.sql', import.meta.url), 'utf8'))
  const reader = cluster.url.replace('//postgres@', '//ocp_reader@')
  const lines: LogLine[] = []
  const app = await build(t, { DATABASE_URL: cluster.url, DATABASE_READ_URL: reader, EVENTS_WAKEUP: 'wal', EVENTS_POLL_INTERVAL_MS: 60_000, EVENTS_WAKEUP_POLL_INTERVAL_MS: 60_000 }, { logger: logTo(lines) })
  t.same([app.readDatabaseUrl, app.wakeupDatabaseUrl], [reader, cluster.url], 'reads as the reader, the wake-up as DATABASE_URL\'s role')
  t.ok(lines.some((line) => line.msg.startsWith('DATABASE_READ_URL names a primary: the event wake-up connects with DATABASE_URL')), 'said at start')
  await app.listen({ port: 0, host: '127.0.0.1' })
  const { port } = app.server.address() as { port: number }
  await waitUntil(() => app.events.wakeup!.live, 'the wake-up streams WAL', 60_000)
  const senders = await query(cluster.url, 'select usename from pg_stat_replication where application_name = \'ocp-api-wakeup\'')
  t.same(senders, [{ usename: 'postgres' }], 'over a replication connection of DATABASE_URL\'s role')
  const stream = await openStream(`http://127.0.0.1:${port}`, '/api/events/stream?after_event_id=0')
  t.teardown(() => stream.close())
  await sleep(200)
  const live = await deliveryMs(cluster.url, stream, 5000)
  t.ok(live < 500, `an event is delivered ${live} ms after its commit, where the next timed poll is up to 60 s away`)
  const readers = await query(cluster.url, 'select distinct usename from pg_stat_activity where application_name = \'ocp-api\'')
  t.same(readers, [{ usename: 'ocp_reader' }], 'and read as the reader')
})

t.test('through a hot standby: the wake-up connects to the standby the hub reads from', { skip: standbySkipReason() }, async (t) => {
  const pair = await startReplicatedPostgres(t)
  const database = 'ocp_wakeup'
  await pair.createDatabase(database)
  // The primary's address, which a failover moves to the promoted standby (the keeper follows it there).
  const [primaryPort, standbyPort] = [pair.primaryUrl, pair.standbyUrl].map((url) => Number(new URL(url).port))
  const address = await movableAddress(t, primaryPort!)
  const primary = withDatabase(pair.primaryUrl.replace(`:${primaryPort}/`, `:${address.port}/`), database)
  // The read role may stream WAL (it replicates to the standby, where the wake-up connects as it).
  await query(pair.primaryUrl, `alter role ${READER_ROLE} replication`)
  await migrateToLatest(primary)
  await pair.waitForReplay()
  const app = await build(t, {
    DATABASE_URL: primary,
    DATABASE_READ_URL: withDatabase(pair.readerUrl, database),
    EVENTS_WAKEUP: 'wal',
    EVENTS_POLL_INTERVAL_MS: 60_000,
    EVENTS_WAKEUP_POLL_INTERVAL_MS: 60_000
  })
  await app.listen({ port: 0, host: '127.0.0.1' })
  const { port } = app.server.address() as { port: number }
  await waitUntil(() => app.events.wakeup!.live, 'the wake-up streams WAL', 60_000)
  const stream = await openStream(`http://127.0.0.1:${port}`, '/api/events/stream?after_event_id=0')
  t.teardown(() => stream.close())
  await sleep(200)
  const delays: number[] = []
  for (let i = 0; i < 5; i++) delays.push(await deliveryMs(primary, stream, 5000))
  t.ok(Math.max(...delays) < 500, `events committed on the primary reach a stream on the standby in ${delays.join(', ')} ms, where the next timed poll is up to 60 s away`)
  t.match(pair.log('standby'), new RegExp(`replication connection authorized: user=${READER_ROLE} application_name=ocp-api-wakeup`), 'through the standby\'s WAL sender')
  t.notMatch(pair.log('primary'), /ocp-api-wakeup/, 'not the primary\'s')

  // A failover: the standby promoted, the old primary gone, its address moved. The standby's WAL sender ends the
  // stream at the end of the old timeline; the wake-up starts again on the new one, and the keeper records it.
  const wakeup = app.events.wakeup!
  const standby = withDatabase(pair.standbyUrl, database)
  await waitUntil(async () => Number((await query(standby, 'select settled from event_log_state'))[0]!.settled) >= 5, 'the standby to have the keeper\'s position', 10_000)
  await query(standby, 'select pg_promote()')
  pair.crashPrimary()
  address.moveTo(standbyPort!)
  await waitUntil(() => wakeup.lost === 1, 'the stream ends with the timeline', 60_000)
  await waitUntil(() => wakeup.live, 'and starts again on the new one', 60_000)
  await waitUntil(() => app.events.keeper!.epoch === 1, 'the keeper to record the new timeline', 60_000)
  const promoted = await deliveryMs(standby, stream, 5000)
  t.ok(promoted < 500, `events committed on the promoted standby are delivered as they commit (${promoted} ms)`)
  t.equal(stream.events().length, 6, 'every event once')
})

t.test('on a database that refuses replication connections', { skip }, async (t) => {
  const [rules] = await query(await testDatabaseUrl(), "select count(*) > 0 as allowed from pg_hba_file_rules where 'replication' = any(database)")
  if (rules!.allowed === true) {
    t.pass('skipped: this server allows replication connections, so the refusal cannot be shown on it')
    return
  }
  t.test('auto: polling alone, logged once', async (t) => {
    const lines: LogLine[] = []
    const app = await build(t, { EVENTS_WAKEUP: 'auto', EVENTS_POLL_INTERVAL_MS: 50 }, { logger: logTo(lines) })
    const wakeup = app.events.wakeup!
    await waitUntil(() => wakeup.refused, 'the refusal')
    await sleep(1200)
    const refusals = lines.filter((line) => line.msg.startsWith('event wake-up refused'))
    t.equal(refusals.length, 1, 'logged once, and not tried again')
    t.equal(refusals[0]!.level, 30, 'at info: the common case, nothing is wrong')
    t.notOk('err' in refusals[0]!, 'no stack trace, the database\'s reason only')
    t.match(refusals[0], { code: /^28/, reason: /replication/ })
    t.notOk(wakeup.live)
    await app.listen({ port: 0, host: '127.0.0.1' })
    const { port } = app.server.address() as { port: number }
    const stream = await openStream(`http://127.0.0.1:${port}`, '/api/events/stream?after_event_id=0')
    t.teardown(() => stream.close())
    await deliveryMs(await testDatabaseUrl(), stream, 5000)
    t.pass('events are delivered by polling')
  })
  t.test('wal: retried, logged once', async (t) => {
    const lines: LogLine[] = []
    const app = await build(t, { EVENTS_WAKEUP: 'wal' }, { logger: logTo(lines) })
    const wakeup = app.events.wakeup!
    await waitUntil(() => lines.some((line) => line.msg.startsWith('event wake-up cannot stream WAL')), 'the failure')
    await sleep(1200) // retried after 0.5 s, then 1 s
    t.equal(lines.filter((line) => line.msg.startsWith('event wake-up cannot stream WAL')).length, 1, 'logged once')
    t.notOk(wakeup.refused || wakeup.live, 'still trying')
  })
})

t.test('off: the hub only polls', async (t) => {
  const app = await build(t, { EVENTS_WAKEUP: 'off' })
  t.equal(app.events.wakeup, undefined)
  t.notMatch((await app.inject({ url: '/metrics' })).body, /event_wakeup/, 'and /metrics has no wake-up series')
})

t.test('which failures are refusals', async (t) => {
  for (const code of ['28000', '28P01', '42501', '08P01', '0A000']) t.ok(isRefusal(Object.assign(new Error(code), { code })), code)
  for (const code of ['57P01', '57P03', '53300']) t.notOk(isRefusal(Object.assign(new Error(code), { code })), `${code}: not now`)
  t.notOk(isRefusal(new Error('connect ECONNREFUSED')), 'a network failure: not now')
})

t.test('a wake-up after the hub stopped polls nothing', async (t) => {
  const lines: LogLine[] = []
  const log = pino({ level: 'info' }, { write: (line: string) => { lines.push(JSON.parse(line)) } })
  // No database at all: a poll would fail, and say so.
  const hub = new EventHub(undefined as never, { pollIntervalMs: 10, wakeupPollIntervalMs: 10, windowBytes: 0, log })
  hub.stop()
  hub.wake()
  await sleep(100)
  t.same(lines, [])
})

t.test('a wake-up polls right after the turn it came in, not a timer\'s millisecond later; stopping cancels it', async (t) => {
  const lines: LogLine[] = []
  const log = pino({ level: 'info' }, { write: (line: string) => { lines.push(JSON.parse(line)) } })
  // A database that only says when it is first asked (and fails: a poll logs that, once).
  let askedAt: 'the check phase' | undefined
  const db = new Proxy({}, { get () { askedAt ??= 'the check phase'; throw new Error('no database here') } }) as never
  const hub = new EventHub(db, { pollIntervalMs: 60_000, wakeupPollIntervalMs: 60_000, windowBytes: 0, log })
  t.teardown(() => hub.stop())
  hub.wake()
  t.equal(askedAt, undefined, 'not in the turn of the wake-up itself')
  await new Promise<void>((resolve) => setImmediate(resolve))
  t.equal(askedAt, 'the check phase', 'polled in the check phase right after it, before any timer')
  await sleep(20)
  t.equal(lines.filter((line) => line.msg.startsWith('event poller cannot read events')).length, 1, 'the failed poll logged once')

  const stopped = new EventHub(undefined as never, { pollIntervalMs: 60_000, wakeupPollIntervalMs: 60_000, windowBytes: 0, log })
  stopped.wake()
  stopped.stop()
  await sleep(50)
  t.equal(lines.length, 1, 'a hub stopped with its wake-up pending polls nothing')
})
