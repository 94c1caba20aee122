import type { Db } from '../../db/schema.ts'
import type { EventHub } from '../hub.ts'
import { CallerSlots, type Limit } from '../limits.ts'
import { freshEventsAfterKept, settledNow, type EventFilter, type LogState, type StoredEvent } from '../statements.ts'
import { assertPositionKept, CATCH_UP_PAGE_SIZE, reportable, type EventReader } from '../reader.ts'
import { OFFSET_ERRORS, type StreamOffset } from './offsets.ts'
import { Waiter } from './waiter.ts'

/** A page of a Durable Streams read: its events, the settled position it reaches, and whether that is the tail. */
export interface StreamPage {
  events: StoredEvent[]
  next: number
  upToDate: boolean
}

/**
 * How long a catch-up read waits for a writer in flight below events
 * already committed, before it answers without them (not up to date).
 */
export const PENDING_WAIT_MS = 1000

/**
 * The Durable Streams reads that answer with a page (docs/reference.md,
 * "Durable Streams"): a catch-up (at once) and a long-poll (waiting in
 * memory on the hub's fan-out, no query per waiter). Their SSE mode is a
 * stream (sse/streams.ts).
 */
export class DurableReads {
  readonly #waiters = new Set<Waiter>()
  readonly #slots: CallerSlots

  /** `longPolls`: the most long-polls at once (DURABLE_STREAMS_MAX_LONG_POLLS), and held by one caller (DURABLE_STREAMS_MAX_LONG_POLLS_PER_CALLER). */
  private readonly db: Db
  private readonly hub: EventHub
  private readonly reader: EventReader

  constructor (db: Db, hub: EventHub, reader: EventReader, longPolls: Limit) {
    this.db = db
    this.hub = hub
    this.reader = reader
    this.#slots = new CallerSlots('long-poll', longPolls)
  }

  /** Long-polls waiting for events. */
  get waiting (): number {
    return this.#waiters.size
  }

  /** Long-polls being answered, from their arrival to their answer (or their client's leaving). */
  get longPolls (): number {
    return this.#slots.total
  }

  /** Long-polls refused at DURABLE_STREAMS_MAX_LONG_POLLS (`instance`) and at DURABLE_STREAMS_MAX_LONG_POLLS_PER_CALLER (`caller`). */
  get refused (): Readonly<CallerSlots['refused']> {
    return this.#slots.refused
  }

  /**
   * A catch-up page: the events after `offset`, up to the tail,
   * and the position the client resumes from (never below its own offset:
   * a replica behind the one that handed it out serves nothing until it
   * catches up).
   *
   * `fresh` (a plain catch-up GET or HEAD, which says up to date): up to the
   * settled position of a snapshot taken now, as GET /api/events reads, so
   * that what was committed before the request is in it; the hub's tail may
   * be a poll behind. A long-poll's own catch-up keeps the tail (no query
   * per waiter: what lies above it comes from the hub's next polls).
   */
  async page (offset: StreamOffset, filter: EventFilter, fresh = false): Promise<StreamPage> {
    const { hub, reader } = this
    const known = await hub.ready()
    // The tail is always as a read sees it now.
    if (offset === 'now') return { events: [], next: reportable(hub.state!, Math.max(known, await settledNow(this.db, known))), upToDate: true }
    if (!fresh) {
      if (offset !== 'oldest') return this.#pageOf(await reader.readAfter(offset, filter, OFFSET_ERRORS, known), Math.max(offset, known))
      return this.#oldestPage(await reader.readKept(0, filter, known), known)
    }
    // `settledBy`: a position settled before the read (the hub's tail, once it moved past what the read waits for).
    const read = (settledBy: number) => freshEventsAfterKept(this.db, offset === 'oldest' ? 0 : offset, filter, CATCH_UP_PAGE_SIZE, settledBy)
    let fresher = await read(known)
    // Every event committed before this read is at or below `pendingTo`.
    const { pendingTo } = fresher
    if (pendingTo !== undefined && fresher.events.length < CATCH_UP_PAGE_SIZE) {
      // Some of them lie above the settled position, behind a writer in
      // flight: wait a little for it (the keeper settles most in
      // milliseconds), so that a client reading on does not spin.
      await hub.tailPast(pendingTo - 1, PENDING_WAIT_MS)
      fresher = await read(Math.max(known, hub.tail!))
    }
    const { state, position, events } = fresher
    const tail = Math.max(known, position)
    let page: StreamPage
    if (offset === 'oldest') {
      page = this.#oldestPage({ state, events }, tail)
    } else {
      assertPositionKept(OFFSET_ERRORS, offset, state)
      page = this.#pageOf(events, Math.max(offset, tail))
    }
    // Up to date only with every matching event committed before the read.
    return pendingTo !== undefined && position < pendingTo ? { ...page, upToDate: false } : page
  }

  /**
   * A long-poll: the catch-up page when it has events, else the events
   * that the hub's next polls hand out, from memory, as soon as a poll ends
   * with one (no query per waiter), else, after `timeoutMs` or when the
   * client goes away (`whenGone` calls the function it is handed), none and
   * the tail. It holds one of `caller`'s slots (see CallerSlots) until it
   * answers; refused (a LimitRefusal) when none is left.
   */
  longPoll (offset: StreamOffset, filter: EventFilter, timeoutMs: number, whenGone: (stop: () => void) => void, caller: string): Promise<StreamPage> {
    try {
      this.#slots.take(caller)
    } catch (err) {
      return Promise.reject(err)
    }
    const release = () => { this.#slots.release(caller) }
    return this.#longPoll(offset, filter, timeoutMs, whenGone).then((page) => { release(); return page }, (err: unknown) => { release(); throw err })
  }

  #longPoll (offset: StreamOffset, filter: EventFilter, timeoutMs: number, whenGone: (stop: () => void) => void): Promise<StreamPage> {
    if (typeof offset !== 'number' || this.hub.tail === undefined) return this.#longPollFrom(offset, filter, timeoutMs, whenGone)
    // A re-poll from a recent offset (a crowd's every poll) is read from the
    // window at once, and waits with no await before it: an async frame kept
    // for each waiting request is what a crowd's scavenges copy. The read and
    // the listening are in one turn, so no event can come between them.
    let page: StreamPage | undefined
    try {
      page = this.#recentPage(offset, filter)
    } catch (err) {
      return Promise.reject(err)
    }
    if (page === undefined) return this.#longPollFrom(offset, filter, timeoutMs, whenGone)
    if (page.events.length > 0) return Promise.resolve(page)
    const waiter = this.#listen(new Waiter(filter, offset, CATCH_UP_PAGE_SIZE))
    return waiter.wait(timeoutMs, whenGone).then(() => this.#answer(waiter))
  }

  /** longPoll, when the hub is starting, the offset is `now` or `-1`, or the window does not reach back to it. */
  async #longPollFrom (offset: StreamOffset, filter: EventFilter, timeoutMs: number, whenGone: (stop: () => void) => void): Promise<StreamPage> {
    const tail = await this.hub.ready()
    // Listening before the catch-up read, for the reason a stream subscribes first (sse/streams.ts).
    const waiter = this.#listen(new Waiter(filter, offset === 'now' ? tail : offset === 'oldest' ? 0 : offset, CATCH_UP_PAGE_SIZE))
    try {
      if (offset === 'now') {
        // The tail as a plain read sees it now (the hub's tail may be a poll behind): only what commits after it.
        waiter.raiseTo((await this.page('now', filter, true)).next)
      } else {
        const page = (offset === 'oldest' ? undefined : this.#recentPage(offset, filter)) ?? await this.page(offset, filter)
        if (page.events.length > 0) {
          this.#unlisten(waiter)
          return page
        }
      }
    } catch (err) {
      this.#unlisten(waiter)
      throw err
    }
    await waiter.wait(timeoutMs, whenGone)
    return this.#answer(waiter)
  }

  #listen (waiter: Waiter): Waiter {
    this.#waiters.add(waiter)
    this.hub.listen(waiter)
    return waiter
  }

  #unlisten (waiter: Waiter): void {
    this.#waiters.delete(waiter)
    this.hub.unlisten(waiter)
  }

  /** A wait is over: what the waiter kept, up to the tail (between two awaits it covers every event handed out). */
  #answer (waiter: Waiter): StreamPage {
    this.#unlisten(waiter)
    return this.#pageOf(waiter.events, Math.max(waiter.afterId, this.hub.tail!))
  }

  /** page()'s answer for `offset` from the window of recent events, without a promise; undefined when the table must be read. */
  #recentPage (offset: number, filter: EventFilter): StreamPage | undefined {
    const events = this.reader.recentKeptAfter(offset, filter, OFFSET_ERRORS)
    return events === undefined ? undefined : this.#pageOf(events, Math.max(offset, this.hub.tail!))
  }

  /** A page from `-1`: it starts above the floor (rows at or below it may linger until their partition goes). */
  #oldestPage ({ state, events }: { state: LogState, events: StoredEvent[] }, tail: number): StreamPage {
    return { ...this.#pageOf(events, tail), events: events.filter((event) => event.id > state.floor) }
  }

  /**
   * A page of `events`: a full one resumes after its last event, any other
   * at `tail` (everything matching up to it was read), or past it when the
   * window moved on while it was read.
   */
  #pageOf (events: StoredEvent[], tail: number): StreamPage {
    const full = events.length >= CATCH_UP_PAGE_SIZE
    const last = events.at(-1)?.id ?? tail
    return { events, next: full ? last : reportable(this.hub.state!, Math.max(tail, last)), upToDate: !full }
  }
}
