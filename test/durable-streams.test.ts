import { stream, type JsonBatch } from '@durable-streams/client'
import type { FastifyInstance } from 'fastify'
import pg from 'pg'
import t, { type Test } from 'tap'
import type { Config } from '../config.ts'
import { PENDING_WAIT_MS } from '../events/durable/reads.ts'
import { ANSWERS_PER_CLOCK_LOOK } from '../events/hub.ts'
import { CATCH_UP_PAGE_SIZE } from '../events/reader.ts'
import { encodeOffset } from '../events/durable/offsets.ts'
import { Waiter } from '../events/durable/waiter.ts'
import type { StoredEvent } from '../events/statements.ts'
import { serve as serveApp } from './helpers/app.ts'
import { needsServer, testDatabaseUrl } from './helpers/database.ts'
import { sql } from 'kysely'
import { insertGraph, lockTable, makeAttempt, makeRun, makeTask, makeThread, writer } from './helpers/fixtures.ts'
import { insertEvents, makeEvent } from './helpers/sse.ts'
import { LONG_WAIT_MS, PROMPTLY_MS, sleep, waitUntil } from './helpers/wait.ts'

// The event log under the Durable Streams protocol (docs/reference.md, "Durable Streams"),
// read with the official client (@durable-streams/client) and raw HTTP.

interface Envelope { event_id: number, run_id: string, thread_id: string }

/** This file's application, listening. */
const serve = (t: Test, overrides: Partial<Config> = {}) => serveApp(t, { EVENTS_POLL_INTERVAL_MS: 20, DURABLE_STREAMS_LONG_POLL_MS: 1000, ...overrides })

const ids = (events: Envelope[]) => events.map((event) => event.event_id)

t.before(async () => {
  await insertGraph({
    runs: [makeRun({ run_id: 'ds-a' }), makeRun({ run_id: 'ds-b' })],
    tasks: [makeTask({ run_id: 'ds-a', task_id: 'ds-task' })],
    task_attempts: [makeAttempt({ run_id: 'ds-a', task_id: 'ds-task', thread_id: 'ds-thread' })],
    threads: [makeThread({ run_id: 'ds-a', task_id: 'ds-task', thread_id: 'ds-thread' })]
  })
})

t.test('catch-up: a JSON array of envelopes, its offsets, an ETag and 304, the cache-control of section 9', async (t) => {
  const { url } = await serve(t)
  const written = await insertEvents({ run_id: 'ds-a' }, { run_id: 'ds-b' }, { run_id: 'ds-a' })
  const first = await fetch(`${url}/api/streams/runs/ds-a?offset=${encodeOffset(written[0]! - 1)}`)
  t.equal(first.status, 200)
  t.equal(first.headers.get('content-type'), 'application/json', 'exactly the protocol\'s type, no parameter')
  t.equal(first.headers.get('cross-origin-resource-policy'), 'cross-origin')
  t.equal(first.headers.get('cache-control'), 'public, max-age=60, stale-while-revalidate=300')
  t.equal(first.headers.get('stream-up-to-date'), 'true')
  const body = await first.json() as Envelope[]
  t.same(ids(body), [written[0], written[2]])
  const next = first.headers.get('stream-next-offset')!
  t.match(next, /^[0-9a-z]{11}$/)
  t.ok(next >= encodeOffset(written[2]!), 'the next offset is at or past the last event')
  const tag = first.headers.get('etag')!
  const again = await fetch(`${url}/api/streams/runs/ds-a?offset=${encodeOffset(written[0]! - 1)}`, { headers: { 'if-none-match': tag } })
  t.equal(again.status, 304, 'a repeated catch-up is 304')
  const rest = await fetch(`${url}/api/streams/runs/ds-a?offset=${next}`)
  t.same(await rest.json(), [], 'nothing after the next offset')
  t.equal(rest.headers.get('stream-next-offset'), next)
})

/** Reads a stream live with the official client until `done`, then cancels it; returns the envelopes and the last offset. */
async function readLive (t: Test, streamUrl: string, live: 'long-poll' | 'sse', offset: string, done: (got: Envelope[]) => boolean, headers: Record<string, string> = {}) {
  const response = await stream<Envelope>({ url: streamUrl, offset, live, headers, warnOnHttp: false })
  const got: Envelope[] = []
  let last = offset
  const unsubscribe = response.subscribeJson((batch: JsonBatch<Envelope>) => {
    got.push(...batch.items)
    last = batch.offset
  })
  t.teardown(() => { unsubscribe(); response.cancel() })
  return {
    got,
    offset: () => last,
    until: async (what: string) => { await waitUntil(() => done(got), what, 10_000) },
    stop: () => { unsubscribe(); response.cancel() }
  }
}

t.test('the client: a catch-up longer than one page arrives whole, ascending', async (t) => {
  const { url } = await serve(t)
  const run = 'ds-long'
  await insertGraph({ runs: [makeRun({ run_id: run })] })
  const written = await insertEvents(...Array.from({ length: CATCH_UP_PAGE_SIZE * 2 + 7 }, () => ({ run_id: run })))
  await insertEvents({ run_id: 'ds-b' })
  // The log settles at most 64 ids past the clock, and the clock waits for the cluster's oldest transaction
  // (another test file's, here): wait until all of them are settled, then catch up from the start.
  const last = encodeOffset(written.at(-1)!)
  await waitUntil(async () => (await fetch(`${url}/api/streams/runs/${run}?offset=now`)).headers.get('stream-next-offset')! >= last, 'the events settled', 60_000)
  // live: false reads one response only (the client's choice); json() in a live mode reads until up to date.
  const response = await stream<Envelope>({ url: `${url}/api/streams/runs/${run}`, offset: '-1', live: 'long-poll', warnOnHttp: false })
  const all = await response.json()
  t.same(ids(all), written, `all ${written.length} events, in order, none of another run`)
  t.equal(response.upToDate, true)
})

for (const live of ['long-poll', 'sse'] as const) {
  t.test(`the client, live=${live}: a run's new events once each, ascending, none of another run; resuming from a saved offset misses nothing`, async (t) => {
    const { url } = await serve(t)
    const streamUrl = `${url}/api/streams/runs/ds-a`
    const tail = (await fetch(`${streamUrl}?offset=now`)).headers.get('stream-next-offset')!
    const written: number[] = []
    const reader = await readLive(t, streamUrl, live, tail, (got) => got.length >= 3)
    for (let i = 0; i < 3; i++) {
      written.push(...await insertEvents({ run_id: 'ds-a' }, { run_id: 'ds-b' }))
      await sleep(30)
    }
    await reader.until('three events')
    const ofA = written.filter((_, i) => i % 2 === 0)
    t.same(ids(reader.got), ofA, 'each event of the run once, ascending, none of the other run')
    t.ok(reader.got.every((event) => event.run_id === 'ds-a'))
    const saved = reader.offset()
    reader.stop()

    const missed = await insertEvents({ run_id: 'ds-a' }, { run_id: 'ds-a' })
    const resumed = await readLive(t, streamUrl, live, saved, (got) => got.length >= 3)
    missed.push(...await insertEvents({ run_id: 'ds-a' }))
    await resumed.until('the missed events and one more')
    t.same(ids(resumed.got), missed, 'resumed from the saved offset: nothing missed, nothing repeated')
    resumed.stop()
  })
}

t.test('the client: 8 writers committing out of order lose and duplicate nothing', async (t) => {
  const { url } = await serve(t)
  const run = 'ds-writers'
  await insertGraph({ runs: [makeRun({ run_id: run })] })
  const tail = (await fetch(`${url}/api/streams/runs/${run}?offset=now`)).headers.get('stream-next-offset')!
  const total = 8 * 5
  const poller = await readLive(t, `${url}/api/streams/runs/${run}`, 'long-poll', tail, (got) => got.length >= total)
  const sse = await readLive(t, `${url}/api/streams/runs/${run}`, 'sse', tail, (got) => got.length >= total)
  const db = await writer()
  // Each writer draws its ids, then holds its transaction open a random while: commits land out of id order.
  await Promise.all(Array.from({ length: 8 }, async () => {
    for (let i = 0; i < 5; i++) {
      await db.transaction().execute(async (trx) => {
        await trx.insertInto('events').values(makeEvent({ run_id: run })).execute()
        await sleep(Math.random() * 40)
      })
    }
  }))
  await poller.until('every event by long-poll')
  await sse.until('every event by SSE')
  const committed = (await db.selectFrom('events').select('event_id').where('run_id', '=', run).orderBy('event_id').execute()).map((row) => Number(row.event_id))
  t.equal(committed.length, total)
  t.same(ids(poller.got), committed, 'long-poll: every event once, ascending')
  t.same(ids(sse.got), committed, 'SSE: every event once, ascending')
})

t.test('retention: an offset below the floor is 410 cursor_expired; -1 then starts at the oldest kept', async (t) => {
  const { app, url } = await serve(t, { EVENTS_WINDOW_BYTES: 0, DURABLE_STREAMS_SSE_MAX_MS: 1000 })
  const run = 'ds-floor'
  await insertGraph({ runs: [makeRun({ run_id: run })] })
  const written = await insertEvents(...Array.from({ length: 4 }, () => ({ run_id: run })))
  // The hub has read them: an SSE read from -1 then meets the rows below the floor.
  await waitUntil(() => (app.events.hub.tail ?? 0) >= written.at(-1)!, 'the hub to read the events')
  const db = await writer()
  await sql`update event_log_state set history_floor = ${written[1]!}`.execute(db)
  t.teardown(async () => { await sql`update event_log_state set history_floor = 0`.execute(db) })
  for (const live of ['', '&live=long-poll', '&live=sse']) {
    const gone = await fetch(`${url}/api/streams/runs/${run}?offset=${encodeOffset(written[0]!)}${live}`)
    t.equal(gone.status, 410, `410${live}`)
    t.match(await gone.json(), { error: { code: 'cursor_expired', message: /offset=-1/ } })
  }
  const response = await stream<Envelope>({ url: `${url}/api/streams/runs/${run}`, offset: '-1', live: false, warnOnHttp: false })
  t.same(ids(await response.json()), written.slice(2), '-1: from the oldest event kept')
  const sse = await readLive(t, `${url}/api/streams/runs/${run}`, 'sse', '-1', (got) => got.length >= 2)
  await sse.until('the events kept, by SSE from -1')
  t.same(ids(sse.got), written.slice(2))
  // The client catches up before it opens SSE; raw, SSE itself starts at -1.
  const raw = await (await fetch(`${url}/api/streams/runs/${run}?offset=-1&live=sse`)).text()
  t.same([...raw.matchAll(/^event: data\ndata:(.*)$/gm)].flatMap((match) => ids(JSON.parse(match[1]!) as Envelope[])), written.slice(2), 'raw SSE from -1: the events kept')
  const empty = await (await fetch(`${url}/api/streams/events?offset=-1&live=sse`)).text()
  t.match(empty, /event: control/, 'every event, from -1, over rows at or below the floor that linger')
  // A run all above the floor: SSE from -1 starts with the rows it read.
  await insertGraph({ runs: [makeRun({ run_id: 'ds-above' })] })
  const above = await insertEvents({ run_id: 'ds-above' }, { run_id: 'ds-above' })
  await waitUntil(() => (app.events.hub.tail ?? 0) >= above.at(-1)!, 'the hub to read them')
  const fresh = await (await fetch(`${url}/api/streams/runs/ds-above?offset=-1&live=sse`)).text()
  t.same([...fresh.matchAll(/^event: data\ndata:(.*)$/gm)].flatMap((match) => ids(JSON.parse(match[1]!) as Envelope[])), above, 'raw SSE from -1, no row below the floor')
  // A long-poll behind the hub's tail answers from its own catch-up at once.
  const behind = await fetch(`${url}/api/streams/runs/ds-above?offset=${encodeOffset(above[0]!)}&live=long-poll`)
  t.equal(behind.status, 200)
  t.same(ids(await behind.json() as Envelope[]), above.slice(1), 'a long-poll behind the tail: its catch-up')
})

t.test('tokens through the client\'s headers; the protocol\'s headers readable from another origin', async (t) => {
  const { url } = await serve(t, { API_TOKENS: 'secret-ds', CORS_ORIGINS: 'https://ui.example' })
  const streamUrl = `${url}/api/streams/runs/ds-a`
  const refused = await fetch(`${streamUrl}?offset=-1`)
  t.equal(refused.status, 401)
  const response = await stream<Envelope>({ url: streamUrl, offset: '-1', live: false, headers: { authorization: 'Bearer secret-ds' }, warnOnHttp: false })
  t.ok(Array.isArray(await response.json()), 'the client reads with its token')
  const page = await fetch(`${streamUrl}?offset=-1`, { headers: { authorization: 'Bearer secret-ds', origin: 'https://ui.example' } })
  t.equal(page.headers.get('cache-control'), 'private, max-age=60, stale-while-revalidate=300', 'never public with tokens')
  t.equal(page.headers.get('access-control-allow-origin'), 'https://ui.example')
  const exposed = page.headers.get('access-control-expose-headers')!.toLowerCase()
  for (const name of ['stream-next-offset', 'stream-up-to-date', 'stream-cursor', 'stream-closed', 'etag']) t.ok(exposed.includes(name), `${name} is exposed`)
})

t.test('raw: offset=now, an idle long-poll\'s 204, the interval cursor, HEAD', async (t) => {
  const { app, url } = await serve(t, { DURABLE_STREAMS_LONG_POLL_MS: 1000 })
  const streamUrl = `${url}/api/streams/runs/ds-a`
  const now = await fetch(`${streamUrl}?offset=now`)
  t.equal(now.status, 200)
  t.same(await now.json(), [])
  t.equal(now.headers.get('cache-control'), 'no-store')
  t.equal(now.headers.get('stream-up-to-date'), 'true')
  t.notOk(now.headers.get('etag'), 'no ETag for offset=now')
  const tail = now.headers.get('stream-next-offset')!
  t.equal(tail, encodeOffset(app.events.hub.tail!))

  const idle = await fetch(`${streamUrl}?offset=${tail}&live=long-poll`)
  t.equal(idle.status, 204)
  t.equal(idle.headers.get('stream-next-offset'), tail)
  t.equal(idle.headers.get('stream-up-to-date'), 'true')
  t.equal(idle.headers.get('cache-control'), 'no-store', 'a 204 is never cached')
  const cursor = Number(idle.headers.get('stream-cursor'))
  t.ok(cursor > 0)
  const echoed = await fetch(`${streamUrl}?offset=now&live=long-poll&cursor=${cursor}`)
  t.equal(echoed.status, 204, 'offset=now long-polls at once')
  t.ok(Number(echoed.headers.get('stream-cursor')) > cursor, 'a cursor echoed within its interval comes back greater')
  const old = await fetch(`${streamUrl}?offset=now&live=long-poll&cursor=1`)
  const current = Number(old.headers.get('stream-cursor'))
  t.ok(current >= cursor && current <= cursor + 1, 'an old cursor: the current interval (the next one, if it began meanwhile)')

  const waiting = fetch(`${streamUrl}?offset=${tail}&live=long-poll`)
  await sleep(50)
  const [written] = await insertEvents({ run_id: 'ds-a' })
  const woken = await waiting
  t.equal(woken.status, 200)
  t.same(ids(await woken.json() as Envelope[]), [written])
  t.equal(woken.headers.get('cache-control'), 'public, max-age=60, stale-while-revalidate=300', 'a 200 is cacheable by its URL')
  t.ok(woken.headers.get('etag'))
  t.ok(woken.headers.get('stream-cursor'))

  const head = await fetch(streamUrl, { method: 'HEAD' })
  t.equal(head.status, 200)
  t.equal(head.headers.get('cache-control'), 'no-store')
  t.ok(head.headers.get('stream-next-offset')! >= encodeOffset(written!))
  t.equal((await fetch(`${url}/api/streams/runs/nope`, { method: 'HEAD' })).status, 404)
  t.equal((await fetch(`${url}/api/streams/events`, { method: 'HEAD' })).status, 200)
})

t.test('raw: SSE control events; the server ends the stream after DURABLE_STREAMS_SSE_MAX_MS', async (t) => {
  const { url } = await serve(t, { DURABLE_STREAMS_SSE_MAX_MS: 4000 })
  const streamUrl = `${url}/api/streams/threads/ds-thread`
  const before = await insertEvents({ run_id: 'ds-a', thread_id: 'ds-thread' })
  const response = await fetch(`${streamUrl}?offset=${encodeOffset(before[0]! - 1)}&live=sse`)
  t.equal(response.status, 200)
  t.equal(response.headers.get('content-type'), 'text/event-stream')
  const reader = response.body!.pipeThrough(new TextDecoderStream()).getReader()
  let text = ''
  // The catch-up's control first: an event committed before the catch-up read would be in its batch, not live.
  while (!text.includes('event: control')) {
    const chunk = await reader.read()
    if (chunk.done) break
    text += chunk.value
  }
  const [live] = await insertEvents({ run_id: 'ds-a', thread_id: 'ds-thread' }, { run_id: 'ds-a', thread_id: 'other' })
  for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) text += chunk.value
  const events = [...text.matchAll(/^event: (\w+)\ndata:(.*)$/gm)].map((match) => ({ type: match[1], data: JSON.parse(match[2]!) as unknown }))
  t.same(events.filter((event) => event.type === 'data').map((event) => ids(event.data as Envelope[])), [[before[0]], [live]], 'the catch-up, then each live event of the thread, none of another')
  const controls = events.filter((event) => event.type === 'control').map((event) => event.data as { streamNextOffset: string, streamCursor: string, upToDate: boolean })
  t.same(events.slice(0, 2).map((event) => event.type), ['data', 'control'], 'the catch-up\'s data first, then its control')
  t.match(controls[0], { upToDate: true }, 'one control after the catch-up, up to date: it was the last page')
  t.ok(controls[0]!.streamNextOffset >= encodeOffset(before[0]!))
  t.same(controls.map((control) => control.streamNextOffset), [...new Set(controls.map((control) => control.streamNextOffset))].sort(), 'no two controls name the same offset; they ascend')
  t.ok(controls.every((control) => /^[0-9a-z]{11}$/.test(control.streamNextOffset) && /^\d+$/.test(control.streamCursor)))
  t.ok(controls.some((control) => control.upToDate && control.streamNextOffset === encodeOffset(live!)), 'live: upToDate with the event\'s offset')
  t.ok(text.startsWith('retry: '), 'retry: first, as on the event stream')
})

t.test('bad input: a clear envelope, never a 500; writes are 405', async (t) => {
  const { url } = await serve(t)
  const cases: Array<[string, number, string]> = [
    ['/api/streams/events?offset=xyz', 400, 'bad_request'],
    ['/api/streams/events?offset=zzzzzzzzzzz', 400, 'bad_request'],
    ['/api/streams/events?offset=-2', 400, 'bad_request'],
    ['/api/streams/events?live=poll', 400, 'bad_request'],
    ['/api/streams/events?offset=now&live=long-poll&cursor=abc', 400, 'bad_request'],
    ['/api/streams/runs/no-such-run', 404, 'not_found'],
    ['/api/streams/threads/no-such-thread?offset=-1&live=sse', 404, 'not_found'],
    ['/api/streams/events?live=long-poll', 400, 'bad_request'],
    ['/api/streams/events?live=sse', 400, 'bad_request'],
    [`/api/streams/runs/${'x'.repeat(10_000)}`, 404, 'not_found'],
    ['/api/streams/runs/%00', 400, 'bad_request'],
    ['/api/streams/threads/%F0%9F%98%80%2F..', 404, 'not_found']
  ]
  for (const [path, status, code] of cases) {
    const response = await fetch(`${url}${path}`)
    t.equal(response.status, status, path.slice(0, 80))
    t.match(await response.json(), { error: { code } })
  }
  const bodies: Array<[string, string | undefined, string | undefined]> = [
    ['a JSON array', '[]', 'application/json'], ['no body', undefined, undefined], ['invalid JSON', '{"a":', 'application/json'],
    ['an empty body', '', 'application/json'], ['bytes', '\u0000\u0001binary', 'application/octet-stream'], ['text', 'hello', 'text/plain']
  ]
  for (const method of ['POST', 'PUT', 'PATCH', 'DELETE']) {
    for (const [what, body, type] of bodies) {
      const response = await fetch(`${url}/api/streams/runs/ds-a`, { method, body, headers: type === undefined ? {} : { 'content-type': type } })
      t.equal(response.status, 405, `${method} with ${what}`)
      t.equal(response.headers.get('allow'), 'GET, HEAD')
      t.match(await response.json(), { error: { code: 'method_not_allowed' } })
    }
  }
})

t.test('up to date means up to date: a burst of one transaction is whole in the next read, in every mode', async (t) => {
  const { app, url } = await serve(t, { DURABLE_STREAMS_LONG_POLL_MS: 1000, DURABLE_STREAMS_SSE_MAX_MS: 800 })
  const run = 'ds-burst'
  await insertGraph({ runs: [makeRun({ run_id: run })] })
  const streamUrl = `${url}/api/streams/runs/${run}`
  const written = await insertEvents(...Array.from({ length: 100 }, () => ({ run_id: run })))
  const page = await fetch(`${streamUrl}?offset=-1`)
  t.same(ids(await page.json() as Envelope[]), written, 'a catch-up right after a commit of 100 events has all 100')
  t.equal(page.headers.get('stream-up-to-date'), 'true')
  t.equal(page.headers.get('stream-next-offset'), encodeOffset(written.at(-1)!))

  const sse = await (await fetch(`${streamUrl}?offset=-1&live=sse`)).text()
  const frames = [...sse.matchAll(/^event: (\w+)\ndata:(.*)$/gm)].map((match) => ({ type: match[1], data: JSON.parse(match[2]!) as unknown }))
  t.same(frames[0]?.type, 'data', 'SSE from -1: the data first')
  t.same(ids(frames[0]!.data as Envelope[]), written, 'all of it, in one batch')
  t.match(frames[1], { type: 'control', data: { streamNextOffset: encodeOffset(written.at(-1)!), upToDate: true } }, 'then one control, up to date')
  t.equal(frames.filter((frame) => frame.type === 'control' && (frame.data as { streamNextOffset: string }).streamNextOffset === encodeOffset(written.at(-1)!)).length, 1, 'and no other control names the same offset')

  // offset=now is the tail as a plain read sees it: a long-poll from it gets only what commits after it.
  const idle = await fetch(`${streamUrl}?offset=now&live=long-poll`)
  t.equal(idle.status, 204, 'nothing committed since: 204, not the events that already existed')
  t.equal(idle.headers.get('stream-next-offset'), encodeOffset(written.at(-1)!))
  // The event must commit after the long-poll read its "now" (it waits from before that read, so its count does not tell).
  const { reads } = app.events.durable
  const readPage = reads.page.bind(reads)
  let nowRead = false
  reads.page = async (...args) => { const read = await readPage(...args); nowRead ||= args[0] === 'now'; return read }
  const waiting = fetch(`${streamUrl}?offset=now&live=long-poll`)
  await waitUntil(() => nowRead, 'the long-poll to read its "now"')
  const [later] = await insertEvents({ run_id: run })
  t.same(ids(await (await waiting).json() as Envelope[]), [later], 'and a long-poll from now gets what commits after it')
})

t.test('up to date means up to date: events committed above a writer in flight make a catch-up wait for it, then say what they lack', { skip: needsServer('a writer held open on a connection of its own, beside the service\'s') }, async (t) => {
  const { app, url } = await serve(t)
  const run = 'ds-pending'
  await insertGraph({ runs: [makeRun({ run_id: run })] })
  const streamUrl = `${url}/api/streams/runs/${run}`
  const [before] = await insertEvents({ run_id: run })
  const held = new pg.Client({ connectionString: await testDatabaseUrl() })
  await held.connect()
  t.teardown(() => held.end())
  await held.query('begin')
  const { rows: [drawn] } = await held.query("insert into events (event_type, run_id) values ('in_flight', $1) returning event_id", [run])
  const [above] = await insertEvents({ run_id: run })

  // The writer commits while the read waits: the read has all three, up to date.
  // It commits once the read waits on the tail, not after a fixed time: a
  // slow machine's read could start after the commit and never wait.
  const { hub } = app.events
  const tailPast = hub.tailPast.bind(hub)
  let readWaits!: () => void
  const waitingOnHead = new Promise<void>((resolve) => { readWaits = resolve })
  hub.tailPast = (position, maxMs) => {
    const past = tailPast(position, maxMs)
    readWaits()
    return past
  }
  const started = performance.now()
  const reading = fetch(`${streamUrl}?offset=-1`)
  await waitingOnHead
  await held.query('commit')
  const page = await reading
  t.same(ids(await page.json() as Envelope[]), [before, Number(drawn.event_id), above], 'the read waited for the writer: every event, in order')
  t.equal(page.headers.get('stream-up-to-date'), 'true')
  t.ok(performance.now() - started < PENDING_WAIT_MS, 'answered once the writer committed, not after the whole wait')

  // A writer that stays open: the read answers after PENDING_WAIT_MS with what is settled, not up to date.
  await held.query('begin')
  await held.query("insert into events (event_type, run_id) values ('in_flight', $1)", [run])
  const [committed] = await insertEvents({ run_id: run })
  const waited = performance.now()
  const partial = await fetch(`${streamUrl}?offset=${encodeOffset(above!)}`)
  t.ok(performance.now() - waited >= PENDING_WAIT_MS - 50, 'it waited for the writer')
  t.same(await partial.json(), [], 'nothing past the writer in flight')
  t.equal(partial.headers.get('stream-up-to-date'), null, 'and it does not say up to date: an event committed before the read is not in it')
  t.equal(partial.headers.get('stream-next-offset'), encodeOffset(above!))
  await held.query('rollback')
  await waitUntil(async () => (await fetch(`${streamUrl}?offset=${encodeOffset(above!)}`)).headers.get('stream-up-to-date') === 'true', 'the read to be up to date')
  t.same(ids(await (await fetch(`${streamUrl}?offset=${encodeOffset(above!)}`)).json() as Envelope[]), [committed], 'once it rolled back: the event above it, up to date')
})

/**
 * `crowd` long-polls of a run of their own, waiting in the hub, then one
 * event for them: their pages, the event's id, and for each answer (in the
 * order answered) whether the event loop had turned since the first.
 */
async function answerCrowd (app: FastifyInstance, run: string, crowd: number) {
  await insertGraph({ runs: [makeRun({ run_id: run })] })
  const from = await app.events.ready()
  const polls = Array.from({ length: crowd }, () => app.events.durable.reads.longPoll(from, { runId: run }, 10_000, () => {}, 'crowd'))
  await waitUntil(() => app.events.durable.waiting === crowd, 'every long-poll to wait')
  let turned = false
  const afterTurn: boolean[] = []
  for (const poll of polls) {
    void poll.then(() => {
      if (afterTurn.length === 0) setImmediate(() => { turned = true })
      afterTurn.push(turned)
    })
  }
  const [written] = await insertEvents({ run_id: run })
  return { pages: await Promise.all(polls), written, afterTurn }
}

t.test('a crowd answered within its turn (answerTurnMs) is answered before the loop turns', async (t) => {
  const { app } = await serve(t)
  const crowd = ANSWERS_PER_CLOCK_LOOK * 2 + 1
  const { afterTurn } = await answerCrowd(app, 'ds-crowd-one-turn', crowd)
  t.notOk(afterTurn.some((after) => after), `all ${crowd} in one turn of the loop (the clock looked at twice)`)
})

t.test('a crowd of long-polls is answered a turn of the event loop at a time (answerTurnMs), the loop turning between', async (t) => {
  const { app } = await serve(t)
  // Every look at the clock finds the turn over.
  app.events.hub.answerTurnMs = 0
  const crowd = ANSWERS_PER_CLOCK_LOOK * 2 + 50
  const { pages, written, afterTurn } = await answerCrowd(app, 'ds-crowd', crowd)
  t.ok(pages.every((page) => page.events.length === 1 && page.events[0]!.id === written), 'every long-poll gets the event')
  // The hub's own turn comes first: before a turn of ours, one or two of its batches.
  const beforeTurn = afterTurn.filter((after) => !after).length
  t.ok(beforeTurn >= ANSWERS_PER_CLOCK_LOOK && beforeTurn < crowd && beforeTurn % ANSWERS_PER_CLOCK_LOOK === 0, `not all in one turn of the loop: ${beforeTurn} of ${crowd} before a turn of ours`)
  t.ok(afterTurn.at(-1), 'the rest after the loop turned')
})

t.test('a crowd arriving at once on a run not yet checked shares one existence query; an unknown run\'s crowd one 404', async (t) => {
  const { app, url } = await serve(t)
  await insertGraph({ runs: [makeRun({ run_id: 'ds-crowd-check' })] })
  const tables: string[] = []
  const selectFrom = app.db.selectFrom.bind(app.db)
  app.db.selectFrom = ((table: string) => { tables.push(table); return selectFrom(table as 'runs') }) as typeof app.db.selectFrom
  const tail = (await fetch(`${url}/api/streams/events?offset=now`)).headers.get('stream-next-offset')!
  const known = await Promise.all(Array.from({ length: 20 }, () => fetch(`${url}/api/streams/runs/ds-crowd-check?offset=${tail}`)))
  t.same(known.map((response) => response.status), Array(20).fill(200))
  // The unknown run's crowd arrives while its existence query is held (the
  // runs table locked), so that it is one crowd whatever the machine's load:
  // an answer found before the last request arrives would not be shared.
  let arrived = 0
  const allArrived = new Promise<void>((resolve) => {
    app.server.on('request', (request) => { if (request.url?.startsWith('/api/streams/runs/ds-no-such-run') && ++arrived === 20) resolve() })
  })
  const unlock = await lockTable('runs')
  const unknownCrowd = Promise.all(Array.from({ length: 20 }, () => fetch(`${url}/api/streams/runs/ds-no-such-run?offset=${tail}`)))
  await allArrived
  await sleep(100)
  await unlock()
  const unknown = await unknownCrowd
  t.same(unknown.map((response) => response.status), Array(20).fill(404))
  t.same(tables.filter((table) => table === 'runs'), ['runs', 'runs'], 'one query for each crowd')
  // A later request for the unknown run asks again (only existence is remembered).
  t.equal((await fetch(`${url}/api/streams/runs/ds-no-such-run?offset=${tail}`)).status, 404)
  t.equal(tables.filter((table) => table === 'runs').length, 3)
})

t.test('tailPast: at once when the tail is past the position, after maxMs when it does not move, and at once when the hub stops', async (t) => {
  const { app } = await serve(t)
  await insertEvents({ run_id: 'ds-tail' })
  await waitUntil(() => (app.events.hub.tail ?? 0) > 0, 'the hub to read the event')
  const tail = app.events.hub.tail!
  let started = performance.now()
  await app.events.hub.tailPast(tail - 1, LONG_WAIT_MS)
  t.ok(performance.now() - started < PROMPTLY_MS, 'past already: at once')
  started = performance.now()
  await app.events.hub.tailPast(tail + 1000, 200)
  t.ok(performance.now() - started >= 190, 'the tail does not move: after maxMs')
  const waiting = app.events.hub.tailPast(tail + 1000, LONG_WAIT_MS)
  app.events.hub.stop()
  await waiting
  started = performance.now()
  await app.events.hub.tailPast(tail + 1000, LONG_WAIT_MS)
  t.ok(performance.now() - started < PROMPTLY_MS, 'a stopped hub answers at once')
})

t.test('raw: SSE from now with a quiet filter: the first control event is the tail, up to date; heartbeats move the offset', async (t) => {
  const { app, url } = await serve(t, { SSE_KEEPALIVE_MS: 150, DURABLE_STREAMS_SSE_MAX_MS: 1200 })
  // Its headers are sent once it has read the tail.
  const response = await fetch(`${url}/api/streams/threads/ds-thread?offset=now&live=sse`)
  const tail = app.events.hub.tail!
  const reading = response.text()
  const [elsewhere] = await insertEvents({ run_id: 'ds-b', thread_id: 'not-this-one' })
  const text = await reading
  const controls = [...text.matchAll(/^event: control\ndata:(.*)$/gm)].map((match) => JSON.parse(match[1]!) as { streamNextOffset: string, upToDate: boolean })
  t.same(controls[0], { ...controls[0], streamNextOffset: encodeOffset(tail), upToDate: true }, 'first: the tail, up to date')
  t.ok(controls.some((control) => control.streamNextOffset >= encodeOffset(elsewhere!)), 'a quiet stream\'s offset moves past events it does not carry')
  t.notMatch(text, /event: data/, 'no data: nothing of this thread')
})

t.test('raw: long-poll from -1 on an empty stream waits, then gets the first event; shutting down answers the waiters', async (t) => {
  const { app, url } = await serve(t, { DURABLE_STREAMS_LONG_POLL_MS: LONG_WAIT_MS })
  const thread = 'ds-quiet-thread'
  await insertGraph({ threads: [makeThread({ run_id: 'ds-a', task_id: 'ds-task', thread_id: thread })] })
  const waiting = fetch(`${url}/api/streams/threads/${thread}?offset=-1&live=long-poll`)
  await sleep(100)
  const [first] = await insertEvents({ run_id: 'ds-a', thread_id: thread })
  const woken = await waiting
  t.equal(woken.status, 200)
  t.same(ids(await woken.json() as Envelope[]), [first])

  const next = woken.headers.get('stream-next-offset')!
  const started = Date.now()
  const parked = fetch(`${url}/api/streams/threads/${thread}?offset=${next}&live=long-poll`)
  await waitUntil(() => app.events.durable.waiting === 1, 'the long-poll to wait')
  t.match((await app.inject('/metrics')).body, /^event_long_polls_waiting 1$/m, 'counted through /metrics')
  await app.close()
  const answer = await parked
  t.equal(answer.status, 204, 'a waiter is answered when the service stops')
  t.ok(Date.now() - started < PROMPTLY_MS, 'without waiting for its timeout')
})

t.test('raw: a long-poll whose client goes away stops waiting then, not at its timeout', async (t) => {
  const { app, url } = await serve(t, { DURABLE_STREAMS_LONG_POLL_MS: 60_000 })
  const tail = (await fetch(`${url}/api/streams/runs/ds-a?offset=now`)).headers.get('stream-next-offset')!
  const controller = new AbortController()
  const gone = fetch(`${url}/api/streams/runs/ds-a?offset=${tail}&live=long-poll`, { signal: controller.signal }).then(() => 'answered', () => 'aborted')
  await waitUntil(() => app.events.durable.waiting === 1, 'the long-poll to wait')
  controller.abort()
  t.equal(await gone, 'aborted')
  await waitUntil(() => app.events.durable.waiting === 0, 'the waiter to stop when its client left', 60_000)
})

t.test('raw: an SSE read and a long-poll still opening when the shutdown begins are answered at once (a retry, nothing new), never left open', async (t) => {
  const { app, url } = await serve(t, { DURABLE_STREAMS_LONG_POLL_MS: LONG_WAIT_MS })
  await app.events.ready()
  // Both requests' existence check is held (the runs table locked) across the start of the shutdown: they open on a stopped event log.
  const unlock = await lockTable('runs')
  const started = Date.now()
  let arrived = 0
  const bothArrived = new Promise<void>((resolve) => {
    app.server.on('request', (request) => { if (request.url?.startsWith('/api/streams/runs/ds-b') && ++arrived === 2) resolve() })
  })
  const sse = fetch(`${url}/api/streams/runs/ds-b?offset=now&live=sse`).then(async (response) => ({ status: response.status, body: await response.text() }))
  const longPoll = fetch(`${url}/api/streams/runs/ds-b?offset=now&live=long-poll`)
  await bothArrived
  await sleep(100) // from arrival to the held existence check
  const closed = app.close()
  await sleep(100)
  await unlock()
  const answer = await sse
  t.equal(answer.status, 200)
  t.match(answer.body, /^retry: \d+\n: unavailable: the service is shutting down, retry on another instance\n\n$/, 'the SSE read: a retry, elsewhere')
  t.equal((await longPoll).status, 204, 'the long-poll: nothing new, without waiting for its timeout')
  await closed
  t.ok(Date.now() - started < PROMPTLY_MS, 'the close waited on neither')
})

t.test('raw: an SSE read refused at SSE_MAX_STREAMS is a retry, as on the event stream', async (t) => {
  const { app, url } = await serve(t, { SSE_MAX_STREAMS: 1 })
  const controller = new AbortController()
  t.teardown(() => controller.abort())
  void fetch(`${url}/api/streams/events?offset=now&live=sse`, { signal: controller.signal }).then((response) => response.text()).catch(() => undefined)
  await waitUntil(() => app.events.streams.size === 1, 'the one slot taken')
  const refused = await fetch(`${url}/api/streams/events?offset=now&live=sse`)
  t.equal(refused.status, 200)
  t.equal(refused.headers.get('content-type'), 'text/event-stream')
  t.match(await refused.text(), /^retry: \d+\n: unavailable: /)
})

t.test('a waiter whose client is already gone does not wait', async (t) => {
  const waiter = new Waiter({}, 0, 10)
  const started = Date.now()
  await waiter.wait(LONG_WAIT_MS, (stop) => { stop() })
  t.ok(Date.now() - started < PROMPTLY_MS)
  waiter.close() // nothing to release: harmless
  // One that already holds an event answers at once, listening for nothing.
  const holding = new Waiter({}, 0, 10)
  holding.offer({ id: 1 } as StoredEvent)
  await holding.wait(LONG_WAIT_MS, () => { t.fail('no listener needed') })
  t.ok(Date.now() - started < PROMPTLY_MS, 'and one that already holds an event does not wait either')
})
