import { EventSource } from 'eventsource'
import t, { type Test } from 'tap'
import type { Config } from '../config.ts'
import { SWEEP_MAX_INTERVAL_MS } from '../events/sse/streams.ts'
import { serve as serveApp } from './helpers/app.ts'
import { assertSchema } from './helpers/contract.ts'
import { insertGraph, json, makeRun } from './helpers/fixtures.ts'
import { insertEvents, openStream } from './helpers/sse.ts'
import { sleep, waitUntil } from './helpers/wait.ts'

// GET /api/events/stream: wire format, filters, order, resume, tail, errors.

/** This file's application, listening. */
const serve = (t: Test, overrides: Partial<Config> = {}) => serveApp(t, { EVENTS_POLL_INTERVAL_MS: 20, ...overrides })

const ids = (events: Array<{ event_id: number }>) => events.map((event) => event.event_id)

t.before(() => insertGraph({ runs: [makeRun({ run_id: 'run-s' })] }))

t.test('wire format: headers, retry, id and one-line data per event, every envelope field', async (t) => {
  const { url } = await serve(t)
  const [first] = await insertEvents({
    event_type: 'task_blocked',
    run_id: 'run-s',
    task_id: 'task-1',
    thread_id: 'thread-1',
    summary: 'Blocked on a question',
    payload: json({ question: 'Which database?', nested: [1, null, 'two\nlines'] })
  })
  const stream = await openStream(url, `/api/events/stream?after_event_id=${first! - 1}`)
  t.teardown(stream.close)
  t.equal(stream.status, 200)
  t.equal(stream.headers['content-type'], 'text/event-stream')
  t.equal(stream.headers['cache-control'], 'no-cache')
  t.equal(stream.headers['x-accel-buffering'], 'no')
  t.notOk(stream.headers['content-encoding'], 'never compressed')
  await stream.waitFor((s) => s.events().length === 1)
  t.same(stream.frames[0], { retry: '2000', comments: [] }, 'retry: once, first')
  const frame = stream.frames[1]!
  t.equal(frame.id, String(first), 'id: is the event_id')
  t.notOk('event' in frame, 'no event: field, so onmessage sees every event')
  const [event] = stream.events()
  assertSchema(t, 'Event', event)
  t.same(event, {
    event_id: first,
    event_type: 'task_blocked',
    run_id: 'run-s',
    task_id: 'task-1',
    thread_id: 'thread-1',
    summary: 'Blocked on a question',
    payload: { question: 'Which database?', nested: [1, null, 'two\nlines'] },
    created_at: event!.created_at
  })
  t.match(event!.created_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/)
})

t.test('an event with empty fields still carries all eight, payload at least {}', async (t) => {
  const { url } = await serve(t)
  const [id] = await insertEvents({ event_type: 'council_tallied' })
  const stream = await openStream(url, `/api/events/stream?after_event_id=${id! - 1}`)
  t.teardown(stream.close)
  await stream.waitFor((s) => s.events().length === 1)
  t.same(stream.events()[0], {
    event_id: id,
    event_type: 'council_tallied',
    run_id: '',
    task_id: '',
    thread_id: '',
    summary: '',
    payload: {},
    created_at: stream.events()[0]!.created_at
  })
})

t.test('filters: by run, by thread, by both; ascending order; replay from 0', async (t) => {
  const { url } = await serve(t)
  const base = (await insertEvents({ event_type: 'marker' }))[0]!
  const streams = {
    all: await openStream(url, `/api/events/stream?after_event_id=${base}`),
    run: await openStream(url, `/api/events/stream?after_event_id=${base}&run_id=f-run`),
    thread: await openStream(url, `/api/events/stream?after_event_id=${base}&thread_id=f-thread`),
    both: await openStream(url, `/api/events/stream?after_event_id=${base}&run_id=f-run&thread_id=f-thread`)
  }
  for (const stream of Object.values(streams)) t.teardown(stream.close)
  const written = await insertEvents(
    { run_id: 'f-run' },
    { run_id: 'f-run', thread_id: 'f-thread' },
    { run_id: 'other', thread_id: 'f-thread' },
    { run_id: 'other' },
    { run_id: 'f-run', thread_id: 'other-thread' }
  )
  const [a, b, c, , e] = written as [number, number, number, number, number]
  await streams.all.waitFor((s) => s.events().length === 5)
  await streams.run.waitFor((s) => s.events().length === 3)
  await streams.thread.waitFor((s) => s.events().length === 2)
  await streams.both.waitFor((s) => s.events().length === 1)
  t.same(ids(streams.all.events()), written, 'unfiltered: everything, ascending')
  t.same(ids(streams.run.events()), [a, b, e])
  t.same(ids(streams.thread.events()), [b, c])
  t.same(ids(streams.both.events()), [b], 'both filters: AND')

  const replay = await openStream(url, '/api/events/stream?after_event_id=0')
  t.teardown(replay.close)
  await replay.waitFor((s) => s.events().some((event) => event.event_id === e))
  const replayed = ids(replay.events())
  t.equal(replayed[0], 1, 'after_event_id=0 starts at the first event')
  t.same(replayed, [...replayed].sort((x, y) => x - y), 'ascending')
  t.equal(new Set(replayed).size, replayed.length, 'no repeats')
})

t.test('tail by default: only events committed after the connection opened', async (t) => {
  const { url } = await serve(t)
  await insertEvents({ summary: 'before' })
  const stream = await openStream(url, '/api/events/stream')
  t.teardown(stream.close)
  await stream.waitFor((s) => s.frames.length >= 1) // retry: sent once subscribed
  const [after] = await insertEvents({ summary: 'after' })
  await stream.waitFor((s) => s.events().length === 1)
  t.same(ids(stream.events()), [after])
})

t.test('resume: after_event_id, Last-Event-ID, and the header wins', async (t) => {
  const { url } = await serve(t)
  const [one, two, three] = await insertEvents({ summary: '1' }, { summary: '2' }, { summary: '3' }) as [number, number, number]
  const byQuery = await openStream(url, `/api/events/stream?after_event_id=${one}`)
  const byHeader = await openStream(url, '/api/events/stream', { 'last-event-id': String(two) })
  const both = await openStream(url, `/api/events/stream?after_event_id=${one - 1}`, { 'last-event-id': String(two) })
  const emptyHeader = await openStream(url, `/api/events/stream?after_event_id=${two}`, { 'last-event-id': ' ' })
  for (const stream of [byQuery, byHeader, both, emptyHeader]) t.teardown(stream.close)
  await byQuery.waitFor((s) => s.events().length === 2)
  t.same(ids(byQuery.events()), [two, three])
  await byHeader.waitFor((s) => s.events().length === 1)
  t.same(ids(byHeader.events()), [three])
  await both.waitFor((s) => s.events().length === 1)
  t.same(ids(both.events()), [three], 'Last-Event-ID wins over a stale after_event_id')
  await emptyHeader.waitFor((s) => s.events().length === 1)
  t.same(ids(emptyHeader.events()), [three], 'an empty header is no header')
})

t.test('malformed cursors answer 400 with the envelope', async (t) => {
  const { app, url } = await serve(t)
  for (const value of ['abc', '-1', '1.5', '1e3', '', ' 1', '99999999999999999', '0x10', '%00']) {
    const res = await app.inject(`/api/events/stream?after_event_id=${value}`)
    t.equal(res.statusCode, 400, `after_event_id=${value}`)
    t.equal(res.json().error.code, 'bad_request')
    t.match(res.headers['content-type'], /^application\/json/)
  }
  for (const value of ['abc', '-1', '12345678901234567', '7 8']) {
    const stream = await openStream(url, '/api/events/stream', { 'last-event-id': value })
    t.equal(stream.status, 400, `Last-Event-ID: ${value}`)
    await stream.ended
    t.same(JSON.parse(stream.body), { error: { code: 'bad_request', message: 'Last-Event-ID must be an event_id: an integer from 0 to 9007199254740991' } })
  }
  const filter = await app.inject('/api/events/stream?run_id=%00')
  t.equal(filter.statusCode, 400)
  const repeated = await app.inject('/api/events/stream?after_event_id=1&after_event_id=2')
  t.equal(repeated.statusCode, 400)
})

t.test('quiet streams get keep-alive comments, and a filtered one id-only blocks', async (t) => {
  const { url } = await serve(t, { SSE_KEEPALIVE_MS: 150 })
  const stream = await openStream(url, '/api/events/stream?run_id=nobody-writes-this')
  t.teardown(stream.close)
  await stream.waitFor((s) => s.frames.some((frame) => frame.comments.includes('keep-alive')))
  const [other] = await insertEvents({ run_id: 'someone-else' })
  await stream.waitFor((s) => s.frames.some((frame) => frame.id === String(other) && frame.data === undefined))
  t.same(stream.events(), [], 'no event of another run was sent')
  const block = stream.frames.find((frame) => frame.id === String(other))!
  t.same(block, { id: String(other), comments: [] }, 'an id-only block: id, no data')
})

t.test('the streams are looked at for keep-alives at most once a second, however often the hub ticks', async (t) => {
  const { app, url } = await serve(t, { SSE_KEEPALIVE_MS: 100_000 })
  const stream = await openStream(url, '/api/events/stream?run_id=nobody-writes-this')
  t.teardown(stream.close)
  await stream.waitFor(() => app.events.streams.size === 1 && app.events.hub.tail !== undefined)
  const keepAlives = () => stream.frames.filter((frame) => frame.comments.includes('keep-alive')).length
  // Ticks far past the stream's last write, in one turn (no real tick between them): each finds it quiet.
  const later = Date.now() + 200_000
  const tail = app.events.hub.tail!
  app.events.streams.sweep(later, tail)
  app.events.streams.sweep(later + SWEEP_MAX_INTERVAL_MS - 1, tail)
  app.events.streams.sweep(later + SWEEP_MAX_INTERVAL_MS, tail)
  await stream.waitFor(() => keepAlives() === 2)
  await sleep(100)
  t.equal(keepAlives(), 2, 'the tick within a second of the last look wrote nothing')
})

t.test('streams opened together get their keep-alives spread over the second half of SSE_KEEPALIVE_MS, not in one burst', async (t) => {
  const keepAliveMs = 100_000
  const { app, url } = await serve(t, { SSE_KEEPALIVE_MS: keepAliveMs })
  const opened = Date.now()
  const streams = await Promise.all(Array.from({ length: 20 }, () => openStream(url, '/api/events/stream?run_id=nobody-writes-this')))
  t.teardown(() => { for (const stream of streams) stream.close() })
  await Promise.all(streams.map((stream) => stream.waitFor(() => stream.frames.length > 0)))
  await sleep(50) // every stream registered and its first write made
  const tail = app.events.hub.tail!
  const kept = () => streams.filter((stream) => stream.frames.some((frame) => frame.comments.includes('keep-alive'))).length
  const settle = async () => { await sleep(100) }
  // Looks (sweeps) at times past the streams' last writes, more than a second apart.
  app.events.streams.sweep(opened + keepAliveMs / 2 - 2000, tail)
  await settle()
  t.equal(kept(), 0, 'none before half of SSE_KEEPALIVE_MS')
  app.events.streams.sweep(opened + keepAliveMs * 0.75, tail)
  await waitUntil(() => kept() > 0, 'a keep-alive at three quarters')
  await settle() // the rest of this sweep's keep-alives, if it (wrongly) wrote them all
  const halfway = kept()
  // 20 shares drawn from a half to the whole: all on one side of three quarters with a chance of 2 in a million.
  t.ok(halfway > 0 && halfway < 20, `some at three quarters (${halfway} of 20), not all`)
  app.events.streams.sweep(Date.now() + keepAliveMs + 2000, tail)
  await waitUntil(() => kept() === 20, 'a keep-alive on every stream by SSE_KEEPALIVE_MS')
  t.equal(kept(), 20, 'every one by SSE_KEEPALIVE_MS')
})

t.test('a real EventSource reconnects with Last-Event-ID and misses nothing', async (t) => {
  const { app, url } = await serve(t, { SSE_RETRY_MS: 100 })
  const [start] = await insertEvents({ run_id: 'es-run', summary: 'first' })
  const received: number[] = []
  let opens = 0
  let arrived: () => void = () => {}
  let expected = 1
  const source = new EventSource(`${url}/api/events/stream?run_id=es-run&after_event_id=${start! - 1}`)
  t.teardown(() => source.close())
  source.onopen = () => { opens++ }
  source.onmessage = (message) => {
    received.push(JSON.parse(message.data).event_id)
    if (received.length === expected) arrived()
  }
  const arrival = (count: number) => new Promise<void>((resolve) => { expected = count; arrived = resolve })

  await arrival(1)
  t.equal(app.events.streams.size, 1)
  // Every stream is dropped, as when a replica restarts; events are written
  // while the client is away, and it must catch up on them when it returns.
  const rest = arrival(3)
  app.events.streams.endAll()
  const written = await insertEvents({ run_id: 'es-run', summary: 'second' }, { run_id: 'es-run', summary: 'third' })
  await rest
  t.same(received, [start, ...written], 'every event once, in order, across the reconnect')
  t.equal(opens, 2, 'it reconnected once')
  t.equal(app.events.streams.size, 1, 'the dropped subscriber was freed, the new one registered')
})
