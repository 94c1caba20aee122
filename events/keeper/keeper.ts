import type { FastifyBaseLogger } from 'fastify'
import { randomUUID } from 'node:crypto'
import { hostname } from 'node:os'
import pg from 'pg'
import { holdsLease, keepOrder, lockHolders, readHistoryFloor, releaseLease, takeLease, type OrderTick } from './order.ts'
import { isLockTimeout, PartitionKeeper } from './partitions.ts'

export interface EventLogKeeperOptions {
  /** A database URL on which this service may write: the primary. */
  url: string
  keeperIntervalMs: number
  /** EVENTS_RETENTION in milliseconds; undefined: keep every event. */
  retentionMs: number | undefined
  log: FastifyBaseLogger
}

/**
 * How long a replica that is not the keeper waits before asking for the
 * lease again, and a failed keeper before reconnecting: holes stay
 * unsettled until a keeper ticks again.
 */
const RETRY_MS = 1000

/**
 * The keeper's lease: three ticks and a second. Every tick renews it; a
 * keeper that has not ticked for that long (frozen, cut off, its host gone)
 * is replaced by the next replica that asks (within RETRY_MS more), and its
 * own ticks publish nothing from then on.
 */
export const leaseMsFor = (keeperIntervalMs: number) => 3 * keeperIntervalMs + 1000
/**
 * The longest the keeper's connection waits on a lock (lock_timeout): a
 * quarter of its lease. Ticks of other processes and a writer's first
 * insert after a failover hold event_log_state's row for milliseconds; a
 * session left idle holding it (only the owner's can) fails the tick well
 * within the lease, said in the log and counted, rather than stalling it.
 */
export const lockTimeoutMsFor = (leaseMs: number) => Math.round(leaseMs / 4)
/**
 * A reader that has waited this long on a hole asks for ticks (an id in
 * flight from writers committing out of order is usually gone by then);
 * they come this often while it waits.
 */
export const SOON_TICK_MS = 10

/**
 * Ticks asked for that may settle nothing new before the keeper backs off
 * (the gap doubling up to the keeper interval): under load a hole can take
 * a few, each bounding the writers that the one before it saw
 * (events_keep_order, db/sql/); past that, a writer is holding its
 * transaction open.
 */
const TICKS_A_HOLE_NEEDS = 3

/**
 * A tick a reader waits for pauses this long before each of its later censuses
 * (see events_keep_order): the short writers of the census before end
 * meanwhile.
 */
const TICK_PAUSE_MS = 5

/** The longest a DETACH or DROP of a partition waits in the events table's lock queue (writers queue behind it meanwhile). */
export const PARTITION_LOCK_TIMEOUT_MS = 200

/**
 * One replica at a time keeps the event log (the holder of the keeper's
 * lease, db/sql/keeper.sql): every keeperIntervalMs it ticks (keepOrder: the
 * settled position every reader uses), which renews the lease, and starts a
 * pass over the partitions (PartitionKeeper) unless one is still running.
 * While a reader waits on a hole (soon() until calm()), it ticks every
 * SOON_TICK_MS, backing off from a writer left open. Passes run on a second
 * connection, so that a long one (a partition's first scan) never holds a
 * tick back. The other replicas ask for the lease every RETRY_MS: they take
 * over once the keeper stops (it gives the lease up) or its lease expires
 * (leaseMsFor), and a keeper whose lease was taken publishes nothing more.
 */
export class EventLogKeeper {
  #client: pg.Client | undefined
  #partitionClient: pg.Client | undefined
  /** This replica's name in the lease (event_log_state.keeper): its host and process, and a random part. */
  readonly id = `${hostname()}:${process.pid}:${randomUUID().slice(0, 8)}`
  readonly leaseMs: number
  readonly lockTimeoutMs: number
  /** The lease's term while this replica keeps the log. */
  #term: number | undefined
  #pass: Promise<void> | undefined
  #timer: NodeJS.Timeout | undefined
  #stopped = false
  #leading = false
  #failing = false
  /** A step timed out on a lock: said once, until a step succeeds. */
  #lockWaiting = false
  #passFailing = false
  #stepping = false
  /** When the next step is due (Unix ms); the earliest one asked for while a step runs; the gap the next soon() leaves. */
  #dueAt = 0
  #askedAt = Infinity
  #soonGapMs = SOON_TICK_MS
  #lastTickAt = 0
  /** A reader waits on a hole: tick every #soonGapMs until it calms. */
  #demanded = false
  /** Ticks asked for in a row that settled nothing new. */
  #stale = 0
  #lastPassAt = 0
  ticks = 0
  passes = 0
  /** Statements of the keeper's connection (a tick, asking for the lease) that timed out on a lock (lock_timeout). */
  lockTimeouts = 0
  /** The history's floor as last read (every replica reads it; -1 before the first read). */
  historyFloor = -1
  /** Called when a tick asked for by a waiting reader settled something new: this replica's poller reads it at once. */
  onPublished: (() => void) | undefined
  /** The epoch and the settled position this replica last published (-1 before its first tick). */
  epoch = -1
  published = -1
  readonly partitions: PartitionKeeper

  readonly options: EventLogKeeperOptions

  constructor (options: EventLogKeeperOptions) {
    this.options = options
    this.leaseMs = leaseMsFor(options.keeperIntervalMs)
    this.lockTimeoutMs = lockTimeoutMsFor(this.leaseMs)
    this.partitions = new PartitionKeeper({
      retentionMs: options.retentionMs, lockTimeoutMs: PARTITION_LOCK_TIMEOUT_MS, settle: () => this.#settleForPass(), log: options.log
    })
  }

  get leading (): boolean {
    return this.#leading
  }

  /** Resolves when the pass under way, if any, has ended. */
  async passEnded (): Promise<void> {
    await this.#pass
  }

  start (): void {
    void this.#step()
  }

  /**
   * A reader waits on an id that a tick may settle: tick at once after a
   * quiet spell, and then every SOON_TICK_MS until calm(): a hole needs a
   * few ticks under load. Past TICKS_A_HOLE_NEEDS ticks in a row that
   * settle nothing new, the gap doubles (a writer left open is asked about
   * ever less often) up to the keeper interval.
   */
  soon (): void {
    if (this.#stopped || !this.#leading) return
    this.#demanded = true
    this.#schedule(Math.max(0, this.#lastTickAt + this.#soonGapMs - Date.now()))
  }

  /** Readers no longer wait: back to the keeper interval, and the next soon() is quick again. */
  calm (): void {
    this.#demanded = false
    this.#soonGapMs = SOON_TICK_MS
    this.#stale = 0
  }

  #schedule (delayMs: number): void {
    if (this.#stopped) return
    const dueAt = Date.now() + delayMs
    if (this.#stepping) {
      // The step under way schedules the next one; make it no later than this.
      this.#askedAt = Math.min(this.#askedAt, dueAt)
      return
    }
    if (this.#timer !== undefined && this.#dueAt <= dueAt) return
    clearTimeout(this.#timer)
    this.#dueAt = dueAt
    this.#timer = setTimeout(() => {
      this.#timer = undefined
      void this.#step()
    }, delayMs)
  }

  async stop (): Promise<void> {
    this.#stopped = true
    clearTimeout(this.#timer)
    // Another replica takes over at once, rather than when the lease expires.
    if (this.#leading) await releaseLease(this.#client!, this.id, this.#term!).catch(() => {})
    await this.#disconnect()
    await this.#pass
  }

  async #step (): Promise<void> {
    this.#stepping = true
    this.#askedAt = Infinity
    let delay = this.options.keeperIntervalMs
    try {
      if (!this.#leading) {
        // A tick may not outlast the lease it renews, nor wait on a lock for most of it.
        this.#client ??= await this.#connect('ocp-api-keeper', { statement_timeout: this.leaseMs, lock_timeout: this.lockTimeoutMs })
        // Stopped while it connected: stop() had no connection to end yet.
        if (this.#stopped) return await this.#disconnect()
        const client = this.#client
        this.#term = await this.#countingLockTimeouts(() => takeLease(client, this.id, this.leaseMs))
        this.#leading = this.#term !== undefined
        if (this.#leading) {
          const retention = this.options.retentionMs === undefined ? 'none: every event is kept' : `${this.options.retentionMs / 1000} s`
          this.options.log.info({ keeper: this.id, term: this.#term, leaseMs: this.leaseMs, retention },
            'this replica keeps the event log (its settled position, partitions)')
        } else {
          this.historyFloor = await readHistoryFloor(this.#client)
          delay = RETRY_MS
        }
      }
      if (this.#leading) {
        const published = this.published
        const tick = await this.#tick(this.#demanded ? TICK_PAUSE_MS : 0)
        if (!tick.leads) return this.#deposed()
        this.#lastTickAt = Date.now()
        // Ticks asked for keep the pace while they settle something new, or for the few a hole needs under
        // load (each bounds the writers the one before it saw); past that, a writer left open: back off.
        if (this.#demanded) {
          if (tick.settled > published) this.onPublished?.()
          this.#stale = tick.settled > published ? 0 : this.#stale + 1
          this.#soonGapMs = this.#stale < TICKS_A_HOLE_NEEDS ? SOON_TICK_MS : Math.min(this.#soonGapMs * 2, this.options.keeperIntervalMs)
          delay = Math.min(delay, this.#soonGapMs)
        }
        if (Date.now() - this.#lastPassAt >= this.options.keeperIntervalMs) {
          this.#lastPassAt = Date.now()
          this.#pass ??= this.#keepPartitions().finally(() => { this.#pass = undefined })
        }
      }
      if (this.#failing) this.options.log.info('event log keeper recovered')
      if (this.#lockWaiting) this.options.log.info('event log keeper: the lock it waited on was released; ticks resume')
      this.#failing = false
      this.#lockWaiting = false
    } catch (err) {
      if (isLockTimeout(err) && !this.#stopped) {
        // A lock held elsewhere: the connection is sound and the lease, if any, still this replica's; the next step tries again.
        await this.#sayLockTimeout(err)
      } else {
        // A tick cut short by stop() (its connection ended under it) is no failure.
        if (!this.#failing && !this.#stopped) this.options.log.warn({ err }, 'event log keeper failed; retrying')
        this.#failing = true
        await this.#disconnect()
        delay = RETRY_MS
      }
    }
    this.#stepping = false
    // A soon() that came during the step may have asked for an earlier one.
    this.#schedule(Math.max(0, Math.min(delay, this.#askedAt - Date.now())))
  }

  /**
   * A tick under this replica's lease, on its own connection (pg runs one
   * query at a time on it, so a pass's tick waits for the step's): what it
   * published is recorded, and a change of history said in the log.
   */
  async #tick (pauseMs: number): Promise<OrderTick> {
    const client = this.#client!
    const tick = await this.#countingLockTimeouts(() => keepOrder(client, { pauseMs, keeper: this.id, term: this.#term!, leaseMs: this.leaseMs }))
    if (!tick.leads) return tick
    this.published = tick.settled
    this.historyFloor = tick.historyFloor
    this.epoch = tick.epoch
    this.ticks++
    if (tick.rewound !== null) this.#sayRewound(tick)
    return tick
  }

  /** Runs a statement of the keeper's connection, counting it in lockTimeouts if it timed out on a lock. */
  async #countingLockTimeouts<T> (statement: () => Promise<T>): Promise<T> {
    try {
      return await statement()
    } catch (err) {
      if (isLockTimeout(err)) this.lockTimeouts++
      throw err
    }
  }

  /**
   * A step timed out on a lock: said once until a step succeeds, with where
   * it waited (Postgres's context of the error) and the sessions holding
   * event_log_state beyond a read (the row's lock, which a tick and the
   * lease take first), so that an operator can end the one left idle.
   */
  async #sayLockTimeout (err: unknown): Promise<void> {
    if (this.#lockWaiting) return
    this.#lockWaiting = true
    // stop() may end the connection under this query (a race no test times): the warning then goes without the list.
    /* c8 ignore next */
    const holders = await lockHolders(this.#client!).catch(() => undefined)
    this.options.log.warn({ lockTimeoutMs: this.lockTimeoutMs, waitedOn: (err as { where?: string }).where, holders },
      'event log keeper: a tick waited on a lock for lock_timeout and gave up (a session holding event_log_state, listed in holders, may be left ' +
        'idle in a transaction); retrying on the next tick, and delivery past a hole waits meanwhile')
  }

  /** The settled position fresh for a pass that has just closed a range: a tick of the keeper's, never one beside it. */
  async #settleForPass (): Promise<number> {
    // A pass whose keeper lost its connection or its lease while it ran (a race no test times): the pass fails, and
    // its keeper's next step sorts it out.
    /* c8 ignore next */
    if (!this.#leading) throw new Error('this replica no longer keeps the event log')
    const tick = await this.#tick(0)
    /* c8 ignore next */
    if (!tick.leads) throw new Error('another replica keeps the event log now')
    return tick.settled
  }

  /** Another replica took the lease (this one did not tick within it): it keeps the log now; this one asks again later. */
  #deposed (): void {
    this.options.log.warn({ keeper: this.id, term: this.#term, leaseMs: this.leaseMs },
      'another replica keeps the event log now: this one did not renew its lease in time (stopped, or cut off from the database)')
    this.#leading = false
    this.#term = undefined
    // The partitions' connection is the keeper's alone: a follower holds none open.
    void this.#dropPartitionClient()
    this.#stepping = false
    this.#schedule(RETRY_MS)
  }

  #sayRewound (tick: OrderTick): void {
    if (tick.rewound === 'sequence') {
      this.options.log.error({ settled: tick.settled },
        'events_event_id_seq was moved back (setval, or ALTER SEQUENCE ... RESTART): the event log moved it forward again, since an event id is ' +
          'never handed out twice; do not move it back')
      return
    }
    const what = tick.rewound === 'failover' ? 'the database is on a new WAL timeline (a standby was promoted)' : 'the database restarted after a crash'
    this.options.log.warn({ epoch: tick.epoch, settled: tick.settled },
      `${what}: commits that readers saw before may be gone, so the event sequence jumped past every id handed out before; clients holding a ` +
        'position in between are answered 410 and refetch, every other event is delivered as before')
  }

  /** One pass over the partitions; a failure is logged (once until a pass succeeds) and the next tick tries again. */
  async #keepPartitions (): Promise<void> {
    try {
      this.#partitionClient ??= await this.#connect('ocp-api-keeper-partitions')
      // A keeper whose lease another replica took makes no pass (it learns so at its next tick).
      if (!await holdsLease(this.#partitionClient, this.id, this.#term!)) return
      await this.partitions.keep(this.#partitionClient)
      this.passes++
      if (this.#passFailing) this.options.log.info('event log partitions: keeper recovered')
      this.#passFailing = false
    } catch (err) {
      if (!this.#stopped && !this.#passFailing) this.options.log.warn({ err }, 'event log partitions: a pass failed; retrying on the next tick')
      this.#passFailing = true
      await this.#dropPartitionClient()
    }
  }

  /** Ends the partitions' connection, if one is open; the next pass opens another. */
  async #dropPartitionClient (): Promise<void> {
    const client = this.#partitionClient
    this.#partitionClient = undefined
    await client?.end().catch(() => {})
  }

  async #connect (applicationName: string, timeouts: { statement_timeout?: number, lock_timeout?: number } = {}): Promise<pg.Client> {
    const client = new pg.Client({ connectionString: this.options.url, application_name: applicationName, ...timeouts })
    // A dropped connection fails the next statement; this only keeps the process up.
    client.on('error', () => {})
    await client.connect()
    return client
  }

  async #disconnect (): Promise<void> {
    const clients = [this.#client, this.#partitionClient]
    this.#client = undefined
    this.#partitionClient = undefined
    this.#leading = false
    this.#term = undefined
    await Promise.all(clients.map((client) => client?.end().catch(() => {})))
  }
}
