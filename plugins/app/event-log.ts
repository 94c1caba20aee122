import type { FastifyBaseLogger } from 'fastify'
import fp from 'fastify-plugin'
import pg from 'pg'
import { durationMs } from '../../config.js'
import { readHistoryFloor, tryLeadUpkeep, writeClock } from '../../db/event-log.js'
import { PartitionKeeper } from '../../db/event-partitions.js'

declare module 'fastify' {
  interface FastifyInstance {
    /** The event log's upkeep (plugins/app/event-log.ts); undefined where it is off. */
    eventLog: EventLogUpkeep | undefined
  }
}

export interface UpkeepOptions {
  /** A database URL on which this service may write: the primary. */
  url: string
  clockIntervalMs: number
  /** EVENTS_RETENTION in milliseconds; undefined: keep every event. */
  retentionMs: number | undefined
  log: FastifyBaseLogger
}

/** How long a replica that is not the keeper waits before asking again, and a failed keeper before reconnecting. */
const RETRY_MS = 5000

/** The longest a DETACH or DROP of a partition waits in the events table's lock queue (writers queue behind it meanwhile). */
export const PARTITION_LOCK_TIMEOUT_MS = 200

/**
 * One replica at a time keeps the event log (the holder of a session-level
 * advisory lock): every clockIntervalMs it writes the clock, and starts a
 * pass over the partitions (PartitionKeeper) unless one is still running.
 * Passes run on a second connection, so that a long one (a partition's
 * first scan) never holds the clock back. Another replica takes over within
 * RETRY_MS when the keeper's session ends.
 */
export class EventLogUpkeep {
  #client: pg.Client | undefined
  #partitionClient: pg.Client | undefined
  #pass: Promise<void> | undefined
  #timer: NodeJS.Timeout | undefined
  #stopped = false
  #leading = false
  #failing = false
  #passFailing = false
  ticks = 0
  passes = 0
  /** The history's floor as last read (every replica reads it; -1 before the first read). */
  historyFloor = -1
  readonly keeper: PartitionKeeper

  constructor (readonly options: UpkeepOptions) {
    this.keeper = new PartitionKeeper({ retentionMs: options.retentionMs, lockTimeoutMs: PARTITION_LOCK_TIMEOUT_MS, log: options.log })
  }

  get leading (): boolean {
    return this.#leading
  }

  /** Resolves when the pass under way, if any, has ended. */
  async settled (): Promise<void> {
    await this.#pass
  }

  start (): void {
    void this.#step()
  }

  async stop (): Promise<void> {
    this.#stopped = true
    clearTimeout(this.#timer)
    await this.#disconnect()
    await this.#pass
  }

  async #step (): Promise<void> {
    let delay = this.options.clockIntervalMs
    try {
      if (!this.#leading) {
        this.#client ??= await this.#connect()
        this.#leading = await tryLeadUpkeep(this.#client)
        if (this.#leading) {
          this.options.log.info({ retention: this.options.retentionMs === undefined ? 'none: every event is kept' : `${this.options.retentionMs / 1000} s` },
            'this replica keeps the event log (clock, partitions)')
        } else {
          this.historyFloor = await readHistoryFloor(this.#client)
          delay = RETRY_MS
        }
      }
      if (this.#leading) {
        this.historyFloor = await writeClock(this.#client!)
        this.ticks++
        this.#pass ??= this.#keepPartitions().finally(() => { this.#pass = undefined })
      }
      if (this.#failing) this.options.log.info('event log upkeep recovered')
      this.#failing = false
    } catch (err) {
      // A tick cut short by stop() (its connection ended under it) is no failure.
      if (!this.#failing && !this.#stopped) this.options.log.warn({ err }, 'event log upkeep failed; retrying')
      this.#failing = true
      await this.#disconnect()
      delay = RETRY_MS
    }
    if (!this.#stopped) this.#timer = setTimeout(() => { void this.#step() }, delay)
  }

  /** One pass over the partitions; a failure is logged (once until a pass succeeds) and the next tick tries again. */
  async #keepPartitions (): Promise<void> {
    try {
      this.#partitionClient ??= await this.#connect('ocp-api-upkeep-partitions')
      await this.keeper.keep(this.#partitionClient)
      this.passes++
      if (this.#passFailing) this.options.log.info('event log partitions: upkeep recovered')
      this.#passFailing = false
    } catch (err) {
      if (!this.#stopped && !this.#passFailing) this.options.log.warn({ err }, 'event log partitions: a pass failed; retrying on the next tick')
      this.#passFailing = true
      const client = this.#partitionClient
      this.#partitionClient = undefined
      await client?.end().catch(() => {})
    }
  }

  async #connect (applicationName = 'ocp-api-upkeep'): Promise<pg.Client> {
    const client = new pg.Client({ connectionString: this.options.url, application_name: applicationName })
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
    await Promise.all(clients.map((client) => client?.end().catch(() => {})))
  }
}

/** Starts the upkeep where this service may write; see docs/stream.md, "How the event order is settled". */
export default fp(async function eventLogPlugin (app) {
  if (app.upkeepDatabaseUrl === undefined) { // DATABASE_URL names a hot standby (plugins/app/db.ts says so)
    app.decorate('eventLog', undefined)
    return
  }
  const upkeep = new EventLogUpkeep({
    url: app.upkeepDatabaseUrl,
    clockIntervalMs: app.config.EVENTS_CLOCK_INTERVAL_MS,
    retentionMs: app.config.EVENTS_RETENTION === undefined ? undefined : durationMs(app.config.EVENTS_RETENTION),
    log: app.log.child({ component: 'event-log' })
  })
  app.decorate('eventLog', upkeep)
  app.addHook('onReady', async () => { upkeep.start() })
  app.addHook('onClose', async () => { await upkeep.stop() })
}, { name: 'event-log', dependencies: ['db'] })
