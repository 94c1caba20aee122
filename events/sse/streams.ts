import type { FastifyBaseLogger, FastifyReply } from 'fastify'
import type { Db } from '../../db/schema.ts'
import { ApiError, eventIdErrorsNamed, shuttingDown, type PositionErrors } from '../../errors.ts'
import type { EventHub } from '../hub.ts'
import { CallerSlots } from '../limits.ts'
import { settledNow, type EventFilter, type StoredEvent } from '../statements.ts'
import { countSent } from '../sent.ts'
import { CATCH_UP_PAGE_SIZE, type EventReader } from '../reader.ts'
import { Subscriber, type StreamFormat, type SubscriberOptions } from './subscriber.ts'

export interface StreamsOptions {
  keepAliveMs: number
  /** The most streams open at once (SSE_MAX_STREAMS), and held by one caller (SSE_MAX_STREAMS_PER_CALLER): past either, a new one is refused as a retry. */
  maxStreams: number
  maxStreamsPerCaller: number
  /** The `retry:` sent at connect (SSE_RETRY_MS). */
  retryMs: number
  /** SSE_MAX_BUFFERED_BYTES and SSE_SLOW_CLIENT_TIMEOUT_MS: see Subscriber. */
  maxBufferedBytes: number
  slowClientMs: number
  log: FastifyBaseLogger
}

/**
 * Where a stream starts: after an event id a client gave (its errors in
 * the words of `errors`), at the current end, or at the oldest event kept.
 */
export type StreamStart = { afterId: number, errors: PositionErrors } | 'tail' | 'oldest'

/** A stream other than the event stream's own (docs/reference.md, "The event stream"), as the Durable Streams SSE mode is. */
export interface StreamOptions {
  /** Its wire format, given the tail that it is up to date at. */
  format?: (tail: () => number) => StreamFormat
  /**
   * Catches up to the position a read sees when the stream opens, not
   * only to the hub's tail (which may be a poll behind): a format that
   * says it is up to date then has every event committed before.
   */
  catchUpToNow?: boolean
  /** Ends the stream after so long; its client resumes. */
  maxMs?: number
}

/** A stream's own position, in the words of what a stream that falls behind logs. */
const STREAM_POSITION = eventIdErrorsNamed('the stream\'s position')

/**
 * The most often the streams are looked at for keep-alives: once a second,
 * or a tenth of SSE_KEEPALIVE_MS if that is shorter. The hub ticks after
 * every poll (up to one each WAKE_MIN_GAP_MS while writers are busy), and
 * a look at every stream after each took 0.7 ms at 5,000 streams
 * (BENCHMARKS.md, "Streams on Node 24"); a keep-alive is due seconds apart.
 */
export const SWEEP_MAX_INTERVAL_MS = 1000

/**
 * The life of every open stream, from the route's reply to its end: the
 * stream limit, the subscription to the hub's fan-out, the first read and
 * the catch-up (from the event reader), then live events, keep-alives and
 * the end. Routes parse and validate, then hand it the reply.
 */
export class EventStreams {
  /** Every open stream, with the caller whose slot it holds. */
  readonly #subscribers = new Map<Subscriber, string>()
  readonly #slots: CallerSlots
  /** When the streams were last looked at for keep-alives (sweep). */
  #sweptAt = 0
  readonly #subscriberOptions: SubscriberOptions

  private readonly db: Db
  private readonly hub: EventHub
  private readonly reader: EventReader
  readonly options: StreamsOptions

  constructor (db: Db, hub: EventHub, reader: EventReader, options: StreamsOptions) {
    this.db = db
    this.hub = hub
    this.reader = reader
    this.options = options
    this.#slots = new CallerSlots('stream', { max: options.maxStreams, maxPerCaller: options.maxStreamsPerCaller })
    this.#subscriberOptions = {
      // A stream still catching up when the history's floor passes it ends: its client's reconnect gets the 410.
      readAfter: (afterId, filter) => reader.readAfter(afterId, filter, STREAM_POSITION),
      pageSize: CATCH_UP_PAGE_SIZE,
      maxBufferedBytes: options.maxBufferedBytes,
      slowClientMs: options.slowClientMs,
      onDrop: (subscriber, reason, err) => {
        const details = { filter: subscriber.filter, lastId: subscriber.lastId }
        if (err instanceof ApiError && err.code === 'cursor_expired') {
          options.log.info(details, 'event stream ended: the history\'s floor passed it while it caught up (EVENTS_RETENTION); its client\'s ' +
            'reconnect is answered 410')
        } else {
          options.log.warn({ err, ...details }, `event stream ended: ${reason}`)
        }
      }
    }
  }

  get size (): number {
    return this.#subscribers.size
  }

  /** Streams refused at SSE_MAX_STREAMS (`instance`) and at SSE_MAX_STREAMS_PER_CALLER (`caller`). */
  get refused (): Readonly<CallerSlots['refused']> {
    return this.#slots.refused
  }

  /** Bytes written to streams and not yet taken by their clients, over all streams. */
  get bufferedBytes (): number {
    let total = 0
    for (const subscriber of this.#subscribers.keys()) total += subscriber.response.writableLength
    return total
  }

  /**
   * Opens a stream on `reply` (an @fastify/sse reply): every committed
   * event matching `filter` after `start`, exactly once, ascending, then
   * live; in another format, read up to a fresher tail, or ended after a
   * while when `options` say so (StreamOptions). The stream holds one of `caller`'s slots (see
   * CallerSlots) until it ends. Throws before any byte is sent (410, or a
   * transient refusal, a limit's included, that the error handler answers
   * as a retry); after that, failures end the stream and its client
   * resumes from its last position.
   */
  async open (reply: FastifyReply, filter: EventFilter, start: StreamStart, caller: string, options: StreamOptions = {}): Promise<void> {
    const { hub, reader } = this
    const known = await hub.ready()
    // Node tells a response's 'close' once, to the listeners it has then: a
    // client gone before the close below is registered (while a token was
    // verified, or the hub's first read ran) would leave its stream open
    // for good, holding a slot of SSE_MAX_STREAMS. Nothing is sent to it.
    if (reply.raw.destroyed) return
    const { format, catchUpToNow = false, maxMs } = options
    // With catchUpToNow, the position a read now sees, set below.
    let upTo = 0
    const tail = () => Math.max(hub.tail!, upTo)
    const subscriberOptions = catchUpToNow
      ? { ...this.#subscriberOptions, readAfter: (afterId: number, filter: EventFilter) => reader.readAfter(afterId, filter, STREAM_POSITION, tail()) }
      : this.#subscriberOptions
    const subscriber = new Subscriber(reply.raw, filter, typeof start === 'object' ? start.afterId : 0, subscriberOptions, format?.(tail))
    // The caller's slot (or the refusal), with no await before the close that gives it back is registered.
    this.#slots.take(caller)
    // Subscribed before reading the table: whatever the hub polls from now
    // on reaches this subscriber, and whatever it polled before, the reads
    // below see (see docs/stream.md, "How it works", for the argument).
    this.#subscribe(subscriber, caller)
    countSent(reply.raw, subscriber)
    reply.sse.onClose(() => this.#unsubscribe(subscriber))

    let firstPage: StoredEvent[] | undefined = []
    try {
      if (start === 'tail') {
        subscriber.lastId = await settledNow(this.db, known)
      } else {
        if (catchUpToNow) upTo = await settledNow(this.db, known)
        if (start === 'oldest') {
          const { state: { floor }, events } = await reader.readKept(0, filter, tail())
          subscriber.lastId = floor
          // Rows at or below the floor that linger: the catch-up reads again from the floor.
          firstPage = events.some((event) => event.id <= floor) ? undefined : events
        } else {
          firstPage = await reader.readAfter(start.afterId, filter, start.errors, tail())
        }
      }
      // The hub stopped while this read (its stop left the stream to this check): the client retries, elsewhere.
      if (hub.stopped) throw shuttingDown
    } catch (err) {
      this.#unsubscribe(subscriber)
      throw err // before any byte is sent: the client gets the 410 envelope, or a retry (plugins/app/errors.ts)
    }

    if (!reply.sse.isConnected) return
    reply.sse.keepAlive()
    // No idle timeout (CONNECTION_TIMEOUT_MS) on a stream's connection: a
    // stream writes at least every SSE_KEEPALIVE_MS, below it, so it never
    // fires, but every write would refresh its timer (the fan-out's every
    // write); a client that stops reading is cut by the buffered-bytes bound.
    // Node restores it if the connection serves another request.
    reply.raw.socket?.setTimeout(0)
    reply.sse.sendHeaders()
    if (maxMs !== undefined) {
      const timer = setTimeout(() => subscriber.end(), maxMs)
      reply.raw.once('close', () => clearTimeout(timer))
    }
    subscriber.write(`retry: ${this.options.retryMs}\n\n`)
    await subscriber.catchUp(firstPage)
  }

  /**
   * Heartbeats for the streams that have been quiet for keepAliveMs (after
   * the hub's ticks, at most every SWEEP_MAX_INTERVAL_MS or a tenth of
   * keepAliveMs): a quiet stream hears within that much past keepAliveMs.
   */
  sweep (now: number, tail: number): void {
    const { keepAliveMs } = this.options
    if (now - this.#sweptAt < Math.min(SWEEP_MAX_INTERVAL_MS, keepAliveMs / 10)) return
    this.#sweptAt = now
    for (const subscriber of this.#subscribers.keys()) subscriber.heartbeat(now, tail, keepAliveMs)
  }

  /**
   * Resolves once every ended stream's response has finished (its last
   * bytes handed to the socket) or closed, or after `maxMs` (a client that
   * takes no bytes).
   */
  flushed (maxMs: number): Promise<void> {
    const pending = [...this.#subscribers.keys()]
      .map((subscriber) => subscriber.response)
      .filter((response) => response.writableEnded && !response.writableFinished && !response.destroyed)
    if (pending.length === 0) return Promise.resolve()
    return new Promise((resolve) => {
      let left = pending.length
      const timer = setTimeout(resolve, maxMs)
      const done = () => { if (--left === 0) { clearTimeout(timer); resolve() } }
      for (const response of pending) response.once('close', done)
    })
  }

  /** Ends every open stream cleanly; their clients reconnect and resume from their last id. */
  endAll (): void {
    for (const subscriber of this.#subscribers.keys()) subscriber.end()
  }

  #subscribe (subscriber: Subscriber, caller: string): void {
    this.#subscribers.set(subscriber, caller)
    this.hub.listen(subscriber)
  }

  /** Idempotent: a stream may be released by its close and by a failed start alike; its caller's slot goes back once. */
  #unsubscribe (subscriber: Subscriber): void {
    const caller = this.#subscribers.get(subscriber)
    if (caller === undefined) return
    this.#subscribers.delete(subscriber)
    this.hub.unlisten(subscriber)
    this.#slots.release(caller)
  }
}
