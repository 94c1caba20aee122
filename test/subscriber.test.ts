import { createServer, get, type ServerResponse } from 'node:http'
import { connect } from 'node:net'
import t from 'tap'
import type { EventFilter, StoredEvent } from '../events/statements.ts'
import { durableSseFormat } from '../events/durable/format.ts'
import { Subscriber, type StreamFormat, type SubscriberOptions } from '../events/sse/subscriber.ts'
import { LONG_WAIT_MS, PROMPTLY_MS, sleep, waitUntil } from './helpers/wait.ts'

// The subscriber's hand-off rules, in isolation (the HTTP tests cover the wiring).

class FakeResponse {
  written: string[] = []
  writableLength = 0
  writableEnded = false
  destroyed = false
  listeners = new Map<string, Set<() => void>>()
  write (text: string) { this.written.push(text); return true }
  /** A client that takes nothing: each write is queued, past the bound (1000 bytes here), and asks to wait. */
  stall () {
    this.write = (text: string) => { this.written.push(text); this.writableLength += 5000; return false }
  }

  end () { this.writableEnded = true; this.emit('close') }
  destroy () { this.destroyed = true; this.emit('close') }
  on (name: string, listener: () => void) { (this.listeners.get(name) ?? this.listeners.set(name, new Set()).get(name)!).add(listener) }
  off (name: string, listener: () => void) { this.listeners.get(name)?.delete(listener) }
  emit (name: string) { for (const listener of [...this.listeners.get(name) ?? []]) listener() }
}

const event = (id: number, fields: Partial<StoredEvent> = {}): StoredEvent => ({ id, runId: 'r', threadId: '', json: `{"event_id":${id}}`, ...fields })
const ids = (response: FakeResponse) => response.written.flatMap((text) => [...text.matchAll(/^id: (\d+)$/gm)].map((match) => Number(match[1])))

function subscriber (options: Partial<SubscriberOptions> & { table?: StoredEvent[] } = {}, startId = 0, filter: EventFilter = {}, format?: StreamFormat) {
  const response = new FakeResponse()
  const drops: string[] = []
  const table = options.table ?? []
  const instance = new Subscriber(response as unknown as ServerResponse, filter, startId, {
    readAfter: async (afterId) => table.filter((row) => row.id > afterId).slice(0, 2),
    pageSize: 2,
    maxBufferedBytes: 1000,
    slowClientMs: 50,
    onDrop: (_subscriber, reason) => { drops.push(reason) },
    ...options
  }, format)
  return { instance, response, drops }
}

t.test('catch-up pages through the table, then flushes what arrived meanwhile, without repeats', async (t) => {
  const table = [event(1), event(2), event(3), event(4), event(5)]
  const { instance, response } = subscriber({ table })
  instance.offer(event(4)) // arrives live while catching up: already in the table too
  instance.offer(event(6))
  t.notOk(instance.isLive)
  await instance.catchUp()
  t.ok(instance.isLive)
  instance.offer(event(6)) // a repeat of an event already sent
  instance.offer(event(7))
  t.same(ids(response), [1, 2, 3, 4, 5, 6, 7])
})

t.test('the Durable Streams format: each catch-up page one batch, the last joined by the live events that waited, each event once, one control each', async (t) => {
  const table = [event(1), event(2), event(3)]
  const { instance, response } = subscriber({ table }, 0, {}, durableSseFormat(() => 3, () => 'c'))
  instance.offer(event(3)) // polled live while catching up, and on the last page too
  instance.offer(event(4))
  await instance.catchUp()
  const frames = response.written.join('').split('\n\n').filter((frame) => frame !== '')
  t.same(frames, [
    'event: data\ndata:[{"event_id":1},{"event_id":2}]',
    'event: control\ndata:{"streamNextOffset":"00000000002","streamCursor":"c","upToDate":false}',
    'event: data\ndata:[{"event_id":3},{"event_id":4}]',
    'event: control\ndata:{"streamNextOffset":"00000000004","streamCursor":"c","upToDate":true}'
  ])
})

t.test('live events overflowing the buffer during catch-up are re-read from the table', async (t) => {
  const table = [event(1), event(2), event(3, { json: 'x'.repeat(600) }), event(4, { json: 'y'.repeat(600) })]
  let reads = 0
  const { instance, response } = subscriber({
    table,
    readAfter: async (afterId) => {
      reads++
      if (reads === 1) { instance.offer(table[2]!); instance.offer(table[3]!) } // 1200 bytes > 1000: overflow
      return table.filter((row) => row.id > afterId).slice(0, 2)
    }
  })
  await instance.catchUp()
  t.same(ids(response), [1, 2, 3, 4])
  t.ok(reads >= 3, 'another pass after the overflow')
})

t.test('a stream closed during catch-up stops reading', async (t) => {
  let reads = 0
  const { instance, response, drops } = subscriber({
    readAfter: async () => { reads++; response.destroy(); return [event(1), event(2)] }
  })
  await instance.catchUp()
  t.equal(reads, 1)
  t.notOk(instance.isLive)
  t.same(drops, [])
})

t.test('a failed read ends the stream and says why', async (t) => {
  const { instance, response, drops } = subscriber({ readAfter: async () => { throw new Error('database away') } })
  await instance.catchUp([event(1), event(2)])
  t.same(drops, ['reading the events failed'])
  t.ok(response.writableEnded)
  t.ok(instance.closed)
})

t.test('a live client over the bound falls behind, then catches up from the table when it drains', async (t) => {
  const table = [event(1), event(2), event(3)]
  // Never too slow here: the drop has its own test, and a late timer must not cut this client off.
  const { instance, response } = subscriber({ table, slowClientMs: 60_000 })
  t.teardown(() => response.destroy()) // if it never catches up, ends the wait for drain
  await instance.catchUp()
  response.writableLength = 5000
  instance.offer(event(4))
  t.notOk(instance.isLive, 'no longer live: nothing more is written')
  table.push(event(4), event(5))
  // No 'drain': the socket's high-water mark (64 KiB since Node 22) may lie above the bound.
  response.writableLength = 4900
  await sleep(30)
  t.notOk(instance.isLive, 'still over the bound')
  response.writableLength = 900
  await waitUntil(() => instance.isLive, 'the client to catch up, back within the bound') // live only once the table is read
  t.same(ids(response), [1, 2, 3, 4, 5])
})

t.test('a client that does not drain in time is disconnected', async (t) => {
  const { instance, response, drops } = subscriber()
  await instance.catchUp()
  response.writableLength = 5000
  instance.offer(event(1))
  await new Promise((resolve) => setTimeout(resolve, 100))
  t.ok(response.destroyed)
  t.same(drops, ['the client is not reading'])
})

t.test('a catch-up blocked on a client that never drains is cut off too', async (t) => {
  const table = [event(1), event(2)]
  const { instance, response, drops } = subscriber({ table })
  response.stall()
  await instance.catchUp()
  t.ok(response.destroyed)
  t.same(drops, ['the client is not reading'])
  t.same(ids(response), [1], 'it stopped writing at the first full buffer')
})

t.test('the Durable Streams format: a catch-up batch blocked on a client that never drains is cut off too', async (t) => {
  const { instance, response, drops } = subscriber({ table: [event(1), event(2), event(3)] }, 0, {}, durableSseFormat(() => 3, () => 'c'))
  response.stall()
  await instance.catchUp()
  t.ok(response.destroyed)
  t.same(drops, ['the client is not reading'])
  t.equal(response.written.length, 1, 'it stopped writing at the first full buffer: one batch')
})

t.test('a client gone while waiting for drain is not reported', async (t) => {
  const { instance, response, drops } = subscriber({ table: [event(1), event(2)] })
  response.stall()
  const pending = instance.catchUp()
  await new Promise((resolve) => setTimeout(resolve, 5)) // now waiting for 'drain'
  t.equal(response.written.length, 1)
  response.destroy()
  await pending
  t.same(drops, [])
})

t.test('a stream closed while over the bound is not waited on, nor reported', async (t) => {
  const { instance, response, drops } = subscriber({ slowClientMs: LONG_WAIT_MS })
  await instance.catchUp()
  response.writableLength = 5000
  response.destroy()
  const started = Date.now()
  instance.offer(event(1))
  await new Promise((resolve) => setTimeout(resolve, 20))
  t.same(drops, [])
  t.ok(Date.now() - started < PROMPTLY_MS)
})

t.test('heartbeats: keep-alive when quiet, an id-only block when the head moved', async (t) => {
  const { instance, response } = subscriber({}, 0, { runId: 'r' })
  await instance.catchUp()
  const now = Date.now()
  instance.heartbeat(now, 0, 1000)
  t.same(response.written, [], 'not before the interval')
  instance.heartbeat(now + 1000, 0, 1000)
  t.same(response.written, [': keep-alive\n\n'])
  instance.heartbeat(now + 3000, 42, 1000)
  t.same(response.written[1], 'id: 42\n\n: keep-alive\n\n')
  t.equal(instance.lastId, 42)
  instance.offer(event(40))
  t.equal(response.written.length, 2, 'an event below the cursor is never sent')
  response.end()
  instance.heartbeat(now + 9000, 50, 1000)
  t.equal(response.written.length, 2, 'nothing is written to a closed stream')
  instance.end()
})

t.test('filters', async (t) => {
  const { instance } = subscriber({}, 0, { runId: 'r', threadId: 'th' })
  t.ok(instance.matches(event(1, { runId: 'r', threadId: 'th' })))
  t.notOk(instance.matches(event(1, { runId: 'r', threadId: 'other' })))
  t.notOk(instance.matches(event(1, { runId: 'x', threadId: 'th' })))
  t.ok(subscriber().instance.matches(event(1)))
})

t.test('on a real socket: the writes after the headers go out as ready-made chunks, the same bytes on the wire', async (t) => {
  const streams: Subscriber[] = []
  const server = createServer((_request, response) => {
    response.writeHead(200, { 'content-type': 'text/event-stream' })
    const instance = new Subscriber(response, {}, 0, { readAfter: async () => [], pageSize: 2, maxBufferedBytes: 1 << 20, slowClientMs: 1000, onDrop: () => {} })
    streams.push(instance)
    instance.write('retry: 1000\n\n')
    void instance.catchUp().then(() => {
      instance.offer(event(1, { json: '{"summary":"caf\u00e9"}' })) // a multi-byte character: the chunk's size counts bytes
      instance.offer(event(2))
      instance.heartbeat(Date.now() + 60_000, 5, 1000)
      instance.end()
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => server.close())
  const { port } = server.address() as { port: number }
  const expected = 'retry: 1000\n\nid: 1\ndata: {"summary":"caf\u00e9"}\n\nid: 2\ndata: {"event_id":2}\n\nid: 5\n\n: keep-alive\n\n'

  // Node's client decodes the chunks.
  const body = await new Promise<string>((resolve, reject) => get({ port, host: '127.0.0.1' }, (response) => {
    let text = ''
    response.setEncoding('utf8').on('data', (chunk: string) => { text += chunk }).on('end', () => resolve(text))
  }).on('error', reject))
  t.equal(body, expected, 'decoded: the events, then the end of the body')

  // The raw bytes: well-formed chunks, and the last chunk.
  const raw = await new Promise<Buffer>((resolve, reject) => {
    const parts: Buffer[] = []
    const socket = connect(port, '127.0.0.1', () => socket.write('GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n'))
    socket.on('data', (part: Buffer) => parts.push(part)).on('end', () => resolve(Buffer.concat(parts))).on('error', reject)
  })
  let rest = raw.subarray(raw.indexOf('\r\n\r\n') + 4)
  t.match(raw.subarray(0, raw.indexOf('\r\n\r\n')).toString(), /transfer-encoding: chunked/i)
  const chunks: Buffer[] = []
  for (;;) {
    const line = rest.indexOf('\r\n')
    const size = Number.parseInt(rest.subarray(0, line).toString(), 16)
    if (size === 0) break
    chunks.push(rest.subarray(line + 2, line + 2 + size))
    t.equal(rest.subarray(line + 2 + size, line + 4 + size).toString(), '\r\n', 'each chunk ends with CRLF')
    rest = rest.subarray(line + 4 + size)
  }
  t.equal(Buffer.concat(chunks).toString(), expected, 'the chunks carry the same text')

  // HTTP/1.0 has no chunks: the body is the text itself, ended by the close.
  const old = await new Promise<string>((resolve, reject) => {
    let text = ''
    const socket = connect(port, '127.0.0.1', () => socket.write('GET / HTTP/1.0\r\n\r\n'))
    socket.setEncoding('utf8').on('data', (part: string) => { text += part }).on('end', () => resolve(text)).on('error', reject)
  })
  t.equal(old.slice(old.indexOf('\r\n\r\n') + 4), expected, 'HTTP/1.0: the same text, unchunked')
  t.equal(streams.length, 3)
})
