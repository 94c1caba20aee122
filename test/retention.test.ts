import type { FastifyBaseLogger, FastifyInstance } from 'fastify'
import { request as httpRequest } from 'node:http'
import { sql } from 'kysely'
import t, { type Test } from 'tap'
import type { Config } from '../config.ts'
import { PARTITION_LOCK_TIMEOUT_MS, EventLogKeeper } from '../events/keeper/keeper.ts'
import { build } from './helpers/app.ts'
import { needsServer, testDatabaseUrl } from './helpers/database.ts'
import { insertGraph, json, makeArtifact, makeAttempt, makeMessage, makeRun, makeTask, makeThread, writer } from './helpers/fixtures.ts'
import { metricValue } from './helpers/metrics.ts'
import { insertEvents, openStream } from './helpers/sse.ts'
import { waitUntil } from './helpers/wait.ts'

// EVENTS_RETENTION end to end: events go by whole partitions within twice
// the retention, the history's floor rises, and cursors below it are
// answered 410 cursor_expired, on the stream and on GET /api/events.

async function serve (t: Test, overrides: Partial<Config> = {}): Promise<{ app: FastifyInstance, url: string }> {
  const app = await build(t, { EVENTS_POLL_INTERVAL_MS: 50, EVENTS_KEEPER_INTERVAL_MS: 200, ...overrides })
  await app.listen({ port: 0, host: '127.0.0.1' })
  const { port } = app.server.address() as { port: number }
  return { app, url: `http://127.0.0.1:${port}` }
}

const OTHER_TABLES = ['runs', 'tasks', 'task_attempts', 'threads', 'messages', 'artifacts'] as const

async function rowCounts (): Promise<Record<string, number>> {
  const db = await writer()
  const counts: Record<string, number> = {}
  for (const table of OTHER_TABLES) {
    const row = await db.selectFrom(table).select((eb) => eb.fn.countAll<string>().as('n')).executeTakeFirstOrThrow()
    counts[table] = Number(row.n)
  }
  return counts
}

async function floor (): Promise<number> {
  const { rows: [row] } = await sql<{ floor: string }>`select history_floor::text as floor from event_log_state`.execute(await writer())
  return Number(row!.floor)
}

/** Waits until none of `ids` is left; returns how long after its created_at each went (database clock, seconds). */
async function secondsUntilGone (ids: number[], timeoutMs: number): Promise<number> {
  const db = await writer()
  const created = await db.selectFrom('events').select(sql<string>`(extract(epoch from max(created_at)))::float8`.as('at')).where('event_id', 'in', ids.map(String)).executeTakeFirstOrThrow()
  let goneAt = 0
  await waitUntil(async () => {
    const { rows: [row] } = await sql<{ left: number, now: number }>`select (select count(*) from events where event_id = any(${ids.map(String)}::bigint[]))::int as left, extract(epoch from now())::float8 as now`.execute(db)
    goneAt = row!.now
    return row!.left === 0
  }, `events ${ids.join(', ')} to be gone`, timeoutMs)
  return goneAt - Number(created.at)
}

t.before(() => insertGraph({
  runs: [makeRun({ run_id: 'run-r' })],
  tasks: [makeTask({ run_id: 'run-r', task_id: 'task-r', status: 'blocked', latest_attempt_no: 1 })],
  task_attempts: [makeAttempt({ run_id: 'run-r', task_id: 'task-r', thread_id: 'thread-r' })],
  threads: [makeThread({ run_id: 'run-r', task_id: 'task-r', thread_id: 'thread-r' })],
  messages: [makeMessage({ thread_id: 'thread-r', message_id: 'msg-r', kind: 'question' })],
  artifacts: [makeArtifact({ message_id: 'msg-r' })]
}))

t.test('EVENTS_RETENTION=10s: events go within 20 s of their created_at; cursors below the floor answer 410, at or above it 200', async (t) => {
  const { app, url } = await serve(t, { EVENTS_RETENTION: '10s' })
  const before = await rowCounts()
  const db = await writer()

  // Written 9 s ago (as if the service had been away): gone a second or two from now.
  const old = await db.insertInto('events').values([1, 2, 3].map((n) => ({ event_type: 'old', run_id: 'run-r', summary: `old ${n}`, created_at: sql`now() - interval '9 seconds'` as never })))
    .returning('event_id').execute()
  const oldIds = old.map((row) => Number(row.event_id))
  const oldAge = await secondsUntilGone(oldIds, 20_000)
  t.ok(oldAge <= 20, `gone ${oldAge.toFixed(1)} s after their created_at`)
  const expiredFloor = await floor()
  t.ok(expiredFloor >= Math.max(...oldIds), `the floor (${expiredFloor}) is the highest id dropped`)

  for (const [path, headers] of [
    ['/api/events/stream?after_event_id=0', {}],
    [`/api/events/stream?after_event_id=${expiredFloor - 1}&run_id=run-r`, {}],
    ['/api/events/stream?after_event_id=999999999', { 'last-event-id': String(expiredFloor - 1) }]
  ] as const) {
    const stream = await openStream(url, path, headers)
    t.equal(stream.status, 410, `${path} ${JSON.stringify(headers)}`)
    await stream.ended
    t.match(stream.headers['content-type'], /^application\/json/, 'before any byte of a stream')
    const body = JSON.parse(stream.body)
    t.equal(body.error.code, 'cursor_expired')
    t.match(body.error.message, /^(after_event_id|Last-Event-ID) \d+ is older than the event history kept .*refetch what you show, then resume from the X-Event-Cursor of that read$/)
  }
  const expired = await app.inject(`/api/events?after_event_id=${expiredFloor - 1}`)
  t.equal(expired.statusCode, 410)
  t.same(expired.json().error.code, 'cursor_expired')
  t.equal(expired.headers['cache-control'], 'no-store', 'an error is never cached (docs/reference.md, "HTTP caching")')
  t.equal((await app.inject('/api/events?after_event_id=0')).statusCode, 410, 'after_event_id=0 included')

  const [kept] = await insertEvents({ run_id: 'run-r', summary: 'kept' })
  const atFloor = await openStream(url, `/api/events/stream?after_event_id=${expiredFloor}`)
  t.teardown(atFloor.close)
  t.equal(atFloor.status, 200, 'a cursor at the floor streams')
  await atFloor.waitFor((s) => s.events().some((event) => event.event_id === kept))
  t.same(atFloor.events().map((event) => event.event_id), [kept])
  const page = await app.inject(`/api/events?after_event_id=${expiredFloor}`)
  t.equal(page.statusCode, 200)
  t.same(page.json().events.map((event: { event_id: number }) => event.event_id), [kept])
  const oldest = await app.inject('/api/events')
  t.same(oldest.json().events.map((event: { event_id: number }) => event.event_id), [kept], 'without a cursor: from the oldest event kept')
  t.ok(Number(oldest.headers['x-event-cursor']) >= kept!)
  const read = await app.inject('/api/runs/run-r')
  t.ok(Number(read.headers['x-event-cursor']) >= expiredFloor, 'a read\'s X-Event-Cursor is never below the floor: subscribing from it works')

  // Written now: gone within 20 s, as every event is.
  const keptAge = await secondsUntilGone([kept!], 22_000)
  t.ok(keptAge <= 20, `an event written now is gone ${keptAge.toFixed(1)} s after its created_at`)
  t.equal(await floor(), kept, 'the floor follows')
  t.equal((await app.inject(`/api/events?after_event_id=${expiredFloor}`)).statusCode, 410, 'and the old floor has expired in turn')

  t.same(await rowCounts(), before, 'runs, tasks, attempts, threads, messages and artifacts untouched')
  await waitUntil(() => app.events.keeper!.historyFloor === kept, 'the keeper to read the floor on its next tick')
  const metrics = (await app.inject('/metrics')).body
  t.equal(metricValue(metrics, 'event_log_keeper'), 1)
  t.equal(metricValue(metrics, 'event_history_floor'), kept)
  t.ok(metricValue(metrics, 'event_log_partitions_dropped_total') >= 2)
  t.ok(metricValue(metrics, 'event_log_partitions') >= 3)
  t.equal(metricValue(metrics, 'event_log_default_rows_deleted_total'), 0)

  await t.test('a second replica', async (t) => {
    const other = await build(t)
    await waitUntil(() => other.events.keeper!.historyFloor >= 0, 'the second replica to read the floor')
    const otherMetrics = (await other.inject('/metrics')).body
    t.equal(metricValue(otherMetrics, 'event_log_keeper'), 0, 'does not keep the log')
    t.equal(metricValue(otherMetrics, 'event_history_floor'), kept, 'but reports the floor')
    t.equal(metricValue(otherMetrics, 'event_log_partitions'), 0)
  })
})

t.test('a stream still catching up when the floor passes it ends; its reconnect gets the 410', {
  skip: needsServer('pages of several MB, to outgrow the socket\'s buffers: the embedded bridge truncates results that large')
}, async (t) => {
  // No window of recent events: the catch-up reads the table, page by page,
  // and meets the floor there (from the window, it might finish first).
  const { app, url } = await serve(t, { EVENTS_WINDOW_BYTES: 0 })
  const db = await writer()
  const big = 'x'.repeat(40_000)
  const start = Number((await db.selectFrom('events').select(sql<string>`coalesce(max(event_id), 0)`.as('id')).executeTakeFirstOrThrow()).id)
  const ids = (await db.insertInto('events').values(Array.from({ length: 600 }, () => ({ event_type: 'big', payload: json({ big }) }))).returning('event_id').execute())
    .map((row) => Number(row.event_id))
  const cursor = Math.max(start, await floor())
  await waitUntil(() => (app.events.hub.tail ?? 0) >= ids.at(-1)!, 'the poller to have seen them all: the stream catches up from the table')

  let text = ''
  const ended = new Promise<void>((resolve, reject) => {
    const req = httpRequest(`${url}/api/events/stream?after_event_id=${cursor}`, (res) => {
      res.pause() // a client that does not read: the catch-up waits for it to drain
      res.setEncoding('utf8')
      res.on('data', (chunk: string) => { text += chunk })
      res.on('end', resolve)
      void waitUntil(() => app.events.streams.bufferedBytes > 0, 'the catch-up to wait for the client').then(async () => {
        await sql`update event_log_state set history_floor = ${ids.at(-1)!}`.execute(db)
        res.resume()
      }, reject)
    })
    req.on('error', reject)
    req.end()
  })
  await ended
  const received = [...text.matchAll(/^id: (\d+)$/gm)].map((match) => Number(match[1]))
  t.ok(received.length > 0 && received.length < ids.length, `the stream ended after ${received.length} of ${ids.length} events`)
  const again = await openStream(url, '/api/events/stream', { 'last-event-id': String(received.at(-1)) })
  t.equal(again.status, 410)
  await sql`update event_log_state set history_floor = 0`.execute(db)
})

t.test('the keeper\'s passes: a failure is logged once, the next tick tries again, and recovery is said', async (t) => {
  const lines: Array<[string, string]> = []
  const at = (level: string) => (first: unknown, second?: string) => { lines.push([level, typeof first === 'string' ? first : second!]) }
  const log = { info: at('info'), warn: at('warn'), debug: at('debug') } as unknown as FastifyBaseLogger
  const keeper = new EventLogKeeper({ url: await testDatabaseUrl(), keeperIntervalMs: 50, retentionMs: undefined, log })
  const keep = keeper.partitions.keep.bind(keeper.partitions)
  let failures = 3
  keeper.partitions.keep = async (client) => {
    if (failures-- > 0) throw new Error('the pass failed')
    await keep(client)
  }
  keeper.start()
  await waitUntil(() => keeper.passes > 0, 'a pass to succeed')
  await keeper.passEnded()
  await keeper.stop()
  t.same(lines.filter(([, message]) => /partitions/.test(message)), [
    ['info', 'this replica keeps the event log (its settled position, partitions)'],
    ['warn', 'event log partitions: a pass failed; retrying on the next tick'],
    ['info', 'event log partitions: keeper recovered']
  ])
  t.ok(PARTITION_LOCK_TIMEOUT_MS <= 500, 'a short lock timeout')
})

t.test('retention beside the keeper at the tests\' interval: no false epoch, a floor that only rises, and streams that never end', async (t) => {
  // The partition pass ticked beside the keeper once: two ticks at once took each other's census for a sequence
  // moved back, 1 to 3 times a minute at a 100 ms keeper interval, each ending every stream and resetting the floor to 0.
  const { app, url } = await serve(t, { EVENTS_RETENTION: '4s', EVENTS_KEEPER_INTERVAL_MS: 100 })
  const db = await writer()
  const epochAtStart = Number((await sql<{ epoch: number }>`select epoch from event_log_state`.execute(db)).rows[0]!.epoch)
  const start = Number((await db.selectFrom('events').select(sql<string>`coalesce(max(event_id), 0)`.as('id')).executeTakeFirstOrThrow()).id)
  const stream = await openStream(url, `/api/events/stream?after_event_id=${Math.max(start, await floor())}&run_id=run-r`)
  t.teardown(stream.close)
  const samples: Array<{ epoch: number, floor: number }> = []
  const written: number[] = []
  const until = Date.now() + 12_000
  while (Date.now() < until) {
    written.push(...await insertEvents({ run_id: 'run-r', summary: 'beside the keeper' }))
    const { rows: [row] } = await sql<{ epoch: number, floor: string }>`select epoch, history_floor::text as floor from event_log_state`.execute(db)
    samples.push({ epoch: row!.epoch, floor: Number(row!.floor) })
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  await stream.waitFor((s) => s.events().some((event) => event.event_id === written.at(-1)))
  t.ok(app.events.keeper!.passes > 20, `the passes ran beside the ticks (${app.events.keeper!.passes} passes, ${app.events.keeper!.ticks} ticks)`)
  t.ok(samples.at(-1)!.floor > Math.max(start, samples[0]!.floor), `retention dropped partitions meanwhile (floor ${samples[0]!.floor} to ${samples.at(-1)!.floor})`)
  t.same([...new Set(samples.map((sample) => sample.epoch))], [epochAtStart], 'no new epoch')
  t.ok(samples.every((sample, i) => i === 0 || sample.floor >= samples[i - 1]!.floor), 'the floor never went down')
  let ended = false
  void stream.ended.then(() => { ended = true })
  await new Promise((resolve) => setTimeout(resolve, 100))
  t.notOk(ended, 'the stream never ended')
  t.same(stream.events().map((event) => event.event_id), written, 'and got every event, once, in order')
})
