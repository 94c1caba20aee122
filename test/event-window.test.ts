import t, { type Test } from 'tap'
import type { Config } from '../config.ts'
import type { StoredEvent } from '../events/statements.ts'
import { EVENT_OVERHEAD_BYTES, EventWindow } from '../events/window.ts'
import { serve as serveApp } from './helpers/app.ts'
import { insertGraph, makeRun, makeThread } from './helpers/fixtures.ts'
import { insertEvents, openStream } from './helpers/sse.ts'
import { waitUntil } from './helpers/wait.ts'

// The window of recent events (issue 14): streams resuming from a recent
// cursor catch up from memory, exactly as the table would answer, and only
// older cursors read the table.

/** Every test event takes the same bytes in the window: SIZE. */
const event = (id: number, runId = '', threadId = ''): StoredEvent => ({ id, runId, threadId, json: `{"event_id":${id}}`.padEnd(30) })
const SIZE = 30 + EVENT_OVERHEAD_BYTES
const ids = (events: StoredEvent[]) => events.map((e) => e.id)

t.test('the window covers (from, tail]: appended events, filtered pages, bounded by bytes', async (t) => {
  const window = new EventWindow(10, 3 * SIZE)
  t.same([window.from, window.tail, window.size], [10, 10, 0], 'empty, at the position it starts from')
  t.ok(window.covers(10) && window.covers(99) && !window.covers(9), 'covers its start and anything after it')
  window.append(event(11, 'a'))
  window.append(event(13, 'b', 'x'))
  window.advance(15) // 12, 14 and 15 never commit
  t.same([window.from, window.tail, window.size], [10, 15, 2])
  t.same(ids(window.after(10, {}, 10)), [11, 13])
  t.same(ids(window.after(11, {}, 10)), [13])
  t.same(ids(window.after(15, {}, 10)), [], 'nothing after the tail')
  t.same(ids(window.after(10, { runId: 'b' }, 10)), [13], 'by run')
  t.same(ids(window.after(10, { threadId: 'x' }, 10)), [13], 'by thread')
  t.same(ids(window.after(10, { runId: 'a', threadId: 'x' }, 10)), [], 'both: AND')
  t.same(ids(window.after(10, {}, 1)), [11], 'at most a page')
  window.advance(12)
  t.equal(window.tail, 15, 'the tail never moves back')

  window.append(event(16))
  window.append(event(17))
  t.same([window.from, window.size, window.bytes], [11, 3, 3 * SIZE], 'past its bytes, the oldest leaves and the start rises')
  t.notOk(window.covers(10), 'a cursor before the start reads the table')
  t.same(ids(window.after(11, {}, 10)), [13, 16, 17])

  window.raiseFloor(16)
  t.same([window.from, ids(window.after(16, {}, 10))], [16, [17]], 'the history\'s floor takes what it passed')
  window.raiseFloor(5)
  t.equal(window.from, 16, 'a lower floor changes nothing')
  window.raiseFloor(100)
  t.same([window.from, window.size], [17, 0], 'a floor past the tail: nothing below the tail is served')
})

t.test('without bytes the window holds nothing, yet covers from its tail on; it compacts as it turns over', async (t) => {
  const none = new EventWindow(0, 0)
  none.append(event(1))
  none.append(event(2))
  t.same([none.from, none.tail, none.size, none.bytes], [2, 2, 0, 0])
  t.same(ids(none.after(2, {}, 10)), [])

  const small = new EventWindow(0, 100 * SIZE)
  for (let id = 1; id <= 5000; id++) small.append(event(id))
  t.same([small.from, small.size], [4900, 100])
  t.same(ids(small.after(4990, {}, 100)), Array.from({ length: 10 }, (_, i) => 4991 + i), 'still exact after many compactions')
})

/** This file's application, listening. */
const serve = (t: Test, overrides: Partial<Config> = {}) => serveApp(t, { EVENTS_POLL_INTERVAL_MS: 20, ...overrides })

t.before(() => insertGraph({
  runs: [makeRun({ run_id: 'run-w1' }), makeRun({ run_id: 'run-w2' })],
  threads: [makeThread({ run_id: 'run-w1', task_id: 'task-w', thread_id: 'thread-w' })]
}))

t.test('a reconnect storm inside the window is served from memory, each stream exactly what it missed', async (t) => {
  const { app, url } = await serve(t)
  const start = (await app.events.ready())
  const written = await insertEvents(
    ...Array.from({ length: 30 }, (_, i) => ({ event_type: `storm-${i}`, run_id: i % 2 === 0 ? 'run-w1' : 'run-w2', thread_id: i % 3 === 0 ? 'thread-w' : '' })))
  await waitUntil(() => (app.events.hub.tail ?? 0) >= written.at(-1)!, 'the hub polled them')
  const before = { ...app.events.reader.catchUps }

  const cursors = [start, written[9]!, written[19]!, written[28]!]
  const filters = ['', 'run_id=run-w1', 'thread_id=thread-w']
  const streams = await Promise.all(Array.from({ length: 120 }, (_, i) => {
    const after = cursors[i % cursors.length]!
    const filter = filters[i % filters.length]!
    return openStream(url, `/api/events/stream?${filter}`, { 'last-event-id': String(after) }).then((stream) => ({ stream, after, filter }))
  }))
  for (const { stream, after, filter } of streams) {
    const expected = written.filter((id, i) => id > after &&
      (filter === '' || (filter === 'run_id=run-w1' ? i % 2 === 0 : i % 3 === 0)))
    await stream.waitFor((s) => s.events().length >= expected.length)
    t.same(stream.events().map((e) => e.event_id), expected, `after ${after} ${filter || 'unfiltered'}`)
    stream.close()
  }
  t.same({ memory: app.events.reader.catchUps.memory - before.memory, database: app.events.reader.catchUps.database - before.database }, { memory: 120, database: 0 },
    'every catch-up from memory, none from the table')
  const metrics = (await app.inject({ url: '/metrics' })).body
  t.match(metrics, /event_catch_up_reads_total\{source="memory"\} \d+/)
  t.match(metrics, /event_window_events \d+/)
  t.match(metrics, /event_window_bytes \d+/)
})

t.test('a cursor older than the window reads the table, with the same answer', async (t) => {
  const { app, url } = await serve(t, { EVENTS_WINDOW_BYTES: 5 * 1024 })
  await app.events.ready()
  const written = await insertEvents(...Array.from({ length: 40 }, (_, i) => ({ event_type: `old-${i}`, run_id: 'run-w1', summary: 'x'.repeat(100) })))
  await waitUntil(() => (app.events.hub.tail ?? 0) >= written.at(-1)!, 'the hub polled them')
  t.ok(app.events.hub.window!.from > written[0]!, 'the window no longer holds the first of them')
  const before = { ...app.events.reader.catchUps }
  const stream = await openStream(url, '/api/events/stream?run_id=run-w1', { 'last-event-id': String(written[0]! - 1) })
  await stream.waitFor((s) => s.events().length >= written.length)
  t.same(stream.events().map((e) => e.event_id), written)
  stream.close()
  t.ok(app.events.reader.catchUps.database > before.database, 'read from the table')
})
