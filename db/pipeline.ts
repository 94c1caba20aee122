import type { Socket } from 'node:net'
import pg from 'pg'

/*
 * Why the API's reads share a few connections rather than take turns on
 * the pool's: a pooled connection carries one statement at a time, so
 * each read waits for its round trip before the next can use it, and
 * every read wakes a Postgres backend of its own. In pg's pipeline mode a
 * connection carries several statements at once (each with its own Sync,
 * so one that fails fails alone), and a backend answers those that
 * queued while it worked without going back to sleep: more reads a
 * second, and no read waiting for a free connection (BENCHMARKS.md, "A
 * small run detail against its statement").
 *
 * The reads of one turn of the event loop (db/statement.ts sends them
 * together, in batch()) go to one connection, up to TURN_BATCH_MAX, whose
 * socket is corked meanwhile: their statements leave in one write system
 * call rather than one each: a write system call, which also wakes its
 * reader, is the service's largest single cost per read.
 *
 * The price is head-of-line waiting: a statement queued behind a slow one
 * on the same connection waits for it. A turn's reads go to the connection
 * with the fewest statements in flight, and another connection is opened
 * while every open one is busy, up to `size`. A connection that has not
 * answered for STALLED_MS while it has statements in flight is behind a
 * slow one, and gets no more while another can take them. The reads sent
 * here are the API's one-statement bodies (db/queries.ts), each bounded
 * by a page size and by the server's statement timeout.
 */

/** How long a connection with statements in flight may go without answering one before it counts as behind a slow statement. */
export const STALLED_MS = 50

/** One connection in pipeline mode, and how many statements it has in flight. */
class PipelinedConnection {
  inFlight = 0
  /** Connected: a statement given now is written at once. */
  connected = false
  /** When it last answered a statement or, idle, was given one (performance.now()). */
  movedAt = 0
  readonly client: pg.Client
  readonly ready: Promise<void>
  /** Told once nothing is in flight (end() waits for it). */
  #whenIdle: Array<() => void> = []

  constructor (config: pg.ClientConfig, dropped: (connection: PipelinedConnection) => void) {
    this.client = new pg.Client({ ...config, pipeline: true })
    // A connection lost with statements in flight fails them (they answer
    // 503); this listener keeps the process up and the connection out of use.
    this.client.on('error', () => dropped(this))
    this.client.on('end', () => dropped(this))
    this.ready = this.client.connect().then(() => { this.connected = true }, (err: unknown) => {
      dropped(this)
      throw err
    })
  }

  /** Resolves once nothing is in flight: a read may still be waiting for the connection, its statement not yet sent. */
  idle (): Promise<void> {
    return this.inFlight === 0 ? Promise.resolve() : new Promise((resolve) => this.#whenIdle.push(resolve))
  }

  /** One statement more in flight; an idle connection starts its clock now (STALLED_MS). */
  given (now: number): void {
    if (this.inFlight++ === 0) this.movedAt = now
  }

  /** Its socket (pg's), to hold a turn's statements for one write. */
  get socket (): Socket {
    return (this.client as unknown as { connection: { stream: Socket } }).connection.stream
  }

  /** One statement less in flight. */
  answered (): void {
    this.inFlight--
    this.movedAt = performance.now()
    if (this.inFlight === 0) for (const resolve of this.#whenIdle.splice(0)) resolve()
  }
}

/** The most statements one turn's batch puts on one connection before it takes the next least busy one. */
export const TURN_BATCH_MAX = 4

export class PipelinedConnections {
  readonly #open: PipelinedConnection[] = []
  #ended = false
  /** In a turn's batch (batch()): the connection its statements go to, and those corked meanwhile. */
  #turn: { connection: PipelinedConnection | undefined, corked: Socket[] } | undefined
  /** Looks for idle connections to close while any is open. */
  #sweeper: NodeJS.Timeout | undefined

  readonly config: pg.ClientConfig
  readonly size: number
  readonly idleMs: number

  /**
   * `config` as a pooled connection's (db/pool.ts); at most `size`
   * connections, each closed once idle for `idleMs`, as the pool closes
   * its own, so that a replica past its busy hour gives them back.
   */
  constructor (config: pg.ClientConfig, size: number, idleMs: number) {
    this.config = config
    this.size = size
    this.idleMs = idleMs
  }

  /** Connections open or opening. */
  get openCount (): number {
    return this.#open.length
  }

  /** Statements sent and not yet answered, on every connection. */
  get inFlightCount (): number {
    return this.#open.reduce((sum, connection) => sum + connection.inFlight, 0)
  }

  /**
   * Runs `use` on the least busy connection once it is connected; `sent` is
   * called just before (or when the connection is refused), when whatever
   * `use` sends first goes out on the wire.
   */
  async run<T> (use: (client: pg.Client) => Promise<T>, sent: () => void): Promise<T> {
    if (this.#ended) {
      sent()
      // pg-pool's own words after its end, which errors.ts answers as 503 (poolFailureMessages).
      throw new Error('Cannot use a pool after calling end on the pool')
    }
    const now = performance.now()
    const connection = this.#pick(now)
    connection.given(now)
    try {
      // Connected: written now, synchronously (a turn's batch holds it for one write).
      if (connection.connected) sent()
      else await connection.ready.finally(sent)
      return await use(connection.client).catch((err: unknown) => {
        // A session survives an error of a statement (severity ERROR); any
        // other failure (FATAL, a connection lost or timed out) ends it, and
        // its 'end' may come after the next read would have gone to it.
        if (!(err instanceof pg.DatabaseError && err.severity === 'ERROR')) this.#retire(connection)
        throw err
      })
    } finally {
      connection.answered()
    }
  }

  /**
   * Runs `fn`, whose run() calls are one turn's reads: they go to one
   * connection (up to TURN_BATCH_MAX, then the next least busy), whose
   * socket is corked until `fn` returns, so that their statements leave
   * in one write rather than one each.
   */
  batch (fn: () => void): void {
    const turn = this.#turn = { connection: undefined as PipelinedConnection | undefined, corked: [] as Socket[] }
    try {
      fn()
    } finally {
      this.#turn = undefined
      for (const socket of turn.corked) socket.uncork()
    }
  }

  /** The connection for a statement: the turn's, while it has room, else the least busy (corked, in a turn). */
  #pick (now: number): PipelinedConnection {
    const turn = this.#turn
    if (turn === undefined) return this.#leastBusy(now)
    if (turn.connection !== undefined && turn.connection.inFlight < TURN_BATCH_MAX) return turn.connection
    const connection = turn.connection = this.#leastBusy(now)
    if (connection.connected) {
      const socket = connection.socket
      if (!turn.corked.includes(socket)) {
        socket.cork()
        turn.corked.push(socket)
      }
    }
    return connection
  }

  /**
   * Closes every connection, once what each has in flight is answered:
   * reads still waiting for their connection to open are sent first (a
   * client ended before they are sent would refuse them).
   */
  async end (): Promise<void> {
    this.#ended = true
    clearInterval(this.#sweeper)
    await Promise.all(this.#open.map((connection) => connection.ready.then(() => connection.idle()).then(() => connection.client.end(), () => {})))
  }

  /**
   * The open connection with the fewest statements in flight, leaving out
   * those behind a slow statement; a new one while each is busy and there
   * is room; with no room and every one stalled, the one that last moved.
   */
  #leastBusy (now: number): PipelinedConnection {
    let least: PipelinedConnection | undefined
    let latest: PipelinedConnection | undefined
    for (const connection of this.#open) {
      if (latest === undefined || connection.movedAt > latest.movedAt) latest = connection
      if (connection.inFlight > 0 && now - connection.movedAt > STALLED_MS) continue
      if (least === undefined || connection.inFlight < least.inFlight) least = connection
    }
    const full = this.#open.length >= this.size
    if (least !== undefined && (least.inFlight === 0 || full)) return least
    if (full) return latest!
    const opened = new PipelinedConnection(this.config, (dropped) => this.#drop(dropped))
    this.#open.push(opened)
    this.#sweeper ??= setInterval(() => this.#closeIdle(), this.idleMs / 4).unref()
    return opened
  }

  /** Closes the connections idle for idleMs; stops looking once none is open. */
  #closeIdle (): void {
    const now = performance.now()
    for (const connection of [...this.#open]) {
      if (connection.inFlight === 0 && now - connection.movedAt >= this.idleMs) this.#retire(connection)
    }
    if (this.#open.length === 0) {
      clearInterval(this.#sweeper)
      this.#sweeper = undefined
    }
  }

  /** Out of use and closed: what it has in flight is answered first, if it still can be. */
  #retire (connection: PipelinedConnection): void {
    this.#drop(connection)
    connection.client.end().catch(() => {})
  }

  #drop (connection: PipelinedConnection): void {
    const index = this.#open.indexOf(connection)
    if (index >= 0) this.#open.splice(index, 1)
  }
}
