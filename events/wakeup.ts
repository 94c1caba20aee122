/*
 * The event hub's wake-up (EVENTS_WAKEUP): a physical replication
 * connection to the database the hub reads from, over which the server
 * streams its WAL the moment it is flushed. Every commit anywhere in the
 * cluster arrives as WAL; each arrival wakes the hub, which polls at once
 * (hub.ts: coalesced and rate-bounded, so statements per second stay
 * independent of the number of streams). The WAL itself is thrown away.
 *
 * Why WAL rather than NOTIFY: nothing is added to the write path (NOTIFY
 * takes a global lock at commit and serializes committing writers), it
 * needs no statement per wake-up, and it works on a hot standby, whose
 * cascading WAL sender streams what the standby has received (a wake-up
 * there may precede the replay: the hub re-checks once shortly after a
 * wake-up that found nothing). docs/stream.md, "How the stream learns of new events".
 *
 * The wake-up is only a hint: the table stays the only truth, and the hub
 * keeps polling as a safety net. A connection that is refused at the start
 * (no `replication` line in pg_hba.conf, a role without REPLICATION, a
 * pooler that does not pass replication connections) leaves the hub
 * polling, logged once, under EVENTS_WAKEUP=auto; under `wal` it is
 * retried. A connection that drops (server restart, network, a terminated
 * WAL sender) is retried with backoff, logged once per outage and counted.
 */
import type { FastifyBaseLogger } from 'fastify'
import pg from 'pg'

export type WakeupMode = 'auto' | 'wal' | 'off'

export interface WalWakeupOptions {
  /** The server the hub reads from: DATABASE_READ_URL when it names a hot standby, else DATABASE_URL (plugins/app/db.ts, wakeupDatabaseUrl). */
  url: string
  /** auto: a refusal at the start leaves it off; wal: every failure is retried. */
  mode: 'auto' | 'wal'
  connectTimeoutMs: number
  log: FastifyBaseLogger
  /** WAL arrived (or the stream just (re)started: whatever came meanwhile was not seen). */
  onWake: () => void
  /** The wake-up became live (streaming), or stopped being live. */
  onLive: (live: boolean) => void
  /** The first and the longest delay before reconnecting (doubling in between). */
  retryMinMs?: number
  retryMaxMs?: number
}

/** Microseconds between Unix time's origin (1970-01-01) and Postgres's (2000-01-01), for the status update's clock. */
const POSTGRES_EPOCH_US = 946_684_800_000_000n

/**
 * A standby status update ('r'). It reports as written the end of the WAL
 * received so far: a server shutting down waits until its WAL senders'
 * clients have confirmed all it sent (walsender.c, WalSndDone), and would
 * wait on this connection forever. Flush and apply stay 0
 * (InvalidXLogRecPtr), as pg_basebackup's WAL streaming reports them: with
 * no valid flush position, this connection is never taken for a
 * synchronous standby (syncrep.c, SyncRepGetCandidateStandbys;
 * synchronous_standby_names = '*' included), so commits never wait on it.
 */
function statusUpdate (receivedEnd: bigint): Buffer {
  const message = Buffer.alloc(34)
  message.write('r', 0)
  message.writeBigUInt64BE(receivedEnd, 1)
  message.writeBigInt64BE(BigInt(Date.now()) * 1000n - POSTGRES_EPOCH_US, 25)
  return message
}

/**
 * SQLSTATEs that mean "this server will not stream to us" rather than "not
 * now": authorization (28: pg_hba.conf, password), privilege (42501: no
 * REPLICATION), a protocol violation (08P01: a pooler that refuses the
 * `replication` startup parameter), and a feature missing (0A000).
 */
export function isRefusal (err: unknown): boolean {
  const code = (err as { code?: unknown }).code
  return typeof code === 'string' && (code.startsWith('28') || code === '42501' || code === '08P01' || code === '0A000')
}

interface ReplicationConnection {
  on: (event: 'copyData', listener: (message: { chunk: Buffer }) => void) => void
  once: (event: 'replicationStart' | 'copyDone', listener: () => void) => void
  sendCopyFromChunk: (chunk: Buffer) => void
  endCopyFrom: () => void
}

/** One START_REPLICATION: where to answer, and the end of the WAL received on it so far. */
interface WalStream { connection: ReplicationConnection, receivedEnd: bigint }

export class WalWakeup {
  /** Whether WAL is streaming to it now. */
  live = false
  /** Live connections lost since start (a metric). */
  lost = 0
  /** WAL messages received since start (a metric). */
  wakes = 0
  /** Set when EVENTS_WAKEUP=auto met a refusal: the hub polls, and it is not tried again. */
  refused = false
  #client: pg.Client | undefined
  #retryTimer: NodeJS.Timeout | undefined
  #retryMs: number
  #everLive = false
  /** Whether the current outage (or failure to start) has been logged. */
  #troubleLogged = false
  readonly #retryMinMs: number
  readonly #retryMaxMs: number

  readonly options: WalWakeupOptions

  constructor (options: WalWakeupOptions) {
    this.options = options
    this.#retryMinMs = options.retryMinMs ?? 500
    this.#retryMaxMs = options.retryMaxMs ?? 30_000
    this.#retryMs = this.#retryMinMs
  }

  start (): void {
    void this.#connect()
  }

  async stop (): Promise<void> {
    clearTimeout(this.#retryTimer)
    const client = this.#client
    this.#client = undefined
    if (client !== undefined) await client.end().catch(() => {})
  }

  async #connect (): Promise<void> {
    // replication=true: a physical replication connection (pg passes it in the startup message; its types omit it).
    const config: pg.ClientConfig & { replication: string } = {
      connectionString: this.options.url,
      replication: 'true',
      application_name: 'ocp-api-wakeup',
      connectionTimeoutMillis: this.options.connectTimeoutMs,
      keepAlive: true
    }
    const client = new pg.Client(config)
    this.#client = client
    // A dropped connection also rejects the query in flight, handled below.
    client.on('error', () => {})
    try {
      await client.connect()
      const { rows: [system] } = await client.query<{ xlogpos: string }>('IDENTIFY_SYSTEM')
      const connection = (client as unknown as { connection: ReplicationConnection }).connection
      // Per connection: a position reported beyond what this server sent would hold its shutdown up as 0 did.
      const stream: WalStream = { connection, receivedEnd: 0n }
      connection.on('copyData', ({ chunk }) => { this.#received(stream, chunk) })
      connection.once('replicationStart', () => { this.#streaming() })
      // The server ends the stream at the end of a timeline (a standby promoted):
      // it waits for the client to end it too before it says where the next one starts.
      connection.once('copyDone', () => { connection.endCopyFrom() })
      // From where the server is now: what was written before is the poll's to find.
      await client.query(`START_REPLICATION PHYSICAL ${system!.xlogpos}`)
      // Then start again, on the new timeline.
      throw new Error('the server ended WAL streaming: its timeline changed')
    } catch (err) {
      if (this.#client === client) this.#failed(client, err)
    }
  }

  #streaming (): void {
    this.live = true
    this.#everLive = true
    this.#retryMs = this.#retryMinMs
    if (this.#troubleLogged) this.options.log.info('event wake-up is streaming WAL again: new events are delivered as they commit')
    this.#troubleLogged = false
    this.options.onLive(true)
    this.options.onWake()
  }

  /**
   * XLogData ('w') wakes the hub. A keepalive ('k') asking for a reply gets
   * a status update: the server asks once half of wal_sender_timeout has
   * passed without one, and cuts the connection at the whole; and asks at
   * shutdown, to learn that all it sent has arrived.
   */
  #received (stream: WalStream, chunk: Buffer): void {
    if (chunk[0] === 0x77) {
      // Its WAL starts at dataStart (bytes 1..8) and follows the 25-byte header.
      this.#receivedUpTo(stream, chunk.readBigUInt64BE(1) + BigInt(chunk.length - 25))
      this.wakes++
      this.options.onWake()
    } else if (chunk[0] === 0x6b) {
      // walEnd (bytes 1..8): where the server's sending is, all of it sent before this message.
      this.#receivedUpTo(stream, chunk.readBigUInt64BE(1))
      if (chunk[17] === 1) stream.connection.sendCopyFromChunk(statusUpdate(stream.receivedEnd))
    }
  }

  #receivedUpTo (stream: WalStream, end: bigint): void {
    if (end > stream.receivedEnd) stream.receivedEnd = end
  }

  #failed (client: pg.Client, err: unknown): void {
    this.#client = undefined
    void client.end().catch(() => {})
    const wasLive = this.live
    if (wasLive) {
      this.live = false
      this.lost++
      this.options.onLive(false)
    }
    const { log, mode } = this.options
    if (!this.#everLive && mode === 'auto' && isRefusal(err)) {
      this.refused = true
      // The common case (most databases allow no replication connection): one
      // line at info with the database's own words, no stack; nothing is wrong.
      const { message, code } = err as { message?: string, code?: string }
      log.info({ code, reason: message }, 'event wake-up refused by the database (a physical replication connection needs a `replication` line in ' +
        'pg_hba.conf and a role with REPLICATION): events are polled every EVENTS_POLL_INTERVAL_MS instead; EVENTS_WAKEUP=off silences this')
      return
    }
    if (!this.#troubleLogged) {
      this.#troubleLogged = true
      const what = wasLive ? 'event wake-up lost its WAL stream' : 'event wake-up cannot stream WAL'
      log.warn({ err }, `${what}: events are polled every EVENTS_POLL_INTERVAL_MS until it is back; retrying`)
    }
    this.#retryTimer = setTimeout(() => { void this.#connect() }, this.#retryMs)
    this.#retryMs = Math.min(this.#retryMs * 2, this.#retryMaxMs)
  }
}
