import type { FastifyBaseLogger } from 'fastify'
import fp from 'fastify-plugin'
import pg from 'pg'
import { tryLeadUpkeep, writeClock } from '../../db/event-log.js'

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
  log: FastifyBaseLogger
}

/** How long a replica that is not the keeper waits before asking again, and a failed keeper before reconnecting. */
const RETRY_MS = 5000

/**
 * One replica at a time keeps the event log (the holder of a session-level
 * advisory lock): it writes the clock every clockIntervalMs. Another replica
 * takes over within RETRY_MS when the keeper's session ends.
 */
export class EventLogUpkeep {
  #client: pg.Client | undefined
  #timer: NodeJS.Timeout | undefined
  #stopped = false
  #leading = false
  #failing = false
  ticks = 0

  constructor (readonly options: UpkeepOptions) {}

  get leading (): boolean {
    return this.#leading
  }

  start (): void {
    void this.#step()
  }

  async stop (): Promise<void> {
    this.#stopped = true
    clearTimeout(this.#timer)
    await this.#disconnect()
  }

  async #step (): Promise<void> {
    if (this.#stopped) return
    let delay = this.options.clockIntervalMs
    try {
      if (!this.#leading) {
        this.#client ??= await this.#connect()
        this.#leading = await tryLeadUpkeep(this.#client)
        if (this.#leading) this.options.log.info('this replica keeps the event log (clock)')
        else delay = RETRY_MS
      }
      if (this.#leading) {
        await writeClock(this.#client!)
        this.ticks++
      }
      if (this.#failing) this.options.log.info('event log upkeep recovered')
      this.#failing = false
    } catch (err) {
      if (!this.#failing) this.options.log.warn({ err }, 'event log upkeep failed; retrying')
      this.#failing = true
      await this.#disconnect()
      delay = RETRY_MS
    }
    if (!this.#stopped) this.#timer = setTimeout(() => { void this.#step() }, delay)
  }

  async #connect (): Promise<pg.Client> {
    const client = new pg.Client({ connectionString: this.options.url, application_name: 'ocp-api-upkeep' })
    // A dropped connection fails the next statement; this only keeps the process up.
    client.on('error', () => {})
    await client.connect()
    return client
  }

  async #disconnect (): Promise<void> {
    const client = this.#client
    this.#client = undefined
    this.#leading = false
    await client?.end().catch(() => {})
  }
}

/** Starts the upkeep where this service may write; see README "How the event order is settled". */
export default fp(async function eventLogPlugin (app) {
  if (app.upkeepDatabaseUrl === undefined) { // DATABASE_URL names a hot standby (plugins/app/db.ts says so)
    app.decorate('eventLog', undefined)
    return
  }
  const upkeep = new EventLogUpkeep({
    url: app.upkeepDatabaseUrl,
    clockIntervalMs: app.config.EVENTS_CLOCK_INTERVAL_MS,
    log: app.log.child({ component: 'event-log' })
  })
  app.decorate('eventLog', upkeep)
  app.addHook('onReady', async () => { upkeep.start() })
  app.addHook('onClose', async () => { await upkeep.stop() })
}, { name: 'event-log', dependencies: ['db'] })
