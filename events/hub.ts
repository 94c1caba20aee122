import type { FastifyBaseLogger } from 'fastify'
import { setImmediate as nextTurn } from 'node:timers/promises'
import type { Db } from '../db/schema.ts'
import { pollAfter, startingPosition, type EventFilter, type LogState, type StoredEvent } from './statements.ts'
import { EventWindow } from './window.ts'

export interface HubOptions {
  pollIntervalMs: number
  /** The safety net's poll interval while a wake-up source is live (EVENTS_WAKEUP_POLL_INTERVAL_MS). */
  wakeupPollIntervalMs: number
  /** The most bytes of recent events kept in memory for catch-ups (EVENTS_WINDOW_BYTES; 0: none). */
  windowBytes: number
  log: FastifyBaseLogger
}

/** What the fan-out hands events to: a stream (sse/subscriber.ts) or a long-poll (durable/waiter.ts). */
export interface Listener {
  readonly filter: EventFilter
  matches: (event: StoredEvent) => boolean
  offer: (event: StoredEvent) => void
  /** After a poll has handed out everything up to the tail: true when the listener answered (a long-poll with events). */
  answer?: () => boolean
  /** A new epoch began at `base` (what was read after it may be gone): a listener past it ends. */
  rewound: (base: number) => void
  /** The hub stops: the listener ends (its client resumes elsewhere). */
  close: () => void
}

/** Events read per poll query; a poll reads pages until it is up to date. */
export const POLL_PAGE_SIZE = 1000

/** The least time between the starts of two polls that a wake-up asks for: bounds the polling on a busy database. */
export const WAKE_MIN_GAP_MS = 5

/**
 * A wake-up's poll that finds nothing new is repeated once after this long:
 * WAL may arrive before its commit is visible (on a hot standby, before it
 * is replayed). So is a poll that begins to wait on a hole: the second
 * sight of it asks the keeper to settle it (keeper/keeper.ts).
 */
export const WAKE_RECHECK_MS = 10

/** How long delivery may wait for an event writer in flight before the log says so. */
export const SETTLE_WAIT_LOG_MS = 5000

/**
 * How long the fan-out answers long-polls before it lets the event loop
 * turn (the rest after it has): well under the load-shedding sample's
 * interval, so that a crowd's answers never starve it.
 */
export const ANSWER_TURN_MS = 100
/** Long-polls answered between two looks at the clock. */
export const ANSWERS_PER_CLOCK_LOOK = 128
/** How often the poller looks while a read waits on the tail (tailPast). */
const TAIL_WAIT_POLL_MS = 10

/**
 * The one poller of a process. Every pollIntervalMs it reads the events
 * committed since its tail (one indexed query, however many listeners)
 * and hands each to the listeners whose filters match, found through
 * indexes by run and by thread rather than by scanning them all.
 *
 * Writers may commit ids out of order, so the tail never passes an id
 * that may still commit: each poll reads, in one statement, the events
 * after the tail and the log's state (statements.ts), and hands out those
 * up to the settled position and the run of visible ids just above it
 * (docs/stream.md, "How the event order is settled"). An event above a
 * hole waits, and the hub tells the keeper (onWaiting). A new epoch (a
 * failover, a crash, a TRUNCATE) ends the listeners past its base
 * (docs/stream.md, "Failover, restarts and rewinds").
 *
 * A wake-up source (wakeup.ts) calls wake() when something may have been
 * committed: the hub then polls at once, or when the poll in flight ends,
 * at most one poll every WAKE_MIN_GAP_MS, however many wake-ups and
 * listeners. While the source is live, the timed poll is only a safety
 * net and runs every wakeupPollIntervalMs.
 *
 * What it hands out also goes into a window of recent events in memory
 * (window.ts), from which reads after a recent event id are served
 * (reader.ts) without reading the table.
 */
export class EventHub {
  /** The highest event id handed to listeners; undefined until first read. */
  #tail: number | undefined
  #initializing: Promise<number> | undefined
  /** The event log's state as the last poll read it (undefined before the first read). */
  #state: LogState | undefined
  /**
   * Called after each poll with how long an event has waited above a hole
   * (undefined when none waits): the keeper then settles sooner
   * (keeper/keeper.ts).
   */
  onWaiting: ((waitedMs: number | undefined) => void) | undefined
  /** Called after each tick, polled or failed, with the time and the tail (the streams' keep-alives). */
  onTicked: ((now: number, tail: number) => void) | undefined
  #lossLogged = false
  /** The pending poll: a timer, or an immediate when it was due at once. */
  #timer: { timeout: NodeJS.Timeout } | { immediate: NodeJS.Immediate } | undefined
  /** When the pending timer fires (Unix ms). */
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
  /** The tail at which delivery began to wait for a hole to settle, and since when (Unix ms). */
  #waitingAt: number | undefined
  #waitingSince = 0
  #waitLogged = false
  /** The last poll found a new hole to wait on: poll once more soon (it asks the keeper for a tick then). */
  #holeBegan = false
  /** Listeners that answer once a poll has handed out what they wait for (long-polls). */
  readonly #answering = new Set<Listener>()
  /** Unfiltered listeners (streams and long-poll waiters), all under the key ''. */
  readonly #unfiltered = new Map<string, Set<Listener>>()
  readonly #byRun = new Map<string, Set<Listener>>()
  readonly #byThread = new Map<string, Set<Listener>>()
  #window: EventWindow | undefined
  /** Reads waiting for the tail to pass a position (tailPast). */
  readonly #tailWaits = new Set<{ position: number, resolve: () => void }>()

  readonly db: Db
  readonly options: HubOptions

  constructor (db: Db, options: HubOptions) {
    this.db = db
    this.options = options
  }

  /** The window of recent events (undefined before the first read). */
  get window (): EventWindow | undefined {
    return this.#window
  }

  /**
   * The history's floor rose (this process's keeper dropped what lies at or
   * below it): the window stops serving those events at once, so that a
   * event id below the floor reads the table and gets its 410, rather than
   * waiting for the next poll to learn it.
   */
  raiseFloor (floor: number): void {
    /* c8 ignore next: a drop before the first poll has nothing in memory to drop */
    this.#window?.raiseFloor(floor)
  }

  /** Resolves once the tail is past `position` (or at once, if it is), or after `maxMs`. */
  tailPast (position: number, maxMs: number): Promise<void> {
    if (this.#tail! > position || this.#stopped) return Promise.resolve()
    return new Promise((resolve) => {
      const entry = { position, resolve: () => { clearTimeout(timer); this.#tailWaits.delete(entry); resolve() } }
      const timer = setTimeout(entry.resolve, maxMs)
      this.#tailWaits.add(entry)
      this.wake()
    })
  }

  /**
   * From now on, the fan-out hands `listener` every event matching its
   * filter that a poll hands out. A listener subscribes before it reads
   * the table: whatever the hub polls from then on reaches it, and
   * whatever it polled before, the listener's own read sees
   * (docs/stream.md, "How it works").
   */
  listen (listener: Listener): void {
    const { index, key } = this.#indexOf(listener)
    let set = index.get(key)
    if (set === undefined) index.set(key, set = new Set())
    set.add(listener)
    if (listener.answer !== undefined) this.#answering.add(listener)
    // A request already in flight when the hub stopped: closed at once, like those the stop closed.
    if (this.#stopped) listener.close()
  }

  /** Stops handing `listener` events (once, after its listen). */
  unlisten (listener: Listener): void {
    const { index, key } = this.#indexOf(listener)
    const set = index.get(key)!
    set.delete(listener)
    if (set.size === 0) index.delete(key)
    this.#answering.delete(listener)
  }

  /** Every listener, through the indexes. */
  * #listeners (): Generator<Listener> {
    for (const index of [this.#unfiltered, this.#byRun, this.#byThread]) {
      for (const set of index.values()) yield * set
    }
  }

  /** Whether stop() was called: the process is shutting down. */
  get stopped (): boolean {
    return this.#stopped
  }

  /** The highest event id handed to listeners (undefined before the first read). */
  get tail (): number | undefined {
    return this.#tail
  }

  /** When a poll last completed (Unix ms; 0 before the first): its lag is the metric. */
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
    if (this.#tail !== undefined) return Promise.resolve(this.#tail)
    this.#initializing ??= startingPosition(this.db).then(({ position, state }) => {
      this.#state ??= state
      this.#tail ??= position
      this.#window ??= new EventWindow(this.#tail, this.options.windowBytes)
      return this.#tail
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

  /** Stops polling and closes every listener (streams end; their clients reconnect and resume). */
  stop (): void {
    this.#stopped = true
    this.#cancelTimer()
    for (const listener of [...this.#listeners()]) listener.close()
    for (const wait of this.#tailWaits) wait.resolve()
  }

  /** Where a listener is found by fan-out: by its run, else by its thread, else among the unfiltered. */
  #indexOf (listener: Listener): { index: Map<string, Set<Listener>>, key: string } {
    const { runId, threadId } = listener.filter
    if (runId !== undefined) return { index: this.#byRun, key: runId }
    if (threadId !== undefined) return { index: this.#byThread, key: threadId }
    return { index: this.#unfiltered, key: '' }
  }

  /** Reads and hands out every event settled since the tail. */
  async #poll (): Promise<void> {
    let tail = await this.ready()
    let hole = false
    for (;;) {
      const { state, events, waiting } = await pollAfter(this.db, tail, POLL_PAGE_SIZE)
      if (state.epoch !== this.#state!.epoch) {
        this.#startEpoch(state)
        tail = this.#tail!
        continue
      }
      this.#state = state
      if (state.lossPending) {
        // Commits this hub saw may be gone (a crash, a failover): nothing is served from memory, and its
        // tail may hold ids the database lost. What was lost is known once the keeper records it (a new
        // epoch): until then, wait.
        this.#window = new EventWindow(tail, this.options.windowBytes)
        if (!this.#lossLogged) {
          this.options.log.warn({ tail }, 'the database failed over or recovered from a crash: delivery waits until the event log\'s keeper ' +
            'records what it may have lost')
        }
        this.#lossLogged = true
        hole = true
        break
      }
      this.#lossLogged = false
      const window = this.#window!
      let readable = Math.max(tail, state.settled)
      // Events above a hole, not read again while it waits.
      if (waiting) hole = true
      for (const event of events) {
        if (event.id > readable + 1) {
          hole = true
          break
        }
        readable = Math.max(readable, event.id)
        this.#fanOut(event)
        window.append(event)
        tail = event.id
      }
      const readAll = hole || events.length < POLL_PAGE_SIZE
      // Every visible event up to `readable` (the readable position) has been handed out: the rest of
      // the range is ids that will never commit.
      if (readAll) tail = readable
      this.#tail = tail
      window.advance(tail)
      // After the events: one of them may lie at or below a floor read with them.
      window.raiseFloor(state.floor)
      if (readAll) break
    }
    this.#lastPollAt = Date.now()
    this.#noteWait(hole)
    this.onWaiting?.(hole ? this.#lastPollAt - this.#waitingSince : undefined)
    // Everything up to the tail is handed out: the long-polls that got
    // events answer, for at most answerTurnMs at a time, then the loop
    // turns (timers, other requests, the load-shedding sample) and the rest
    // answer. Turns of a fixed count were worse for a large crowd: too few
    // a turn and each batch's re-polls are read before the next batch is
    // answered; too many and the loop is held for the whole crowd.
    let answered = 0
    let turnBegan = performance.now()
    for (const listener of this.#answering) {
      if (!listener.answer!() || ++answered % ANSWERS_PER_CLOCK_LOOK !== 0) continue
      if (performance.now() - turnBegan < this.answerTurnMs) continue
      await nextTurn()
      turnBegan = performance.now()
    }
    for (const wait of this.#tailWaits) if (tail > wait.position) wait.resolve()
    // Reads still wait on the tail: poll again soon (one statement for all of them).
    if (this.#tailWaits.size > 0) this.#schedule(TAIL_WAIT_POLL_MS)
  }

  /**
   * The keeper started a new epoch: what was read after its base may be
   * gone. Streams that went past the base end (their clients reconnect, and
   * learn by a 410 to refetch if they saw what is gone), the window empties,
   * long-polls past the base answer as they stand, and reading goes on from
   * the base.
   */
  #startEpoch (state: LogState): void {
    const base = state.epochBase
    this.options.log.warn({ epoch: state.epoch, base, tail: this.#tail, reissued: state.reissued },
      `the event log started a new epoch (a failover, a restart after a crash, or a TRUNCATE): what was read after ${base} may be gone; streams ` +
        'past it end, and their clients resume or refetch')
    this.#state = state
    for (const listener of [...this.#listeners()]) listener.rewound(base)
    this.#tail = Math.min(this.#tail!, base)
    this.#window = new EventWindow(this.#tail, this.options.windowBytes)
    this.#waitingAt = undefined
  }

  /** Tracks how long an event above a hole has waited, and says so once it passes SETTLE_WAIT_LOG_MS. */
  #noteWait (hole: boolean): void {
    this.#holeBegan = hole && this.#tail !== this.#waitingAt
    if (!hole || this.#tail !== this.#waitingAt) {
      if (this.#waitLogged) {
        this.options.log.info({ tail: this.#tail, waitedSeconds: this.settleWaitSeconds }, 'event delivery resumed: the id it waited for settled')
      }
      this.#waitLogged = false
      this.#waitingAt = hole ? this.#tail : undefined
      this.#waitingSince = this.#lastPollAt
      return
    }
    if (!this.#waitLogged && this.#lastPollAt - this.#waitingSince >= SETTLE_WAIT_LOG_MS) {
      this.#waitLogged = true
      const { waitingPid, waitingTransaction, settledAge, preparedWriters } = this.#state!
      // A state the keeper has not refreshed in a while may name a writer long gone: say how old it is instead.
      const why = settledAge > SETTLE_WAIT_LOG_MS / 1000
        ? `the settled position was last published ${Math.round(settledAge)} s ago; it moves only while a replica keeps the event log on the ` +
          'primary, and a hot standby sees it once it replays it (docs/stream.md, "How the event order is settled")'
        : waitingTransaction !== null
          ? `a prepared transaction ('${waitingTransaction}') drew an event id and is still open: COMMIT PREPARED or ROLLBACK PREPARED ` +
            `'${waitingTransaction}' releases it (pg_prepared_xacts lists it)`
          : `a transaction that drew an event id (or used the events sequence) is still open, backend ${waitingPid} (pg_stat_activity tells what it is doing)`
      this.options.log.warn({
        tail: this.#tail, waitingPid, waitingTransaction, preparedWriters, settledAgeSeconds: settledAge, waitedSeconds: this.settleWaitSeconds
      },
        `event delivery waits past id ${this.#tail}: ${why}`)
    }
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
      this.#cancelTimer()
    }
    this.#dueAt = dueAt
    const tick = () => {
      this.#timer = undefined
      void this.#tick()
    }
    // Due now (a wake-up): right after this turn's I/O. A timer of 0 ms waits
    // at least 1 ms, on every event's path from its commit to the streams.
    this.#timer = delay === 0 ? { immediate: setImmediate(tick) } : { timeout: setTimeout(tick, delay) }
  }

  #cancelTimer (): void {
    const timer = this.#timer
    if (timer === undefined) return
    if ('immediate' in timer) clearImmediate(timer.immediate)
    else clearTimeout(timer.timeout)
    this.#timer = undefined
  }

  async #tick (): Promise<void> {
    const woken = this.#woken
    this.#woken = false
    this.#polling = true
    this.#lastTickAt = Date.now()
    const tailBefore = this.#tail
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
    if (this.#tail !== undefined) this.onTicked?.(Date.now(), this.#tail)
    if (this.#pollAgain) {
      this.#pollAgain = false
      this.#woken = true
      this.#schedule(this.#lastTickAt + WAKE_MIN_GAP_MS - Date.now())
    } else if ((woken && this.#tail === tailBefore) || this.#holeBegan) {
      this.#schedule(WAKE_RECHECK_MS)
    }
    this.#schedule(this.wakeupLive ? this.options.wakeupPollIntervalMs : this.options.pollIntervalMs)
  }
}
