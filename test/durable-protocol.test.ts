import { EventEmitter } from 'node:events'
import type { ServerResponse } from 'node:http'
import t from 'tap'
import type { Db } from '../db/schema.ts'
import { DurableStreams, readOf, type DurableReply, type DurableStreamPlan } from '../events/durable/index.ts'
import { encodeOffset } from '../events/durable/offsets.ts'
import type { StreamPage } from '../events/durable/reads.ts'
import { KNOWN_SUBJECT_MS, SubjectChecks } from '../events/durable/subjects.ts'
import type { EventHub, Listener } from '../events/hub.ts'
import type { LogState, StoredEvent } from '../events/statements.ts'
import { assertPositionKept, type EventReader } from '../events/reader.ts'
import { eventsSent } from '../events/sent.ts'

// The Durable Streams protocol as the route is handed it, without HTTP: a
// request's parameters as a read, each answer as data (status, headers,
// body, or the plan of an SSE stream), the errors in the protocol's words,
// and the checks that a stream's run or thread exists. The hub, the reader
// and the database are fakes here, so that each case is certain (the HTTP
// tests: durable-streams.test.ts; the official suite: conformance.test.ts).

const HEAD = 10
const state: LogState = { settled: HEAD, floor: 3, epoch: 1, epochBase: 0, reissued: [], lossPending: false, waitingPid: null, waitingTransaction: null, preparedWriters: 0, settledAge: 0, drawn: HEAD }
const event = (id: number): StoredEvent => ({ id, runId: 'run-1', threadId: '', json: `{"event_id":${id}}` })

/** A database whose runs and threads are `existing`; counts its queries. */
function fakeDb (existing: string[]) {
  const counted = { queries: 0 }
  const query = (id: string) => ({
    executeTakeFirst: async () => {
      counted.queries++
      return existing.includes(id) ? { id } : undefined
    }
  })
  const select = { where: (_column: string, _op: string, id: string) => query(id) }
  const db = { selectFrom: () => ({ select: () => select }) } as unknown as Db
  return { db, counted }
}

/** A client's response, gone when told. */
function fakeResponse () {
  const response = Object.assign(new EventEmitter(), { destroyed: false, writableEnded: false })
  return { response: response as unknown as ServerResponse, leave: () => response.emit('close') }
}

function setup ({ recent = () => [] as StoredEvent[], existing = ['run-1'], longPollMs = 10_000 }: { recent?: (afterId: number, errors: Parameters<EventReader['recentKeptAfter']>[2]) => StoredEvent[] | undefined, existing?: string[], longPollMs?: number } = {}) {
  const listeners = new Set<Listener>()
  const hub = { tail: HEAD, state, ready: async () => HEAD, listen: (listener: Listener) => listeners.add(listener), unlisten: (listener: Listener) => listeners.delete(listener) }
  const reader = { recentKeptAfter: (afterId: number, _filter: unknown, errors: Parameters<EventReader['recentKeptAfter']>[2]) => recent(afterId, errors) }
  const { db, counted } = fakeDb(existing)
  const durable = new DurableStreams(db, hub as unknown as EventHub, reader as unknown as EventReader, { longPolls: { max: 10, maxPerCaller: 10 }, longPollMs, sseMaxMs: 60_000 })
  // A catch-up's page, as the reads would give it (their own tests: durable-reads.test.ts).
  const pages: Array<StreamPage | Error> = []
  durable.reads.page = async () => {
    const page = pages.shift()!
    if (page instanceof Error) throw page
    return page
  }
  return { durable, listeners, pages, counted }
}

const reply = (answer: unknown) => answer as DurableReply
const run = { runId: 'run-1' }

t.test('a request\'s parameters as a read: -1 by default, a live read must name its offset, a malformed one is a 400', async (t) => {
  t.same(readOf({}), { live: 'catch-up', offset: 'oldest', cursor: undefined })
  t.same(readOf({ offset: 'now', live: 'long-poll', cursor: '12' }), { live: 'long-poll', offset: 'now', cursor: 12 })
  t.same(readOf({ offset: encodeOffset(1234), live: 'sse' }), { live: 'sse', offset: 1234, cursor: undefined })
  t.throws(() => readOf({ live: 'long-poll' }), { code: 'bad_request', message: /^offset must be/ }, 'a live read without an offset')
  t.throws(() => readOf({ offset: 'ABC' }), { code: 'bad_request', message: /^offset must be/ })
  t.throws(() => readOf({ offset: '-1', cursor: 'x' }), { code: 'bad_request', message: /^cursor must be/ })
})

t.test('a catch-up page: the JSON array, its offsets, cacheable by its next offset; a crowd given the same events shares one string', async (t) => {
  const { durable, pages } = setup()
  const events = [event(5), event(6)]
  pages.push({ events, next: 6, upToDate: true }, { events, next: 6, upToDate: true }, { events: [event(7)], next: 9, upToDate: false })
  const first = reply(await durable.answer(readOf({ offset: encodeOffset(4) }), run, 'caller', fakeResponse().response))
  t.same(first, {
    status: 200,
    headers: { 'stream-next-offset': encodeOffset(6), 'stream-up-to-date': 'true' },
    type: 'application/json',
    page: { json: '[{"event_id":5},{"event_id":6}]', next: encodeOffset(6) }
  })
  const again = reply(await durable.answer(readOf({ offset: encodeOffset(4) }), run, 'caller', fakeResponse().response))
  t.equal(again.page!.json, first.page!.json)
  const full = reply(await durable.answer(readOf({}), run, 'caller', fakeResponse().response))
  t.same(full.headers, { 'stream-next-offset': encodeOffset(9) }, 'a page that is not the last says no more')
  t.equal(full.page!.json, '[{"event_id":7}]')
})

t.test('offset=now: the tail, never stored, an empty array', async (t) => {
  const { durable, pages } = setup()
  pages.push({ events: [], next: HEAD, upToDate: true })
  const now = reply(await durable.answer(readOf({ offset: 'now' }), run, 'caller', fakeResponse().response))
  t.same(now, { status: 200, headers: { 'stream-next-offset': encodeOffset(HEAD), 'stream-up-to-date': 'true' }, type: 'application/json', body: Buffer.from('[]') })
})

t.test('HEAD: the stream exists, and its tail', async (t) => {
  const { durable, pages } = setup()
  pages.push({ events: [], next: HEAD, upToDate: true })
  t.same(await durable.head(run), { status: 200, headers: { 'stream-next-offset': encodeOffset(HEAD), 'cross-origin-resource-policy': 'cross-origin' }, type: 'application/json' })
  await t.rejects(durable.head({ runId: 'no-such-run' }), { code: 'not_found', message: 'run not found' })
})

t.test('a long-poll: the events that came with a Stream-Cursor, counted for the request log; none in time, a 204', async (t) => {
  const { durable } = setup({ recent: () => [event(HEAD)] })
  const { response } = fakeResponse()
  const came = reply(await durable.answer(readOf({ offset: encodeOffset(HEAD - 1), live: 'long-poll', cursor: '1' }), run, 'caller', response))
  t.equal(came.status, 200)
  t.match(came.headers, { 'stream-cursor': /^\d+$/, 'stream-next-offset': encodeOffset(HEAD), 'stream-up-to-date': 'true' })
  t.same(Object.keys(came.headers), ['stream-cursor', 'stream-next-offset', 'stream-up-to-date'])
  t.equal(came.page!.json, `[${event(HEAD).json}]`)
  t.equal(eventsSent(response), 1)

  const quiet = setup({ longPollMs: 10 })
  const none = reply(await quiet.durable.answer(readOf({ offset: encodeOffset(HEAD), live: 'long-poll' }), run, 'caller', response))
  t.equal(none.status, 204)
  t.match(none.headers, { 'stream-cursor': /^\d+$/, 'stream-next-offset': encodeOffset(HEAD), 'stream-up-to-date': 'true' })
  t.equal(none.page, undefined, 'never stored')
  t.equal(none.body, undefined)
  t.equal(eventsSent(response), 0)
})

t.test('a long-poll stops waiting when its client leaves, or at once when it has left already', async (t) => {
  const { durable, listeners } = setup()
  const { response, leave } = fakeResponse()
  const answer = durable.answer(readOf({ offset: encodeOffset(HEAD), live: 'long-poll' }), run, 'caller', response)
  await new Promise(setImmediate) // the run's check
  t.equal(listeners.size, 1, 'waiting on the hub')
  leave()
  t.equal(reply(await answer).status, 204)
  t.equal(durable.waiting, 0)
  t.equal(durable.longPolls, 0)
  t.same(durable.refused, { instance: 0, caller: 0 })

  const gone = Object.assign(fakeResponse().response, { destroyed: true })
  t.equal(reply(await durable.answer(readOf({ offset: encodeOffset(HEAD), live: 'long-poll' }), run, 'caller', gone)).status, 204)
})

t.test('the errors of an offset are the protocol\'s: an offset, written as one, and -1 to start again', async (t) => {
  const { durable } = setup({ recent: (afterId, errors) => { assertPositionKept(errors, afterId, state); return [] } })
  const poll = (offset: number) => durable.answer(readOf({ offset: encodeOffset(offset), live: 'long-poll' }), run, 'caller', fakeResponse().response)
  await t.rejects(poll(HEAD + 5), { code: 'bad_request', message: `offset ${encodeOffset(HEAD + 5)} is beyond the last offset handed out (${encodeOffset(HEAD)}): pass -1, now, or a Stream-Next-Offset this service sent` })
  await t.rejects(poll(1), { code: 'cursor_expired', message: 'offset is older than the event history kept (events before it are gone, EVENTS_RETENTION): read again from offset=-1' })
  const lost = setup({ recent: (afterId, errors) => { assertPositionKept(errors, afterId, { ...state, floor: 0, reissued: [[4, 6]] }); return [] } })
  await t.rejects(lost.durable.answer(readOf({ offset: encodeOffset(5), live: 'long-poll' }), run, 'caller', fakeResponse().response),
    { code: 'cursor_expired', message: /^offset may name an event the database lost in a failover or a crash .*: read again from offset=-1$/ })
  const promoted = setup({ recent: (afterId, errors) => { assertPositionKept(errors, afterId, { ...state, lossPending: true, settled: 8 }); return [] } })
  await t.rejects(promoted.durable.answer(readOf({ offset: encodeOffset(9), live: 'long-poll' }), run, 'caller', fakeResponse().response),
    { code: 'unavailable', message: /whether offset names an event it lost/ })
  t.equal(durable.longPolls, 0, 'the refused long-polls gave their slots back')
})

t.test('an SSE read: the plan of a stream in the protocol\'s framing, up to date at a fresh tail, ended after DURABLE_STREAMS_SSE_MAX_MS', async (t) => {
  const { durable } = setup()
  const plan = async (query: Parameters<typeof readOf>[0]) => (await durable.answer(readOf(query), run, 'caller', fakeResponse().response) as DurableStreamPlan).stream
  const from = await plan({ offset: encodeOffset(7), live: 'sse', cursor: '5' })
  t.same(from.filter, run)
  t.match(from.start, { afterId: 7 })
  t.throws(() => assertPositionKept((from.start as { errors: Parameters<typeof assertPositionKept>[0] }).errors, 1, state), { message: /^offset is older/ }, 'its errors in the protocol\'s words')
  t.match(from.options, { catchUpToNow: true, maxMs: 60_000 })
  const format = from.options.format!(() => HEAD)
  t.match(format.position(HEAD), /^event: control\ndata:\{"streamNextOffset":"0000000000a","streamCursor":"\d+","upToDate":true\}\n\n$/)
  t.equal((await plan({ offset: 'now', live: 'sse' })).start, 'tail')
  t.equal((await plan({ offset: '-1', live: 'sse' })).start, 'oldest')
})

t.test('a stream of a run or thread that does not exist is a 404, before anything is read', async (t) => {
  const { durable, listeners } = setup({ existing: ['run-1', 'thread-1'] })
  await t.rejects(durable.answer(readOf({ offset: encodeOffset(HEAD), live: 'long-poll' }), { runId: 'run-2' }, 'caller', fakeResponse().response), { code: 'not_found', message: 'run not found' })
  await t.rejects(durable.answer(readOf({ live: 'sse', offset: 'now' }), { threadId: 'thread-2' }, 'caller', fakeResponse().response), { code: 'not_found', message: 'thread not found' })
  t.equal(listeners.size, 0)
  t.equal(durable.longPolls, 0)
})

t.test('subjects found are remembered for a while, within a bound, and a crowd arriving together asks once', async (t) => {
  const { db, counted } = fakeDb(['run-1', 'run-2', 'run-3', 'thread-1'])
  const subjects = new SubjectChecks(db, 2)
  const now = 1_000_000
  t.equal(subjects.check({}, now), undefined, 'every event\'s stream: nothing to check')
  await Promise.all([subjects.check({ runId: 'run-1' }, now), subjects.check({ runId: 'run-1' }, now)])
  t.equal(counted.queries, 1, 'a crowd: one query')
  t.equal(subjects.check({ runId: 'run-1' }, now + KNOWN_SUBJECT_MS - 1), undefined, 'known: no promise, no query')
  const later = subjects.check({ runId: 'run-1' }, now + KNOWN_SUBJECT_MS)
  t.ok(later, 'asked again after a while')
  await later
  await subjects.check({ threadId: 'thread-1' }, now)
  t.equal(subjects.check({ threadId: 'thread-1' }, now), undefined, 'threads are remembered apart')
  await subjects.check({ runId: 'run-2' }, now)
  t.equal(subjects.check({ runId: 'run-1' }, now), undefined, 'two runs remembered')
  await subjects.check({ runId: 'run-3' }, now)
  const forgotten = subjects.check({ runId: 'run-2' }, now)
  t.ok(forgotten, 'past the bound, the memory starts over')
  await forgotten
  t.equal(subjects.check({ runId: 'run-3' }, now), undefined)
  await t.rejects(subjects.check({ runId: 'run-4' }, now)!, { code: 'not_found', message: 'run not found' })
  const again = subjects.check({ runId: 'run-4' }, now)
  t.ok(again, 'a subject not found is not remembered')
  await t.rejects(again!, { code: 'not_found' })
})
