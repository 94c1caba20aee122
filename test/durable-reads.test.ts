import t from 'tap'
import { ApiError } from '../errors.ts'
import { DurableReads } from '../events/durable/reads.ts'
import { Waiter } from '../events/durable/waiter.ts'
import type { EventHub, Listener } from '../events/hub.ts'
import type { LogState, StoredEvent } from '../events/statements.ts'
import type { EventReader } from '../events/reader.ts'

// A long-poll from a recent offset (a crowd's every re-poll) takes a path
// with no await before its wait: what it reads from the window answers at
// once, a cursor the window refuses rejects, and either way it leaves
// nothing listening on the hub. Here with a hub and a reader of its own,
// so that each case is certain (the HTTP tests: durable-streams.test.ts).

const HEAD = 10
const state: LogState = { settled: HEAD, floor: 0, epoch: 1, epochBase: 0, reissued: [], lossPending: false, waitingPid: null, waitingTransaction: null, preparedWriters: 0, settledAge: 0, drawn: HEAD }
const event = (id: number): StoredEvent => ({ id, runId: 'run-1', threadId: '', json: `{"event_id":${id}}` })

function setup (recent: (afterId: number) => StoredEvent[] | undefined, longPolls = { max: 100, maxPerCaller: 100 }) {
  const listeners = new Set<Listener>()
  const hub = { tail: HEAD, state, listen: (listener: Listener) => listeners.add(listener), unlisten: (listener: Listener) => listeners.delete(listener) }
  const reader = { recentKeptAfter: (afterId: number) => recent(afterId) }
  return { listeners, reads: new DurableReads(undefined as never, hub as unknown as EventHub, reader as unknown as EventReader, longPolls) }
}

const noGone = () => {}

t.test('events the window holds past the offset: answered at once', async (t) => {
  const { listeners, reads } = setup(() => [event(9), event(10)])
  const page = await reads.longPoll(8, { runId: 'run-1' }, 1000, noGone, 'caller')
  t.same(page.events.map((e) => e.id), [9, 10])
  t.equal(page.next, HEAD)
  t.equal(listeners.size, 0, 'nothing left listening')
  t.equal(reads.waiting, 0)
})

t.test('a cursor the window refuses (a range reissued after a failover): rejected, nothing left listening', async (t) => {
  const refused = new ApiError('cursor_expired', 'lost in a failover')
  const { listeners, reads } = setup(() => { throw refused })
  await t.rejects(reads.longPoll(8, { runId: 'run-1' }, 1000, noGone, 'caller'), refused)
  t.equal(listeners.size, 0)
  t.equal(reads.waiting, 0)
  t.equal(reads.longPolls, 0, 'and its slot given back')
})

t.test('nothing yet: waits on the hub, and answers what a poll hands out', async (t) => {
  const { listeners, reads } = setup(() => [])
  const answer = reads.longPoll(HEAD, { runId: 'run-1' }, 10_000, noGone, 'caller')
  t.equal(listeners.size, 1, 'listening')
  t.equal(reads.waiting, 1)
  const [waiter] = listeners
  t.ok(waiter instanceof Waiter)
  waiter!.offer(event(HEAD + 1))
  t.ok((waiter as Waiter).answer(), 'a poll ends with an event kept: it answers')
  const page = await answer
  t.same(page.events.map((e) => e.id), [HEAD + 1])
  t.equal(listeners.size, 0, 'and listens no more')
})

t.test('one caller at its share of long-polls is refused, another is not; a long-poll gives its slot back when it ends', async (t) => {
  const { listeners, reads } = setup(() => [], { max: 3, maxPerCaller: 2 })
  const leave: Array<() => void> = []
  const whenGone = (stop: () => void) => { leave.push(stop) }
  const poll = (caller: string) => reads.longPoll(HEAD, { runId: 'run-1' }, 10_000, whenGone, caller)
  const held = [poll('a'), poll('a')]
  await t.rejects(poll('a'), { code: 'too_many_requests', statusCode: 429, kind: 'long-poll', reason: 'caller', message: /already holds 2 long-polls .*DURABLE_STREAMS_MAX_LONG_POLLS_PER_CALLER/ })
  held.push(poll('b'))
  t.equal(reads.longPolls, 3, 'another caller still gets one')
  await t.rejects(poll('c'), { code: 'unavailable', statusCode: 503, kind: 'long-poll', reason: 'instance', message: /already serves 3 long-polls/ })
  t.same(reads.refused, { instance: 1, caller: 1 })
  t.equal(listeners.size, 3, 'the refused ones never listened')
  // Their clients leave: the waits end, and the slots come back.
  for (const stop of leave) stop()
  await Promise.all(held)
  t.equal(reads.longPolls, 0)
  const again = poll('a')
  t.equal(reads.longPolls, 1, 'a slot given back is a slot to take')
  leave.at(-1)!()
  await again
})
