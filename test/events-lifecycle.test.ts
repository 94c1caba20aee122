import { request as httpRequest } from 'node:http'
import { connect, type Socket } from 'node:net'
import t, { type Test } from 'tap'
import type { Config } from '../config.ts'
import { build, holdClose, serve as serveApp } from './helpers/app.ts'
import { assertSchema } from './helpers/contract.ts'
import { insertGraph, json, lockTable, makeRun, makeThread } from './helpers/fixtures.ts'
import { insertEvents, openStream } from './helpers/sse.ts'
import { PROMPTLY_MS, sleep, waitUntil } from './helpers/wait.ts'
import { needsServer } from './helpers/database.ts'

// On the embedded database a table lock (one session, one backend) holds up every
// connection, not only the statements on that table: these two need a server.
const lockBlocksAll = needsServer('a table lock that blocks only the statements on that table')

// Streams end, and are freed, whatever the client does; plus the JSON page
// and the X-Event-Cursor of reads.

/** This file's application, listening. */
const serve = (t: Test, overrides: Partial<Config> = {}) => serveApp(t, { EVENTS_POLL_INTERVAL_MS: 20, ...overrides })

t.before(() => insertGraph({
  runs: [makeRun({ run_id: 'run-l' })],
  threads: [makeThread({ run_id: 'run-l', task_id: 'task-l', thread_id: 'thread-l' })]
}))

t.test('a client that disconnects is freed at once', async (t) => {
  const { app, url } = await serve(t)
  const streams = await Promise.all([
    openStream(url, '/api/events/stream'),
    openStream(url, '/api/events/stream?run_id=run-l'),
    openStream(url, '/api/events/stream?thread_id=thread-l'),
    openStream(url, '/api/events/stream?after_event_id=0')
  ])
  await waitUntil(() => app.events.streams.size === 4, 'app.events.streams.size === 4')
  for (const stream of streams) stream.close()
  await waitUntil(() => app.events.streams.size === 0, 'app.events.streams.size === 0')
  t.equal(app.events.streams.size, 0, 'no subscriber left registered')
  await insertEvents({ run_id: 'run-l' })
  await new Promise((resolve) => setTimeout(resolve, 100))
  t.equal(app.events.streams.size, 0, 'and fan-out to nobody is harmless')
})

t.test('a client that does not read is cut off at the bound, then disconnected; readers are unaffected', async (t) => {
  const { app, port } = await serve(t, { SSE_MAX_BUFFERED_BYTES: 64 * 1024, SSE_SLOW_CLIENT_TIMEOUT_MS: 500 })
  const [base] = await insertEvents({ event_type: 'base' })
  const reader = await openStream(`http://127.0.0.1:${port}`, `/api/events/stream?run_id=run-slow&after_event_id=${base}`)
  t.teardown(reader.close)
  // A raw socket that sends its request and never reads a byte.
  const stalled = connect({ port, host: '127.0.0.1' })
  stalled.on('error', () => {})
  stalled.pause()
  stalled.write('GET /api/events/stream?run_id=run-slow HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n\r\n')
  await waitUntil(() => app.events.streams.size === 2, 'app.events.streams.size === 2')
  let closed = false
  stalled.on('close', () => { closed = true })
  const big = json({ blob: 'x'.repeat(100_000) })
  const written: number[] = []
  for (let batch = 0; batch < 30 && app.events.streams.size === 2; batch++) {
    written.push(...await insertEvents(...Array.from({ length: 10 }, () => ({ run_id: 'run-slow', payload: big }))))
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  await waitUntil(() => app.events.streams.size === 1, 'app.events.streams.size === 1')
  t.equal(app.events.streams.size, 1, 'the stalled subscriber was disconnected and freed')
  stalled.resume() // let the socket see its end
  await waitUntil(() => closed, 'closed')
  t.ok(closed, 'its connection was closed')
  written.push(...await insertEvents({ run_id: 'run-slow' }))
  await reader.waitFor((s) => s.events().length >= written.length)
  t.same(reader.events().map((event) => event.event_id), written, `the reading client got all ${written.length} events (${written.length * 100} kB), once each, in order`)
  stalled.destroy()
})

t.test('shutdown ends every open stream cleanly', async (t) => {
  const app = await build(t, { EVENTS_POLL_INTERVAL_MS: 20 })
  await app.listen({ port: 0, host: '127.0.0.1' })
  const { port } = app.server.address() as { port: number }
  const streams = await Promise.all([
    openStream(`http://127.0.0.1:${port}`, '/api/events/stream'),
    openStream(`http://127.0.0.1:${port}`, '/api/events/stream?run_id=run-l&after_event_id=0')
  ])
  await waitUntil(() => app.events.streams.size === 2, 'app.events.streams.size === 2')
  const started = Date.now()
  await app.close()
  await Promise.all(streams.map((stream) => stream.ended))
  t.ok(Date.now() - started < PROMPTLY_MS, 'close did not wait on the streams')
  t.equal(app.events.streams.size, 0)
})

t.test('shutdown: a stream\'s end reaches its client whole, once the port is closed, so that its reconnect goes elsewhere', async (t) => {
  const app = await build(t, { EVENTS_POLL_INTERVAL_MS: 20 })
  await app.listen({ port: 0, host: '127.0.0.1' })
  const { port } = app.server.address() as { port: number }
  // A wake-up slow to stop (its connection's end is a round trip to the database, longer under load).
  const hold = holdClose(app)
  const socket = connect({ port, host: '127.0.0.1' })
  let received = ''
  let listeningAtEnd: boolean | undefined
  // What a client reconnecting the moment its stream ends finds: this replica's port refusing it, not a 503 or a reset.
  const reconnect = new Promise<string>((resolve) => {
    socket.on('data', (chunk) => {
      received += chunk.toString()
      if (!received.endsWith('\r\n0\r\n\r\n')) return
      listeningAtEnd = app.server.listening
      const again = connect({ port, host: '127.0.0.1' })
      again.on('connect', () => { again.destroy(); resolve('accepted') })
      again.on('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? err.message))
    })
  })
  const closed = new Promise((resolve) => socket.on('close', resolve))
  socket.write('GET /api/events/stream HTTP/1.1\r\nHost: localhost\r\n\r\n')
  await waitUntil(() => app.events.streams.size === 1 && received.includes('retry:'), 'the stream open')
  const closing = app.close()
  await hold.entered
  await sleep(200)
  hold.release()
  await closing
  t.equal(await reconnect, 'ECONNREFUSED')
  t.equal(listeningAtEnd, false, 'the port was closed when the end arrived')
  await closed
  t.match(received, /\r\n0\r\n\r\n$/, 'the body ended with its last chunk')
})

t.test('shutdown: a slow client still gets its stream\'s end whole; one that takes nothing does not hold the close past its bound', async (t) => {
  const { app, port } = await serve(t, { SSE_MAX_BUFFERED_BYTES: 256 * 1024 * 1024, SSE_SLOW_CLIENT_TIMEOUT_MS: 60_000 })
  const [base] = await insertEvents({ event_type: 'base' })
  /** A raw socket that sends its request and reads nothing until told to. */
  const client = () => {
    const socket = connect({ port, host: '127.0.0.1' })
    socket.on('error', () => {})
    socket.pause()
    let received = ''
    socket.on('data', (chunk) => { received += chunk.toString() })
    const closed = new Promise<void>((resolve) => socket.on('close', () => resolve()))
    socket.write(`GET /api/events/stream?run_id=run-shut&after_event_id=${base} HTTP/1.1\r\nHost: localhost\r\n\r\n`)
    return { socket, closed, received: () => received }
  }
  const [slow, gone] = [client(), client()]
  await waitUntil(() => app.events.streams.size === 2, 'both streams open')
  // Enough that both have bytes waiting in this process, past what the sockets' buffers hold.
  const big = json({ blob: 'x'.repeat(100_000) })
  for (let batch = 0; batch < 60 && app.events.streams.bufferedBytes < 4 * 1024 * 1024; batch++) {
    await insertEvents(...Array.from({ length: 10 }, () => ({ run_id: 'run-shut', payload: big })))
    await sleep(50)
  }
  t.ok(app.events.streams.bufferedBytes > 0, 'bytes wait for both clients')
  const closing = app.close()
  await sleep(300)
  slow.socket.resume()
  await slow.closed
  t.match(slow.received(), /\r\n0\r\n\r\n$/, 'the client that read on got every byte, to its last chunk')
  await closing
  t.pass('the close did not wait on the client that took nothing')
  gone.socket.resume()
  await gone.closed
  t.notMatch(gone.received(), /\r\n0\r\n\r\n$/, 'that one was cut')
})

t.test('a stream\'s connection has no idle timeout (its keep-alives come sooner), which every write would refresh; a plain request\'s has', async (t) => {
  const { app, url } = await serve(t, { CONNECTION_TIMEOUT_MS: 60_000 })
  const sockets: Socket[] = []
  app.server.on('connection', (socket: Socket) => sockets.push(socket))
  const stream = await openStream(url, '/api/events/stream')
  t.teardown(stream.close)
  await waitUntil(() => app.events.streams.size === 1, 'the stream open')
  const plain = connect({ port: Number(new URL(url).port), host: '127.0.0.1' })
  t.teardown(() => plain.destroy())
  await waitUntil(() => sockets.length === 2, 'both connections')
  t.same(sockets.map((socket) => socket.timeout), [0, 60_000])
})

t.test('a database outage at connect: the stream answers a retry (the JSON page 503), and registers nothing', async (t) => {
  const app = await build(t, { DATABASE_URL: 'postgres://postgres@127.0.0.1:1/none', DB_CONNECT_TIMEOUT_MS: 300, EVENTS_POLL_INTERVAL_MS: 10 })
  await new Promise((resolve) => setTimeout(resolve, 100)) // the poller has failed a few times meanwhile, harmlessly
  for (const url of ['/api/events/stream', '/api/events/stream?after_event_id=0']) {
    const res = await app.inject(url)
    t.equal(res.statusCode, 200, url)
    t.equal(res.body, `retry: ${app.config.SSE_RETRY_MS}\n: unavailable: the database is unavailable, try again shortly\n\n`)
  }
  const page = await app.inject('/api/events')
  t.equal(page.statusCode, 503)
  t.equal(page.json().error.code, 'unavailable')
  t.equal(app.events.streams.size, 0)
})

t.test('a read failing after the hub is up still answers a retry, and registers nothing', { skip: lockBlocksAll }, async (t) => {
  const { app, url } = await serve(t, { DB_STATEMENT_TIMEOUT_MS: 100 })
  // The hub's own first read has the same 100 ms, which a loaded machine can pass: until it is up.
  await waitUntil(() => app.events.ready().then(() => true, () => false), 'the hub to start')
  // What a stream's start reads first, whether or not it reads events (its settled position).
  const release = await lockTable('event_log_state')
  try {
    for (const path of ['/api/events/stream', '/api/events/stream?after_event_id=0']) {
      const stream = await openStream(url, path)
      t.equal(stream.status, 200, path)
      await stream.ended
      t.same(stream.frames, [{ retry: String(app.config.SSE_RETRY_MS), comments: ['unavailable: the database is unavailable, try again shortly'] }])
    }
    t.equal(app.events.streams.size, 0)
  } finally {
    await release()
  }
})

t.test('a client gone before its stream started is never registered', { skip: lockBlocksAll }, async (t) => {
  const { app, url } = await serve(t)
  await app.events.ready()
  const release = await lockTable('event_log_state')
  // The request waits on the lock (its settled position); the client gives up meanwhile.
  const gaveUp = new Promise<void>((resolve) => {
    const req = httpRequest(`${url}/api/events/stream?run_id=impatient`)
    req.on('error', () => resolve())
    req.end()
    setTimeout(() => req.destroy(), 200)
  })
  await gaveUp
  await new Promise((resolve) => setTimeout(resolve, 100))
  await release()
  await new Promise((resolve) => setTimeout(resolve, 200))
  t.equal(app.events.streams.size, 0, 'nothing left registered')
})

t.test('GET /api/events: a page of events, filters, limit, and where to resume', async (t) => {
  const { app } = await serve(t)
  const [base] = await insertEvents({ event_type: 'base' })
  const written = await insertEvents(
    { run_id: 'page-run', thread_id: 'page-thread', payload: json([1, 2]) },
    { run_id: 'page-run' },
    { run_id: 'other' }
  )
  const all = await app.inject(`/api/events?after_event_id=${base}`)
  t.equal(all.statusCode, 200)
  assertSchema(t, 'EventList', all.json())
  t.same(all.json().events.map((event: { event_id: number }) => event.event_id), written)
  t.equal(all.headers['x-event-cursor'], String(written[2]), 'not a full page: resume from the end')
  t.same(all.json().events[0].payload, [1, 2])

  const page = await app.inject(`/api/events?after_event_id=${base}&run_id=page-run&limit=1`)
  t.same(page.json().events.map((event: { event_id: number }) => event.event_id), [written[0]])
  t.equal(page.headers['x-event-cursor'], String(written[0]), 'a full page: resume after its last event')
  const next = await app.inject(`/api/events?after_event_id=${page.headers['x-event-cursor']}&run_id=page-run&limit=1`)
  t.same(next.json().events.map((event: { event_id: number }) => event.event_id), [written[1]])
  const end = await app.inject(`/api/events?after_event_id=${written[1]}&run_id=page-run`)
  t.same(end.json(), { events: [] })
  t.equal(end.headers['x-event-cursor'], String(written[2]), 'a filtered client skips to the end of the log')

  const thread = await app.inject(`/api/events?after_event_id=${base}&thread_id=page-thread`)
  t.equal(thread.json().events.length, 1)
  const first = await app.inject('/api/events?limit=1')
  t.equal(first.json().events[0].event_id, 1, 'without after_event_id: from the first event')

  const beyond = await app.inject('/api/events?after_event_id=999999999')
  t.equal(beyond.statusCode, 400, 'a cursor beyond the last event_id handed out is refused (one merely ahead waits: bad-input.test.ts)')
  t.match(beyond.json().error.message, /^after_event_id 999999999 is beyond the last event_id handed out/)
  for (const query of ['limit=0', 'limit=1001', 'after_event_id=-1', 'after_event_id=x', 'run_id=%00']) {
    const res = await app.inject(`/api/events?${query}`)
    t.equal(res.statusCode, 400, query)
    t.equal(res.json().error.code, 'bad_request')
  }
})

t.test('reads carry X-Event-Cursor: subscribe from it and miss nothing', async (t) => {
  const { app, url } = await serve(t)
  const [latest] = await insertEvents({ run_id: 'run-l', summary: 'before the read' })
  for (const path of ['/api/runs', '/api/runs/run-l', '/api/runs/run-l/tasks', '/api/runs/run-l/blocked', '/api/threads/thread-l']) {
    const res = await app.inject(path)
    t.equal(res.headers['x-event-cursor'], String(latest), path)
  }
  const read = await app.inject('/api/runs/run-l')
  const [between] = await insertEvents({ run_id: 'run-l', summary: 'between fetch and subscribe' })
  const stream = await openStream(url, `/api/events/stream?run_id=run-l&after_event_id=${read.headers['x-event-cursor']}`)
  t.teardown(stream.close)
  await stream.waitFor((s) => s.events().length === 1)
  t.same(stream.events().map((event) => event.event_id), [between])
  t.notOk((await app.inject('/health')).headers['x-event-cursor'], 'not on /health')
})
