import type { FastifyBaseLogger } from 'fastify'
import { eventsAfter, settleBound, settledNow, type StoredEvent } from '../../../db/events.js'
import type { Db } from '../../../db/queries.js'
import type { Subscriber } from './subscriber.js'

export interface HubOptions {
  pollIntervalMs: number
  keepAliveMs: number
  log: FastifyBaseLogger
}

/** Events read per poll query; a poll reads pages until it is up to date. */
export const POLL_PAGE_SIZE = 1000

/** How long delivery may wait for an event writer in flight before the log says so. */
export const SETTLE_WAIT_LOG_MS = 5000

/**
 * The one poller of a process. Every pollIntervalMs it reads the events
 * committed since its head (one indexed query, however many subscribers)
 * and hands each to the subscribers whose filters match, found through
 * indexes by run and by thread rather than by scanning them all.
 *
 * Writers may commit ids out of order (migration 0003): the head is the
 * SETTLED position, never past an id that may still commit. Each poll first
 * asks where the log is settled (settleBound: before the rows' snapshot),
 * then hands out the events up to there and any run of ids just above it
 * with no hole. An event above a hole waits for the next poll; how long
 * delivery has waited is a metric, and a log line past SETTLE_WAIT_LOG_MS.
 */
export class EventHub {
  /** The highest event id handed to subscribers; undefined until first read. */
  #head: number | undefined
  #initializing: Promise<number> | undefined
  #timer: NodeJS.Timeout | undefined
  #stopped = false
  #failing = false
  #lastPollAt = 0
  /** The head at which delivery began to wait for a hole to settle, and since when (epoch ms). */
  #waitingAt: number | undefined
  #waitingSince = 0
  #waitLogged = false
  readonly #subscribers = new Set<Subscriber>()
  /** Unfiltered subscribers, all under the key ''. */
  readonly #unfiltered = new Map<string, Set<Subscriber>>()
  readonly #byRun = new Map<string, Set<Subscriber>>()
  readonly #byThread = new Map<string, Set<Subscriber>>()

  constructor (readonly db: Db, readonly options: HubOptions) {}

  get size (): number {
    return this.#subscribers.size
  }

  /** Bytes written to streams and not yet taken by their clients, over all streams. */
  get bufferedBytes (): number {
    let total = 0
    for (const subscriber of this.#subscribers) total += subscriber.response.writableLength
    return total
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

  /** The settled position, read from the database on first use (once, however many callers wait). */
  ready (): Promise<number> {
    if (this.#head !== undefined) return Promise.resolve(this.#head)
    this.#initializing ??= settleBound(this.db).then(({ bound }) => settledNow(this.db, bound)).then((head) => {
      this.#head ??= head
      return this.#head
    }).finally(() => { this.#initializing = undefined })
    return this.#initializing
  }

  start (): void {
    this.#schedule()
  }

  /** Stops polling and ends every stream. */
  stop (): void {
    this.#stopped = true
    clearTimeout(this.#timer)
    this.endAll()
  }

  /** Ends every open stream cleanly; their clients reconnect and resume from their last id. */
  endAll (): void {
    for (const subscriber of this.#subscribers) subscriber.end()
  }

  subscribe (subscriber: Subscriber): void {
    this.#subscribers.add(subscriber)
    const { index, key } = this.#indexOf(subscriber)
    let set = index.get(key)
    if (set === undefined) index.set(key, set = new Set())
    set.add(subscriber)
  }

  /** Idempotent: a stream may be released by its close and by a failed start alike. */
  unsubscribe (subscriber: Subscriber): void {
    if (!this.#subscribers.delete(subscriber)) return
    const { index, key } = this.#indexOf(subscriber)
    const set = index.get(key)!
    set.delete(subscriber)
    if (set.size === 0) index.delete(key)
  }

  /** Where a subscriber is found by fan-out: by its run, else by its thread, else among the unfiltered. */
  #indexOf (subscriber: Subscriber): { index: Map<string, Set<Subscriber>>, key: string } {
    const { runId, threadId } = subscriber.filter
    if (runId !== undefined) return { index: this.#byRun, key: runId }
    if (threadId !== undefined) return { index: this.#byThread, key: threadId }
    return { index: this.#unfiltered, key: '' }
  }

  /** Reads and hands out every event settled since the head. */
  async poll (): Promise<void> {
    let head = await this.ready()
    const { bound, waitingPid, clockAge } = await settleBound(this.db)
    let settled = Math.max(head, bound)
    let hole = false
    for (;;) {
      const events = await eventsAfter(this.db, head, POLL_PAGE_SIZE)
      for (const event of events) {
        if (event.id > settled + 1) {
          hole = true
          break
        }
        settled = Math.max(settled, event.id)
        this.#fanOut(event)
        head = event.id
      }
      const readAll = hole || events.length < POLL_PAGE_SIZE
      // Every visible event up to `settled` has been handed out: the rest of
      // the range is ids that will never commit.
      if (readAll) head = settled
      this.#head = head
      if (readAll) break
    }
    this.#lastPollAt = Date.now()
    this.#noteWait(hole, waitingPid, clockAge)
  }

  /** Tracks how long an event above a hole has waited, and says so once it passes SETTLE_WAIT_LOG_MS. */
  #noteWait (hole: boolean, waitingPid: number | null, clockAge: number | null): void {
    if (!hole || this.#head !== this.#waitingAt) {
      if (this.#waitLogged) this.options.log.info({ head: this.#head, waitedSeconds: this.settleWaitSeconds }, 'event delivery resumed: the id it waited for settled')
      this.#waitLogged = false
      this.#waitingAt = hole ? this.#head : undefined
      this.#waitingSince = this.#lastPollAt
      return
    }
    if (!this.#waitLogged && this.#lastPollAt - this.#waitingSince >= SETTLE_WAIT_LOG_MS) {
      this.#waitLogged = true
      const why = clockAge === null
        ? 'a transaction that drew the next event id is still open (waitingPid)'
        : `on a hot standby it waits for the clock (${Math.round(clockAge)} s old) to pass the oldest open transaction of the primary; a clock older than a few seconds means no service keeps the event log on the primary (README, "How the event order is settled")`
      this.options.log.warn({ head: this.#head, waitingPid, clockAgeSeconds: clockAge, waitedSeconds: this.settleWaitSeconds },
        `event delivery waits past id ${this.#head}: ${why}`)
    }
  }

  /** Heartbeats for the streams that have been quiet for keepAliveMs. */
  sweep (now: number): void {
    if (this.#head === undefined) return
    for (const subscriber of this.#subscribers) subscriber.heartbeat(now, this.#head, this.options.keepAliveMs)
  }

  #fanOut (event: StoredEvent): void {
    const unfiltered = this.#unfiltered.get('')
    if (unfiltered !== undefined) for (const subscriber of unfiltered) subscriber.offer(event)
    const byRun = this.#byRun.get(event.runId)
    if (byRun !== undefined) for (const subscriber of byRun) if (subscriber.matches(event)) subscriber.offer(event)
    const byThread = this.#byThread.get(event.threadId)
    if (byThread !== undefined) for (const subscriber of byThread) subscriber.offer(event)
  }

  #schedule (): void {
    if (this.#stopped) return
    this.#timer = setTimeout(() => { void this.#tick() }, this.options.pollIntervalMs)
  }

  async #tick (): Promise<void> {
    try {
      await this.poll()
      if (this.#failing) this.options.log.info('event poller recovered')
      this.#failing = false
    } catch (err) {
      // The database is away: streams stay open and resume when it is back.
      if (!this.#failing) this.options.log.warn({ err }, 'event poller cannot read events; retrying')
      this.#failing = true
    }
    this.sweep(Date.now())
    this.#schedule()
  }
}
