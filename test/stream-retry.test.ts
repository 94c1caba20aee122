import { EventSource, type FetchLike } from 'eventsource'
import type { FastifyInstance } from 'fastify'
import { existsSync } from 'node:fs'
import pg from 'pg'
import { chromium } from 'playwright-core'
import t, { type Test } from 'tap'
import { migrateToLatest } from '../db/migrate.ts'
import { build, holdClose, keptAliveConnection, type RawAnswer } from './helpers/app.ts'
import { ownCluster } from './helpers/cluster.ts'
import { insertEvents } from './helpers/sse.ts'
import { sleep, waitUntil } from './helpers/wait.ts'

// A stream refused for a transient reason (the database down, the stream
// limit, a shutdown) is a 200 event stream with a `retry:`, so that a real
// EventSource (the `eventsource` package, and Chromium's) keeps retrying
// instead of closing for good, and resumes from its Last-Event-ID with
// nothing lost or repeated (docs/reference.md, "The event stream").

const CHROMIUM = process.env.CHROMIUM_BIN ?? '/usr/bin/chromium'
const RETRY_MS = 100

async function listen (app: FastifyInstance): Promise<string> {
  await app.listen({ port: 0, host: '127.0.0.1' })
  return `http://127.0.0.1:${(app.server.address() as { port: number }).port}`
}

/** An EventSource that records the ids it receives, the answers it got, and never closes by itself unnoticed. */
function subscribe (t: Test, url: string, fetch?: FetchLike) {
  const ids: number[] = []
  const source = new EventSource(url, fetch === undefined ? {} : { fetch })
  source.onmessage = (message) => { ids.push(JSON.parse(message.data).event_id) }
  t.teardown(() => source.close())
  return { source, ids }
}

function assertRetryAnswer (t: Test, res: RawAnswer | { statusCode: number, headers: Record<string, unknown>, body: string }, retryMs: number, why: RegExp) {
  t.equal(res.statusCode, 200)
  t.match(res.headers['content-type'], /^text\/event-stream/)
  t.equal(res.headers['cache-control'], 'no-cache')
  t.match(res.body, new RegExp(`^retry: ${retryMs}\\n: unavailable: ${why.source}[^\\n]*\\n\\n$`))
}

t.test('the refusal on the wire: the stream limit, the database down, shutting down; JSON endpoints keep their 503', async (t) => {
  const limited = await build(t, { SSE_MAX_STREAMS: 0, SSE_RETRY_MS: RETRY_MS })
  assertRetryAnswer(t, await limited.inject('/api/events/stream'), RETRY_MS, /this instance already serves 0 event streams/)

  const down = await build(t, { DATABASE_URL: 'postgres://postgres@127.0.0.1:1/none', DB_CONNECT_TIMEOUT_MS: 300, SSE_RETRY_MS: RETRY_MS })
  assertRetryAnswer(t, await down.inject('/api/events/stream?after_event_id=0'), RETRY_MS, /the database is unavailable/)
  t.equal((await down.inject('/api/events')).statusCode, 503, 'the JSON endpoint answers 503')
  t.equal((await down.inject('/api/events/stream?after_event_id=x')).statusCode, 400, 'what retrying cannot fix stays a 400')
  t.equal(down.events.streams.size, 0)

  // A connection kept alive from before the shutdown, on which a request arrives while it closes.
  const closing = await build(t, { SSE_RETRY_MS: RETRY_MS })
  const kept = await keptAliveConnection(await listen(closing))
  const hold = holdClose(closing)
  const closed = closing.close()
  await hold.entered
  const stream = await kept.late('/api/events/stream')
  assertRetryAnswer(t, stream, RETRY_MS, /the service is shutting down/)
  t.equal(stream.headers.connection, 'close', 'and the connection closes, so the client goes elsewhere')
  hold.release()
  await closed
})

t.test('at the stream limit, an EventSource waits its turn and misses nothing', async (t) => {
  const app = await build(t, { SSE_MAX_STREAMS: 1, SSE_RETRY_MS: RETRY_MS, EVENTS_POLL_INTERVAL_MS: 20 })
  const base = await listen(app)
  const [start] = await insertEvents({ event_type: 'start' })
  const first = subscribe(t, `${base}/api/events/stream?after_event_id=${start}`)
  await waitUntil(() => app.events.streams.size === 1, 'the first stream')
  const answers: number[] = []
  const second = subscribe(t, `${base}/api/events/stream?after_event_id=${start}`, async (url, init) => {
    const res = await fetch(url, init)
    answers.push(res.status)
    return res
  })
  const written = await insertEvents({ event_type: 'a' }, { event_type: 'b' })
  await waitUntil(() => first.ids.length === 2 && answers.length >= 3, 'the first stream served, the second refused a few times')
  t.equal(second.source.readyState, EventSource.CONNECTING, 'the refused EventSource keeps retrying')
  t.same(second.ids, [])
  t.ok(answers.every((status) => status === 200), 'every refusal is a 200')
  first.source.close()
  written.push(...await insertEvents({ event_type: 'c' }))
  await waitUntil(() => second.ids.length === 3, 'the second stream, served once a slot is free')
  t.same(second.ids, written, 'every event once, in order')
  t.same(first.ids, written.slice(0, 2))
})

t.test('a database outage: EventSources that (re)connect while it is down resume from Last-Event-ID once it is back', async (t) => {
  const cluster = await ownCluster(t)
  await migrateToLatest(cluster.url)
  // No window of recent events: a stream resuming from the head needs no table, and one from further back always reads it.
  const config = { DATABASE_URL: cluster.url, DB_CONNECT_TIMEOUT_MS: 500, SSE_RETRY_MS: RETRY_MS, EVENTS_POLL_INTERVAL_MS: 20, EVENTS_WINDOW_BYTES: 0 }
  const replicaA = await build(t, config)
  const replicaB = await build(t, config)
  const [urlA, urlB] = [await listen(replicaA), await listen(replicaB)]
  const writeEvents = async (count: number) => {
    const client = new pg.Client({ connectionString: cluster.url })
    await client.connect()
    const ids: number[] = []
    for (let i = 0; i < count; i++) ids.push(Number((await client.query("insert into events (event_type) values ('e') returning event_id")).rows[0].event_id))
    await client.end()
    return ids
  }

  // A load balancer of sorts: A while it listens, else B.
  let aListens = true
  const seen: string[] = []
  const balanced: FetchLike = async (url, init) => {
    const res = await fetch(String(url).replace(urlA, aListens ? urlA : urlB), init)
    seen.push(`${aListens ? 'A' : 'B'} ${res.status} ${init?.headers?.['Last-Event-ID' as keyof typeof init.headers] ?? ''}`)
    return res
  }
  const resumed = subscribe(t, `${urlA}/api/events/stream?after_event_id=0`, balanced)
  const before = await writeEvents(3)
  await waitUntil(() => resumed.ids.length === 3 && (replicaB.events.hub.tail ?? 0) >= before.at(-1)!, 'the events before the outage')

  cluster.stop()
  // While the database is down: A goes away (its stream ends, its client reconnects to B), and a new client connects.
  aListens = false
  await replicaA.close()
  const latecomer = subscribe(t, `${urlB}/api/events/stream?after_event_id=0`)
  await waitUntil(() => seen.some((answer) => answer.startsWith('B 200')) && resumed.source.readyState === EventSource.OPEN, 'resumed on B')
  // Time for the latecomer, which started with it, to be refused and retry: it must still be trying.
  await sleep(500)
  t.equal(resumed.source.readyState, EventSource.OPEN, 'the resumed EventSource, at B\'s head, is served without the database: it missed nothing')
  t.equal(latecomer.source.readyState, EventSource.CONNECTING, 'the latecomer needs the table: refused with a retry, it is still trying')
  t.same(latecomer.ids, [])

  cluster.start()
  const after = await writeEvents(2)
  await waitUntil(() => resumed.ids.length === 5 && latecomer.ids.length === 5, 'both streams after the outage', 60_000)
  t.same(resumed.ids, [...before, ...after], 'resumed from its Last-Event-ID: nothing lost or repeated')
  t.same(latecomer.ids, [...before, ...after], 'the latecomer: from its after_event_id, likewise')
  t.match(seen.at(-1), new RegExp(`^B 200 ${before.at(-1)}$`), 'the reconnect carried the Last-Event-ID')
})

t.test('shutdown: a reconnect refused by the closing replica is retried and resumes on another', async (t) => {
  const config = { SSE_RETRY_MS: RETRY_MS, EVENTS_POLL_INTERVAL_MS: 20 }
  const closing = await build(t, config)
  const other = await build(t, config)
  const [urlClosing, urlOther] = [await listen(closing), await listen(other)]
  // The balancer sends to the closing replica, on a connection kept alive from before, until it refused once; then to the other.
  let state: 'up' | 'closing' | 'gone' = 'up'
  let kept: Awaited<ReturnType<typeof keptAliveConnection>> | undefined // eslint-disable-line prefer-const -- set below, once the events before the shutdown are in
  const answers: string[] = []
  const balanced: FetchLike = async (url, init) => {
    if (state === 'closing') {
      state = 'gone'
      const res = await kept!.late(String(url).slice(urlClosing.length), init?.headers as Record<string, string>)
      answers.push(`closing ${res.statusCode} ${res.headers['content-type']}`)
      return new Response(res.body, { status: res.statusCode, headers: res.headers })
    }
    answers.push(state === 'up' ? 'up' : 'other')
    return await fetch(state === 'up' ? url : String(url).replace(urlClosing, urlOther), init)
  }
  const [start] = await insertEvents({ event_type: 'start' })
  const client = subscribe(t, `${urlClosing}/api/events/stream?after_event_id=${start}`, balanced)
  const before = await insertEvents({ event_type: 'a' }, { event_type: 'b' })
  await waitUntil(() => client.ids.length === 2, 'the events before the shutdown')

  kept = await keptAliveConnection(urlClosing)
  const hold = holdClose(closing)
  const closed = closing.close()
  await hold.entered
  state = 'closing'
  // The stream ends while the replica closes (here, before the close ends it): its client reconnects, to the closing replica first.
  closing.events.streams.endAll()
  const during = await insertEvents({ event_type: 'c' })
  await waitUntil(() => client.ids.length === 3, 'the stream resumed on the other replica')
  t.same(answers, ['up', 'closing 200 text/event-stream', 'other'], 'refused by the closing replica with a retry, then served by the other')
  t.same(client.ids, [...before, ...during], 'nothing lost or repeated')
  hold.release()
  await closed
})

t.test('Chromium\'s EventSource keeps retrying a refused stream, and resumes', async (t) => {
  if (!existsSync(CHROMIUM)) throw new Error(`chromium not found at ${CHROMIUM}: apt-get install chromium (or set CHROMIUM_BIN)`)
  const app = await build(t, { SSE_MAX_STREAMS: 1, SSE_RETRY_MS: RETRY_MS, EVENTS_POLL_INTERVAL_MS: 20 })
  const base = await listen(app)
  const [start] = await insertEvents({ event_type: 'start' })
  const holder = subscribe(t, `${base}/api/events/stream`)
  await waitUntil(() => app.events.streams.size === 1, 'the one slot taken')

  const browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--headless', '--no-sandbox', '--disable-gpu'] })
  t.teardown(() => browser.close())
  const page = await browser.newPage()
  // Same origin as the stream, under a page's policy (connect-src 'self'): an API answer's forbids a document everything.
  await page.goto(`${base}/ui/style.css`)
  await page.evaluate((url) => {
    const page = globalThis as unknown as { ids: number[], errors: number, source: EventSource }
    page.ids = []
    page.errors = 0
    page.source = new EventSource(url)
    page.source.onmessage = (message) => { page.ids.push(JSON.parse(message.data).event_id) }
    page.source.onerror = () => { page.errors++ }
  }, `/api/events/stream?after_event_id=${start}`)
  const written = await insertEvents({ event_type: 'a' })
  await page.waitForFunction(() => (globalThis as unknown as { errors: number }).errors >= 3)
  t.equal(await page.evaluate(() => (globalThis as unknown as { source: EventSource }).source.readyState), 0, 'CONNECTING, never CLOSED')
  holder.source.close()
  written.push(...await insertEvents({ event_type: 'b' }))
  await page.waitForFunction((count) => (globalThis as unknown as { ids: number[] }).ids.length >= count, written.length)
  await sleep(200)
  t.same(await page.evaluate(() => (globalThis as unknown as { ids: number[] }).ids), written, 'every event once, in order')
})
