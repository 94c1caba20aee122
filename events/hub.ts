import type { FastifyBaseLogger, FastifyReply } from 'fastify'
import { setImmediate } from 'node:timers/promises'
import { eventsAfterKept, freshEventsAfterKept, pollAfter, reissuedRange, settledNow, settledNowWithState, type EventFilter, type LogState, type StoredEvent } from '../../../db/events.js'
import type { Db } from '../../../db/schema.js'
import { ApiError, cursorExpired, CursorBeyondError, cursorReissued, timelinePending } from '../../../errors.js'
import { Subscriber, type Listener, type StreamFormat, type SubscriberOptions } from './subscriber.js'
import { Waiter } from './waiter.js'
import type { StreamOffset } from './durable.js'
import { EventWindow } from './window.js'

export interface HubOptions {
  pollIntervalMs: number
  /** The safety net's poll interval while a wake-up source is live (EVENTS_WAKEUP_POLL_INTERVAL_MS). */
  wakeupPollIntervalMs: number
  keepAliveMs: number
  /** The most bytes of recent events kept in memory for catch-ups (EVENTS_WINDOW_BYTES; 0: none). */
  windowBytes: number
  /** The most streams open at once (SSE_MAX_STREAMS): past it, a new one is refused as a retry. */
  maxStreams: number
  /** The `retry:` sent at connect (SSE_RETRY_MS). */
  retryMs: number
  /** SSE_MAX_BUFFERED_BYTES and SSE_SLOW_CLIENT_TIMEOUT_MS: see Subscriber. */
  maxBufferedBytes: number
  slowClientMs: number
  log: FastifyBaseLogger
}

/**
 * Where a stream starts: after an event id a client gave (named `name` in
 * errors), at the current end, or at the oldest event kept.
 */
export type StreamStart = { afterId: number, name: string } | 'tail' | 'oldest'

/** A page of a Durable Streams read: its events, the settled position it reaches, and whether that is the head. */
export interface StreamPage {
  events: StoredEvent[]
  next: number
  upToDate: boolean
}

/** What makes a stream a Durable Streams SSE stream: its wire format (given the head it is up to date at), and when the server ends it. */
export interface DurableStreamOptions {
  format: (head: () => number) => StreamFormat
  maxMs: number
}

/** Events read per poll query; a poll reads pages until it is up to date. */
export const POLL_PAGE_SIZE = 1000

/** The least time between the starts of two polls that a wake-up asks for: bounds the polling on a busy database. */
export const WAKE_MIN_GAP_MS = 5

/**
 * A wake-up's poll that finds nothing new is repeated once after this long:
 * WAL may arrive before its commit is visible (on a hot standby, before it
 * is replayed). So is a poll that begins to wait on a hole: the second
 * sight of it asks the keeper to settle it (plugins/app/event-log.ts).
 */
export const WAKE_RECHECK_MS = 10

/** How long delivery may wait for an event writer in flight before the log says so. */
export const SETTLE_WAIT_LOG_MS = 5000

/** Events read per catch-up query of a stream that resumes from an older cursor. */
export const CATCH_UP_PAGE_SIZE = 500
/**
 * How long a catch-up read waits for a writer in flight below events
 * already committed, before it answers without them (not up to date).
 */
export const PENDING_WAIT_MS = 1000
/**
 * How long the fan-out answers long-polls before it lets the event loop
 * turn (the rest after it has): well under the load-shedding sample's
 * interval, so that a crowd's answers never starve it.
 */
export const ANSWER_TURN_MS = 100
/** Long-polls answered between two looks at the clock. */
export const ANSWERS_PER_CLOCK_LOOK = 128
/** How often the poller looks while a read waits on the head (headPast). */
const HEAD_WAIT_POLL_MS = 10

/**
 * Throws when a client's cursor (`name`) cannot be served as it stands:
 * below the history's floor, or inside a range of ids that a failover
 * handed out again (410 cursor_expired: the client refetches); above what
 * is settled while the database is on a timeline its keeper has not
 * recorded yet (a transient refusal: the client retries; the promoted
 * sequence may not have reached ids the old primary handed out); above
 * every id the sequence has handed out (400: it would wait forever). A
 * cursor merely ahead of the settled position waits.
 */
export function assertCursorKept (name: string, cursor: number, state: LogState): void {
  if (cursor < state.floor) throw cursorExpired(name, cursor, state.floor)
  const reissued = reissuedRange(state, cursor)
  if (reissued !== undefined) throw cursorReissued(name, cursor, ...reissued)
  if (state.newTimeline && cursor > state.settled) throw timelinePending(name)
  if (cursor > state.drawn) throw new CursorBeyondError(name, cursor, state.drawn)
}

/** A position as a client may be given it: inside a range reissued after a failover, the position that range starts at. */
export const reportable = (state: LogState, position: number) => reissuedRange(state, position)?.[0] ?? position

/**
 * The one poller of a process. Every pollIntervalMs it reads the events
 * committed since its head (one indexed query, however many subscribers)
 * and hands each to the subscribers whose filters match, found through
 * indexes by run and by thread rather than by scanning them all.
 *
 * Writers may commit ids out of order: the head is the SETTLED position,
 * never past an id that may still commit. Each poll reads, in one
 * statement, the events after the head and the event log's state, whose
 * settled position the keeper publishes (db/events.ts, LogState), then
 * hands out the events up to there and any run of ids just above it with
 * no hole. An event above a hole waits until the keeper settles it (the
 * hub tells it, onWaiting); how long delivery has waited is a metric, and
 * a log line past SETTLE_WAIT_LOG_MS. When the state starts a new epoch
 * (ids handed out again: a failover, a sequence moved back), the hub ends
 * the streams past the epoch's base and reads on from there.
 *
 * A wake-up source (wakeup.ts) calls wake() when something may have been
 * committed: the hub then polls at once, or when the poll in flight ends,
 * at most one poll every WAKE_MIN_GAP_MS, however many wake-ups and
 * subscribers. While the source is live, the timed poll is only a safety
 * net and runs every wakeupPollIntervalMs.
 *
 * What it hands out also goes into a window of recent events in memory
 * (window.ts), from which streams resuming from a recent cursor catch up
 * without reading the table.
 *
 * It owns the whole life of a stream (open): routes parse and validate,
 * and hand it the response.
 */
export class EventHub {
  /** The highest event id handed to subscribers; undefined until first read. */
  #head: number | undefined
  #initializing: Promise<number> | undefined
  /** The event log's state as the last poll read it (undefined before the first read). */
  #state: LogState | undefined
  /**
   * Called after each poll with how long an event has waited above a hole
   * (undefined when none waits): the keeper then settles sooner
   * (plugins/app/event-log.ts).
   */
  onWaiting: ((waitedMs: number | undefined) => void) | undefined
  #timelineLogged = false
  /** The WAL timeline the last poll read on (null on a hot standby, or before the first poll). */
  #readTimeline: number | null = null
  #timer: NodeJS.Timeout | undefined
  /** When the pending timer fires (epoch ms). */
  #dueAt = 0
  #polling = false
  /** A wake-up came while a poll was in flight: poll again when it ends. */
  #pollAgain = false
  /** The next poll answers a wake-up. */
  #woken = false
  #lastTickAt = 0
  /** Whether a wake-up source is live (set by it): the timed poll is then the slower safety net. */
  wakeupLive = false
  /** How long the fan-out answers long-polls before the loop turns (ANSWER_TURN_MS; a test makes it 0). */
  answerTurnMs = ANSWER_TURN_MS
  #stopped = false
  #failing = false
  #lastPollAt = 0
  /** The head at which delivery began to wait for a hole to settle, and since when (epoch ms). */
  #waitingAt: number | undefined
  #waitingSince = 0
  #waitLogged = false
  /** The last poll found a new hole to wait on: poll once more soon (it asks the keeper for a tick then). */
  #holeBegan = false
  readonly #subscribers = new Set<Subscriber>()
  readonly #waiters = new Set<Waiter>()
  /** Unfiltered listeners (streams and long-poll waiters), all under the key ''. */
  readonly #unfiltered = new Map<string, Set<Listener>>()
  readonly #byRun = new Map<string, Set<Listener>>()
  readonly #byThread = new Map<string, Set<Listener>>()
  #window: EventWindow | undefined
  /** Catch-ups served from the window and from the table, since start (a metric). */
  readonly catchUps = { memory: 0, database: 0 }

  readonly #subscriberOptions: SubscriberOptions
  /** Reads waiting for the head to pass a position (headPast). */
  readonly #headWaits = new Set<{ position: number, resolve: () => void }>()

  constructor (readonly db: Db, readonly options: HubOptions) {
    this.#subscriberOptions = {
      // A stream still catching up when the history's floor passes it ends: its client's reconnect gets the 410.
      readAfter: (afterId, filter) => this.#readAfter(afterId, filter, 'the stream\'s position'),
      pageSize: CATCH_UP_PAGE_SIZE,
      maxBufferedBytes: options.maxBufferedBytes,
      slowClientMs: options.slowClientMs,
      onDrop: (subscriber, reason, err) => {
        const details = { filter: subscriber.filter, lastId: subscriber.lastId }
        if (err instanceof ApiError && err.code === 'cursor_expired') {
          options.log.info(details, 'event stream ended: the history\'s floor passed it while it caught up (EVENTS_RETENTION); its client\'s reconnect is answered 410')
        } else {
          options.log.warn({ err, ...details }, `event stream ended: ${reason}`)
        }
      }
    }
  }

  get size (): number {
    return this.#subscribers.size
  }

  /** Durable Streams long-polls waiting for events. */
  get waiting (): number {
    return this.#waiters.size
  }

  /** Bytes written to streams and not yet taken by their clients, over all streams. */
  get bufferedBytes (): number {
    let total = 0
    for (const subscriber of this.#subscribers) total += subscriber.response.writableLength
    return total
  }

  /** The window of recent events (undefined before the first read). */
  get window (): EventWindow | undefined {
    return this.#window
  }

  /**
   * Up to `limit` events after `afterId` matching `filter`, from memory,
   * when the window holds every one of them; undefined when the table must
   * be read. Never past the head (the settled position).
   */
  recentAfter (afterId: number, filter: EventFilter, limit: number): StoredEvent[] | undefined {
    const window = this.#window
    if (window === undefined || !window.covers(afterId)) {
      this.catchUps.database++
      return undefined
    }
    this.catchUps.memory++
    return window.after(afterId, filter, limit)
  }

  /**
   * The history's floor rose (this process's upkeep dropped what lies at or
   * below it): the window stops serving those events at once, so that a
   * cursor below the floor reads the table and gets its 410, rather than
   * waiting for the next poll to learn it.
   */
  raiseFloor (floor: number): void {
    /* c8 ignore next: a drop before the first poll has nothing in memory to drop */
    this.#window?.raiseFloor(floor)
  }

  /**
   * Up to a page of events after `afterId`, never past `upTo` (a settled
   * head: what lies above it reaches a stream live), with the history's
   * floor: from the window of recent events when it holds them all (then
   * nothing after `afterId` has gone: the floor is not read), else from the
   * table, the floor read in the same statement.
   */
  async #readKept (afterId: number, filter: EventFilter, upTo: number): Promise<{ state: LogState, events: StoredEvent[] }> {
    // The window ends at the hub's head: a read up to a fresher position goes to the table. So does a
    // cursor above the ids drawn when the hub last polled: handed out since, or never (assertCursorKept).
    const recent = upTo > this.#head! || afterId > this.#state!.drawn ? undefined : this.recentAfter(afterId, filter, CATCH_UP_PAGE_SIZE)
    if (recent !== undefined) return { state: { ...this.#state!, floor: 0 }, events: recent }
    return eventsAfterKept(this.db, afterId, filter, CATCH_UP_PAGE_SIZE, upTo)
  }

  /** As #readKept, for a cursor named `name` that a client gave (assertCursorKept). */
  async #readAfter (afterId: number, filter: EventFilter, name: string, upTo = this.#head!): Promise<StoredEvent[]> {
    const { state, events } = await this.#readKept(afterId, filter, upTo)
    assertCursorKept(name, afterId, state)
    return events
  }

  /**
   * A catch-up page of a Durable Streams read (docs/reference.md, "Durable Streams"): the
   * events after `offset`, up to the settled head, and the position the
   * client resumes from (never below its own offset: a replica behind the
   * one that handed it out serves nothing until it catches up).
   *
   * `fresh` (a plain catch-up GET or HEAD, which says up to date): up to the
   * settled position of a snapshot taken now, as GET /api/events reads, so
   * that what was committed before the request is in it; the hub's head may
   * be a poll behind. A long-poll's own catch-up keeps the head (no query
   * per waiter: what lies above it comes from the hub's next polls).
   */
  async page (offset: StreamOffset, filter: EventFilter, name: string, fresh = false): Promise<StreamPage> {
    const known = await this.ready()
    // The tail is always as a read sees it now.
    if (offset === 'now') return { events: [], next: reportable(this.#state!, Math.max(known, await settledNow(this.db, known))), upToDate: true }
    if (!fresh) {
      if (offset !== 'oldest') return this.#pageOf(await this.#readAfter(offset, filter, name, known), Math.max(offset, known))
      return this.#oldestPage(await this.#readKept(0, filter, known), known)
    }
    // `settledBy`: a position settled before the read (the hub's head, once it moved past what the read waits for).
    const read = (settledBy: number) => freshEventsAfterKept(this.db, offset === 'oldest' ? 0 : offset, filter, CATCH_UP_PAGE_SIZE, settledBy)
    let fresher = await read(known)
    // Every event committed before this read is at or below `pendingTo`.
    const { pendingTo } = fresher
    if (pendingTo !== undefined && fresher.events.length < CATCH_UP_PAGE_SIZE) {
      // Some of them lie above the settled position, behind a writer in
      // flight: wait a little for it (the keeper settles most in
      // milliseconds), so that a client reading on does not spin.
      await this.headPast(pendingTo - 1, PENDING_WAIT_MS)
      fresher = await read(Math.max(known, this.#head!))
    }
    const { state, position, events } = fresher
    const head = Math.max(known, position)
    let page: StreamPage
    if (offset === 'oldest') {
      page = this.#oldestPage({ state, events }, head)
    } else {
      assertCursorKept(name, offset, state)
      page = this.#pageOf(events, Math.max(offset, head))
    }
    // Up to date only with every matching event committed before the read.
    return pendingTo !== undefined && position < pendingTo ? { ...page, upToDate: false } : page
  }

  /** A page from `-1`: it starts above the floor (rows at or below it may linger until their partition goes). */
  #oldestPage ({ state, events }: { state: LogState, events: StoredEvent[] }, head: number): StreamPage {
    return { ...this.#pageOf(events, head), events: events.filter((event) => event.id > state.floor) }
  }

  /** Resolves once the head is past `position` (or at once, if it is), or after `maxMs`. */
  headPast (position: number, maxMs: number): Promise<void> {
    if (this.#head! > position || this.#stopped) return Promise.resolve()
    return new Promise((resolve) => {
      const entry = { position, resolve: () => { clearTimeout(timer); this.#headWaits.delete(entry); resolve() } }
      const timer = setTimeout(entry.resolve, maxMs)
      this.#headWaits.add(entry)
      this.wake()
    })
  }

  /**
   * A page of `events`: a full one resumes after its last event, any other
   * at `head` (everything matching up to it was read), or past it when the
   * window moved on while it was read.
   */
  #pageOf (events: StoredEvent[], head: number): StreamPage {
    const full = events.length >= CATCH_UP_PAGE_SIZE
    const last = events.at(-1)?.id ?? head
    return { events, next: full ? last : reportable(this.#state!, Math.max(head, last)), upToDate: !full }
  }

  /**
   * A long-poll of a Durable Streams read: the catch-up page when it has
   * events, else the events that the hub's next polls hand out, from
   * memory, as soon as a poll ends with one (no query per waiter), else,
   * after `timeoutMs` or when the client goes away (`whenGone` calls the
   * function it is handed), none and the head.
   */
  async longPoll (offset: StreamOffset, filter: EventFilter, name: string, timeoutMs: number, whenGone: (stop: () => void) => void): Promise<StreamPage> {
    const head = await this.ready()
    const waiter = new Waiter(filter, offset === 'now' ? head : offset === 'oldest' ? 0 : offset, CATCH_UP_PAGE_SIZE)
    // Listening before the catch-up read, for the reason a stream subscribes first (open).
    this.#waiters.add(waiter)
    this.#listen(waiter)
    try {
      if (offset === 'now') {
        // The tail as a plain read sees it now (the hub's head may be a poll behind): only what commits after it.
        waiter.raiseTo((await this.page('now', filter, name, true)).next)
      } else {
        const page = await this.page(offset, filter, name)
        if (page.events.length > 0) return page
      }
      await waiter.wait(timeoutMs, whenGone)
    } finally {
      this.#waiters.delete(waiter)
      this.#unlisten(waiter)
    }
    // Between two awaits the head covers every event handed out.
    return this.#pageOf(waiter.events, Math.max(waiter.afterId, this.#head!))
  }

  /**
   * Opens a stream on `reply` (an @fastify/sse reply): every committed
   * event matching `filter` after `start`, exactly once, ascending, then
   * live; in the Durable Streams SSE format, and ended after a while, when
   * `durable` says so. Throws before any byte is sent (410, or a transient
   * refusal the error handler answers as a retry); after that, failures end
   * the stream and its client resumes from its last position.
   */
  async open (reply: FastifyReply, filter: EventFilter, start: StreamStart, durable?: DurableStreamOptions): Promise<void> {
    if (this.size >= this.options.maxStreams) {
      throw new ApiError('unavailable', `this instance already serves ${this.options.maxStreams} event streams, retry shortly or on another instance`)
    }
    const known = await this.ready()
    // A Durable Streams read says when it is up to date: it reads up to the
    // position a read now sees (the hub's head may be a poll behind), set below.
    let upTo = 0
    const head = () => Math.max(this.#head!, upTo)
    const options = durable === undefined
      ? this.#subscriberOptions
      : { ...this.#subscriberOptions, readAfter: (afterId: number, filter: EventFilter) => this.#readAfter(afterId, filter, 'the stream\'s position', head()) }
    const subscriber = new Subscriber(reply.raw, filter, typeof start === 'object' ? start.afterId : 0, options, durable?.format(head))
    // Subscribed before reading the table: whatever the hub polls from now
    // on reaches this subscriber, and whatever it polled before, the reads
    // below see (see docs/stream.md, "How it works", for the argument).
    this.#subscribe(subscriber)
    reply.sse.onClose(() => this.#unsubscribe(subscriber))

    let firstPage: StoredEvent[] | undefined = []
    try {
      if (start === 'tail') {
        subscriber.lastId = await settledNow(this.db, known)
      } else {
        if (durable !== undefined) upTo = await settledNow(this.db, known)
        if (start === 'oldest') {
          const { state: { floor }, events } = await this.#readKept(0, filter, head())
          subscriber.lastId = floor
          // Rows at or below the floor that linger: the catch-up reads again from the floor.
          firstPage = events.some((event) => event.id <= floor) ? undefined : events
        } else {
          firstPage = await this.#readAfter(start.afterId, filter, start.name, head())
        }
      }
    } catch (err) {
      this.#unsubscribe(subscriber)
      throw err // before any byte is sent: the client gets the 410 envelope, or a retry (plugins/app/errors.ts)
    }

    if (!reply.sse.isConnected) return
    reply.sse.keepAlive()
    reply.sse.sendHeaders()
    if (durable !== undefined) {
      // The protocol's SSE connections end now and then, so that a cache in front collapses the reconnects.
      const timer = setTimeout(() => subscriber.end(), durable.maxMs)
      reply.raw.once('close', () => clearTimeout(timer))
    }
    subscriber.write(`retry: ${this.options.retryMs}\n\n`)
    await subscriber.catchUp(firstPage)
  }

  /** The highest event id handed to subscribers (undefined before the first read). */
  get head (): number | undefined {
    return this.#head
  }

  /** When a poll last completed (epoch ms; 0 before the first): its lag is the metric. */
  get lastPollAt (): number {
    return this.#lastPollAt
  }

  /** Seconds delivery has waited for an id in flight to settle (0 when it is not waiting). */
  get settleWaitSeconds (): number {
    return this.#waitingAt === undefined ? 0 : (Date.now() - this.#waitingSince) / 1000
  }

  /** The event log's state as the last poll read it (undefined before the first read). */
  get state (): LogState | undefined {
    return this.#state
  }

  /**
   * The settled position, read from the database on first use (once,
   * however many callers wait): the keeper's, extended over the visible
   * ids above it, whatever the history's size and holes.
   */
  ready (): Promise<number> {
    if (this.#head !== undefined) return Promise.resolve(this.#head)
    this.#initializing ??= settledNowWithState(this.db, 0).then(({ position, state }) => {
      this.#state ??= state
      this.#head ??= position
      this.#window ??= new EventWindow(this.#head, this.options.windowBytes)
      return this.#head
    }).finally(() => { this.#initializing = undefined })
    return this.#initializing
  }

  start (): void {
    this.#schedule(this.options.pollIntervalMs)
  }

  /** Something may have been committed: poll as soon as the rate bound allows (see the class comment). */
  wake (): void {
    if (this.#stopped) return
    this.#woken = true
    if (this.#polling) {
      this.#pollAgain = true
      return
    }
    this.#schedule(this.#lastTickAt + WAKE_MIN_GAP_MS - Date.now())
  }

  /** Stops polling and ends every stream. */
  stop (): void {
    this.#stopped = true
    clearTimeout(this.#timer)
    this.endAll()
    for (const waiter of this.#waiters) waiter.release()
    for (const wait of this.#headWaits) wait.resolve()
  }

  /** Ends every open stream cleanly; their clients reconnect and resume from their last id. */
  endAll (): void {
    for (const subscriber of this.#subscribers) subscriber.end()
  }

  #subscribe (subscriber: Subscriber): void {
    this.#subscribers.add(subscriber)
    this.#listen(subscriber)
  }

  /** Idempotent: a stream may be released by its close and by a failed start alike. */
  #unsubscribe (subscriber: Subscriber): void {
    if (this.#subscribers.delete(subscriber)) this.#unlisten(subscriber)
  }

  #listen (listener: Listener): void {
    const { index, key } = this.#indexOf(listener)
    let set = index.get(key)
    if (set === undefined) index.set(key, set = new Set())
    set.add(listener)
  }

  #unlisten (listener: Listener): void {
    const { index, key } = this.#indexOf(listener)
    const set = index.get(key)!
    set.delete(listener)
    if (set.size === 0) index.delete(key)
  }

  /** Where a listener is found by fan-out: by its run, else by its thread, else among the unfiltered. */
  #indexOf (listener: Listener): { index: Map<string, Set<Listener>>, key: string } {
    const { runId, threadId } = listener.filter
    if (runId !== undefined) return { index: this.#byRun, key: runId }
    if (threadId !== undefined) return { index: this.#byThread, key: threadId }
    return { index: this.#unfiltered, key: '' }
  }

  /** Reads and hands out every event settled since the head. */
  async #poll (): Promise<void> {
    let head = await this.ready()
    let hole = false
    for (;;) {
      const { state, events, waiting } = await pollAfter(this.db, head, POLL_PAGE_SIZE)
      if (state.epoch !== this.#state!.epoch) {
        this.#startEpoch(state)
        head = this.#head!
        continue
      }
      this.#state = state
      if (state.newTimeline && this.#readTimeline !== null && state.timeline !== this.#readTimeline) {
        // This hub read a primary that is gone; its head may hold ids the promoted standby lost. What
        // was lost is known once the keeper records the new timeline (a new epoch): until then, wait.
        if (!this.#timelineLogged) this.options.log.warn({ head }, 'the database is on a new WAL timeline (a standby was promoted): delivery waits until the event log\'s keeper records it')
        this.#timelineLogged = true
        hole = true
        break
      }
      this.#timelineLogged = false
      this.#readTimeline = state.timeline
      const window = this.#window!
      window.raiseFloor(state.floor)
      let settled = Math.max(head, state.settled)
      // Events above a hole, not read again while it waits.
      if (waiting) hole = true
      for (const event of events) {
        if (event.id > settled + 1) {
          hole = true
          break
        }
        settled = Math.max(settled, event.id)
        this.#fanOut(event)
        window.append(event)
        head = event.id
      }
      const readAll = hole || events.length < POLL_PAGE_SIZE
      // Every visible event up to `settled` has been handed out: the rest of
      // the range is ids that will never commit.
      if (readAll) head = settled
      this.#head = head
      window.advance(head)
      if (readAll) break
    }
    this.#lastPollAt = Date.now()
    this.#noteWait(hole)
    this.onWaiting?.(hole ? this.#lastPollAt - this.#waitingSince : undefined)
    // Everything up to the head is handed out: the long-polls that got
    // events answer, for at most answerTurnMs at a time, then the loop
    // turns (timers, other requests, the load-shedding sample) and the rest
    // answer. Turns of a fixed count were worse for a crowd of 5,000: the
    // re-polls of each batch are read before the next batch is answered
    // (p50 / p99 290 / 647 ms at 200 a turn, 191 / 539 at 2,000; all 5,000,
    // about 100 ms here, in one turn: BENCHMARKS.md).
    let answered = 0
    let turnBegan = performance.now()
    for (const waiter of this.#waiters) {
      if (!waiter.settled() || ++answered % ANSWERS_PER_CLOCK_LOOK !== 0) continue
      if (performance.now() - turnBegan < this.answerTurnMs) continue
      await setImmediate()
      turnBegan = performance.now()
    }
    for (const wait of this.#headWaits) if (head > wait.position) wait.resolve()
    // Reads still wait on the head: poll again soon (one statement for all of them).
    if (this.#headWaits.size > 0) this.#schedule(HEAD_WAIT_POLL_MS)
  }

  /**
   * The keeper started a new epoch: ids after its base may have been handed
   * out again. Streams that went past the base end (their clients reconnect
   * and learn, by a 410, to refetch), the window empties, long-polls past
   * the base answer as they stand, and reading goes on from the base.
   */
  #startEpoch (state: LogState): void {
    const base = state.epochBase
    this.options.log.warn({ epoch: state.epoch, base, head: this.#head, reissued: state.reissued },
      `the event log started a new epoch (a failover, or its sequence moved back): ids after ${base} may have been handed out again; streams past it end, and their clients refetch`)
    this.#state = state
    this.#readTimeline = state.timeline
    for (const subscriber of this.#subscribers) if (subscriber.lastId > base) subscriber.end()
    for (const waiter of this.#waiters) if (waiter.afterId > base) waiter.release()
    this.#head = Math.min(this.#head!, base)
    this.#window = new EventWindow(this.#head, this.options.windowBytes)
    this.#waitingAt = undefined
  }

  /** Tracks how long an event above a hole has waited, and says so once it passes SETTLE_WAIT_LOG_MS. */
  #noteWait (hole: boolean): void {
    this.#holeBegan = hole && this.#head !== this.#waitingAt
    if (!hole || this.#head !== this.#waitingAt) {
      if (this.#waitLogged) this.options.log.info({ head: this.#head, waitedSeconds: this.settleWaitSeconds }, 'event delivery resumed: the id it waited for settled')
      this.#waitLogged = false
      this.#waitingAt = hole ? this.#head : undefined
      this.#waitingSince = this.#lastPollAt
      return
    }
    if (!this.#waitLogged && this.#lastPollAt - this.#waitingSince >= SETTLE_WAIT_LOG_MS) {
      this.#waitLogged = true
      const { waitingPid, waitingTransaction, settledAge, preparedWriters } = this.#state!
      // A state the keeper has not refreshed in a while may name a writer long gone: say how old it is instead.
      const why = settledAge > SETTLE_WAIT_LOG_MS / 1000
        ? `the settled position was last published ${Math.round(settledAge)} s ago; it moves only while a replica keeps the event log on the primary, and a hot standby sees it once it replays it (docs/stream.md, "How the event order is settled")`
        : waitingTransaction !== null
        ? `a prepared transaction ('${waitingTransaction}') drew an event id and is still open: COMMIT PREPARED or ROLLBACK PREPARED '${waitingTransaction}' releases it (pg_prepared_xacts lists it)`
        : `a transaction that drew an event id (or used the events sequence) is still open, backend ${waitingPid} (pg_stat_activity tells what it is doing)`
      this.options.log.warn({ head: this.#head, waitingPid, waitingTransaction, preparedWriters, settledAgeSeconds: settledAge, waitedSeconds: this.settleWaitSeconds },
        `event delivery waits past id ${this.#head}: ${why}`)
    }
  }

  /** Heartbeats for the streams that have been quiet for keepAliveMs. */
  #sweep (now: number): void {
    if (this.#head === undefined) return
    for (const subscriber of this.#subscribers) subscriber.heartbeat(now, this.#head, this.options.keepAliveMs)
  }

  #fanOut (event: StoredEvent): void {
    const unfiltered = this.#unfiltered.get('')
    if (unfiltered !== undefined) for (const listener of unfiltered) listener.offer(event)
    const byRun = this.#byRun.get(event.runId)
    if (byRun !== undefined) for (const listener of byRun) if (listener.matches(event)) listener.offer(event)
    const byThread = this.#byThread.get(event.threadId)
    if (byThread !== undefined) for (const listener of byThread) listener.offer(event)
  }

  /** Polls in `delayMs`, unless a poll is due sooner already. */
  #schedule (delayMs: number): void {
    if (this.#stopped) return
    const delay = Math.max(0, delayMs)
    const dueAt = Date.now() + delay
    if (this.#timer !== undefined) {
      if (this.#dueAt <= dueAt) return
      clearTimeout(this.#timer)
    }
    this.#dueAt = dueAt
    this.#timer = setTimeout(() => {
      this.#timer = undefined
      void this.#tick()
    }, delay)
  }

  async #tick (): Promise<void> {
    const woken = this.#woken
    this.#woken = false
    this.#polling = true
    this.#lastTickAt = Date.now()
    const headBefore = this.#head
    try {
      await this.#poll()
      if (this.#failing) this.options.log.info('event poller recovered')
      this.#failing = false
    } catch (err) {
      // The database is away: streams stay open and resume when it is back.
      if (!this.#failing) this.options.log.warn({ err }, 'event poller cannot read events; retrying')
      this.#failing = true
    }
    this.#polling = false
    this.#sweep(Date.now())
    if (this.#pollAgain) {
      this.#pollAgain = false
      this.#woken = true
      this.#schedule(this.#lastTickAt + WAKE_MIN_GAP_MS - Date.now())
    } else if ((woken && this.#head === headBefore) || this.#holeBegan) {
      this.#schedule(WAKE_RECHECK_MS)
    }
    this.#schedule(this.wakeupLive ? this.options.wakeupPollIntervalMs : this.options.pollIntervalMs)
  }
}
