import { PGlite } from '@electric-sql/pglite'
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { createServer, type AddressInfo, type Server, type Socket } from 'node:net'
import { join } from 'node:path'
import { setFlagsFromString } from 'node:v8'

/*
 * The embedded database: PGlite (Postgres compiled to WebAssembly) in this
 * process, reached over the Postgres wire protocol on a loopback port, so
 * that `pg`, Kysely, the migrations, the queries, the event stream, psql and
 * the tests all run unchanged against it. For development and CI only.
 *
 * Why our own bridge rather than @electric-sql/pglite-socket: PGlite is ONE
 * backend, one session, shared by every connection. pglite-socket queues
 * single protocol messages, so under concurrent transactions it interleaved
 * one connection's statements into another's transaction and then hung (a
 * probe with 12 pooled connections: 699 errors of 900, then no progress).
 * This bridge gives the backend to one connection at a time for a whole
 * protocol cycle (up to Sync or a simple Query), and for a whole transaction
 * when the cycle leaves one open; other connections wait their turn, in
 * order. Each connection's startup `options` (`-c name=value`, as the
 * service's read-only pool sends) are applied with SET whenever the backend
 * passes to it, so per-connection settings hold as on a server.
 */

export interface EmbeddedPostgresOptions {
  /** A directory for the data files, or `memory://` for a throwaway database. */
  dataDir: string
  /** On loopback only; 0 picks a free port. */
  port?: number
  /** A connection that keeps a transaction open this long without a word is rolled back and closed. */
  idleInTransactionTimeoutMs?: number
}

export interface EmbeddedPostgres {
  /** A postgres:// URL for `pg` (and psql) to reach it. */
  readonly url: string
  readonly dataDir: string
  close (): Promise<void>
}

const SSL_REQUEST = 80877103
const GSSENC_REQUEST = 80877104
const PROTOCOL_3 = 196608
const SYNC = new Uint8Array([0x53, 0, 0, 0, 4])

/** Settings a client may carry in its startup `options`; anything else is refused, as a typo would be. */
const SETTING_NAME = /^[a-z_][a-z0-9_.]*$/i

/** The `-c name=value` and `--name=value` pairs of a startup `options` string. */
export function parseStartupOptions (options: string): Map<string, string> {
  const settings = new Map<string, string>()
  const words = options.split(/\s+/).filter((word) => word !== '')
  for (let i = 0; i < words.length; i++) {
    const word = words[i]!
    let pair: string | undefined
    if (word === '-c') pair = words[++i]
    else if (word.startsWith('--') || word.startsWith('-c')) pair = word.slice(2)
    const at = pair?.indexOf('=') ?? -1
    if (pair === undefined || at <= 0) throw new Error(`invalid startup option "${pair ?? word}"`)
    const name = pair.slice(0, at).replaceAll('-', '_')
    if (!SETTING_NAME.test(name)) throw new Error(`invalid setting name "${name}"`)
    settings.set(name.toLowerCase(), pair.slice(at + 1))
  }
  return settings
}

function quoteLiteral (value: string): string {
  return `'${value.replaceAll("'", "''")}'`
}

/** A protocol message: its type byte, its length (itself included), its body. */
export function frame (type: string, body: Buffer): Buffer {
  const head = Buffer.alloc(5)
  head.write(type, 0, 'latin1')
  head.writeInt32BE(body.length + 4, 1)
  return Buffer.concat([head, body])
}

/** A FATAL ErrorResponse, for a connection refused before it is ready. */
function fatal (code: string, message: string): Buffer {
  return frame('E', Buffer.from('SFATAL\0VFATAL\0C' + code + '\0M' + message + '\0\0', 'utf8'))
}

let nextConnectionId = 1

/**
 * The message with its prepared-statement and portal names moved into the
 * connection's namespace: in a server each connection has its own, and here
 * all share one session (two pooled connections preparing the same name
 * must not collide). Unnamed ones ('') stay as they are.
 */
export function namespaced (message: Buffer, namespace: string, prepared: Set<string>): Buffer {
  const type = String.fromCharCode(message[0]!)
  const body = message.subarray(5)
  const rename = (name: string) => name === '' ? '' : namespace + name
  const cString = (at: number) => {
    const end = body.indexOf(0, at)
    return { value: body.toString('utf8', at, end), next: end + 1 }
  }
  let parts: Array<string | Buffer>
  if (type === 'P') { // Parse: statement, query, parameter types
    const statement = cString(0)
    parts = [rename(statement.value), body.subarray(statement.next)]
    if (statement.value !== '') prepared.add(rename(statement.value))
  } else if (type === 'B') { // Bind: portal, statement, the rest
    const portal = cString(0)
    const statement = cString(portal.next)
    parts = [rename(portal.value), rename(statement.value), body.subarray(statement.next)]
  } else if (type === 'E') { // Execute: portal, row limit
    const portal = cString(0)
    parts = [rename(portal.value), body.subarray(portal.next)]
  } else if (type === 'D' || type === 'C') { // Describe or Close: 'S'tatement or 'P'ortal, name
    const name = cString(1)
    parts = [body.subarray(0, 1), rename(name.value), body.subarray(name.next)]
    if (type === 'C' && body[0] === 0x53) prepared.delete(rename(name.value))
  } else {
    return message
  }
  return frame(type, Buffer.concat(parts.map((part) => typeof part === 'string' ? Buffer.from(part + '\0', 'utf8') : part)))
}

class Connection {
  #buffer: Buffer = Buffer.alloc(0)
  #started = false
  #closed = false
  /** This connection's messages, run one after the other. */
  #work: Promise<void> = Promise.resolve()
  settings = new Map<string, string>()
  /** The prefix of its prepared statements' and portals' names in the shared session. */
  readonly namespace = `c${nextConnectionId++}_`
  /** Its named prepared statements, as named in the session, to deallocate when it goes. */
  readonly prepared = new Set<string>()

  readonly socket: Socket
  readonly bridge: Bridge

  constructor (socket: Socket, bridge: Bridge) {
    this.socket = socket
    this.bridge = bridge
    socket.setNoDelay(true)
    socket.on('data', (data) => this.#receive(data))
    socket.on('error', () => { this.close() })
    socket.on('close', () => { this.close() })
  }

  #receive (data: Buffer) {
    this.#buffer = this.#buffer.length === 0 ? data : Buffer.concat([this.#buffer, data])
    while (!this.#closed) {
      const startup = !this.#started
      const data = startup ? this.#nextStartup() : this.#nextMessage()
      if (data === undefined) break
      if (data !== null) this.#work = this.#work.then(() => this.bridge.run(this, data, startup))
    }
  }

  /** A complete startup-phase packet; null when it was answered here; undefined when incomplete. */
  #nextStartup (): Buffer | null | undefined {
    if (this.#buffer.length < 8) return undefined
    const length = this.#buffer.readInt32BE(0)
    const code = this.#buffer.readInt32BE(4)
    if (length < 8 || length > 10_000) { this.close(); return undefined }
    if (this.#buffer.length < length) return undefined
    const packet = this.#buffer.subarray(0, length)
    this.#buffer = this.#buffer.subarray(length)
    if (code === SSL_REQUEST || code === GSSENC_REQUEST) {
      this.socket.write('N') // no encryption on loopback; the client carries on in plain text
      return null
    }
    if (code !== PROTOCOL_3) {
      // A CancelRequest (code 80877102, unsupported: one backend cannot be interrupted from outside) or garbage.
      this.close()
      return undefined
    }
    this.#started = true
    return packet
  }

  /** A complete regular message (type byte, length, body), or undefined when incomplete. */
  #nextMessage (): Buffer | undefined {
    if (this.#buffer.length < 5) return undefined
    const length = this.#buffer.readInt32BE(1) + 1
    if (length < 5) { this.close(); return undefined }
    if (this.#buffer.length < length) return undefined
    const message = this.#buffer.subarray(0, length)
    this.#buffer = this.#buffer.subarray(length)
    return message
  }

  /** Sends the client bytes from the backend, unless it has gone. */
  write (data: Uint8Array) {
    if (!this.#closed && this.socket.writable) this.socket.write(data)
  }

  get closed () { return this.#closed }

  close () {
    if (this.#closed) return
    this.#closed = true
    this.socket.destroy()
    void this.bridge.disconnected(this)
  }
}

class Bridge {
  readonly #db: PGlite
  readonly #idleInTransactionTimeoutMs: number
  /** The connection the backend belongs to now, and those waiting for it, in order. */
  #owner: Connection | null = null
  #waiting: Array<{ connection: Connection, grant: () => void }> = []
  /** Whether the owner is inside a protocol cycle (sent messages and no Sync/Query closing them yet). */
  #midCycle = false
  /** The settings last applied to the session, to switch only what differs. */
  #applied = new Map<string, string>()
  #idleTimer: NodeJS.Timeout | undefined
  /** The connection whose message the backend is running now. */
  #running: Connection | null = null
  readonly connections = new Set<Connection>()

  constructor (db: PGlite, idleInTransactionTimeoutMs: number) {
    this.#db = db
    this.#idleInTransactionTimeoutMs = idleInTransactionTimeoutMs
  }

  async #acquire (connection: Connection): Promise<void> {
    if (this.#owner === connection) return
    if (this.#owner !== null) {
      await new Promise<void>((resolve) => { this.#waiting.push({ connection, grant: resolve }) })
    } else {
      this.#owner = connection
    }
  }

  #release () {
    clearTimeout(this.#idleTimer)
    const next = this.#waiting.shift()
    this.#owner = next?.connection ?? null
    next?.grant()
  }

  /** Sets the session as `connection` asked at startup: only what differs from the last owner's. */
  async #applySettings (connection: Connection) {
    const statements: string[] = []
    for (const name of this.#applied.keys()) {
      if (!connection.settings.has(name)) statements.push(`reset ${name}`)
    }
    for (const [name, value] of connection.settings) {
      if (this.#applied.get(name) !== value) statements.push(`set ${name} = ${quoteLiteral(value)}`)
    }
    if (statements.length === 0) return
    try {
      await this.#db.exec(statements.join(';\n'))
      this.#applied = new Map(connection.settings)
    } catch (err) {
      // A bad name or value, as a server refuses it at connection: back to the defaults, and the caller refuses the client.
      await this.#db.exec('reset all')
      this.#applied = new Map()
      throw err
    }
  }

  /** Runs one message of `connection` on the backend, waiting for its turn. */
  async run (connection: Connection, message: Buffer, startup: boolean) {
    await this.#acquire(connection)
    if (this.#owner !== connection) return // it went away while waiting
    clearTimeout(this.#idleTimer)
    const type = startup ? 'startup' : String.fromCharCode(message[0]!)
    if (type === 'X') connection.close() // Terminate: the backend is shared, so only the connection ends
    if (!connection.closed) {
      this.#running = connection
      try {
        if (startup) {
          const parameters = parseStartupParameters(message)
          if (asksReplication(parameters.get('replication'))) {
            // The one backend would become a WAL sender for every connection
            // (and refuse their queries): refused, as a server without
            // replication refuses it. The event wake-up then polls.
            connection.write(fatal('0A000', 'the embedded database does not serve replication connections'))
            connection.close()
          }
          connection.settings = parseStartupOptions(parameters.get('options') ?? '')
        }
        if (!this.#midCycle) await this.#applySettings(connection)
      } catch (err) {
        connection.write(fatal('22023', (err as Error).message))
        connection.close()
      }
      try {
        this.#midCycle = !startup
        const wire = startup ? message : namespaced(message, connection.namespace, connection.prepared)
        if (!connection.closed) await this.#db.runExclusive(() => this.#db.execProtocolRawStream(wire, { onRawData: (data) => connection.write(data) }))
      /* c8 ignore next 3: PGlite reports SQL errors to the client itself; this is a broken backend */
      } catch {
        connection.close()
      } finally {
        this.#running = null
      }
    }
    if (connection.closed) return this.#abandon(connection)
    if (type !== 'startup' && type !== 'S' && type !== 'Q') return // the cycle goes on
    this.#midCycle = false
    if (!this.#db.isInTransaction()) return this.#release()
    // The cycle left a transaction open: the backend stays this connection's until it ends.
    if (this.#idleInTransactionTimeoutMs > 0) {
      this.#idleTimer = setTimeout(() => {
        connection.write(fatal('25P03', 'terminating connection due to idle-in-transaction timeout'))
        connection.close()
      }, this.#idleInTransactionTimeoutMs)
      this.#idleTimer.unref()
    }
  }

  /** The backend's owner went away: finish its protocol cycle, roll back its transaction, pass the backend on. */
  async #abandon (connection: Connection) {
    if (this.#owner !== connection) return
    clearTimeout(this.#idleTimer)
    try {
      if (this.#midCycle) await this.#db.runExclusive(() => this.#db.execProtocolRaw(SYNC))
      this.#midCycle = false
      if (this.#db.isInTransaction()) await this.#db.exec('rollback')
      for (const name of connection.prepared) await this.#db.exec(`deallocate "${name.replaceAll('"', '""')}"`)
      connection.prepared.clear()
    /* c8 ignore next 2: a Sync or a rollback failing means a broken backend; the next owner will hear of it */
    } catch {
    } finally {
      this.#release()
    }
  }

  async disconnected (connection: Connection) {
    this.connections.delete(connection)
    this.#waiting = this.#waiting.filter((waiter) => {
      if (waiter.connection !== connection) return true
      waiter.grant() // wakes its run() only to return: it does not own the backend
      return false
    })
    // While one of its messages runs, run() itself abandons once the message is done.
    if (this.#owner === connection && this.#running !== connection) await this.#abandon(connection)
    // Its prepared statements outlive it in the shared session: take a turn to deallocate them.
    if (connection.prepared.size > 0 && this.#owner !== connection) {
      await this.#acquire(connection)
      await this.#abandon(connection)
    }
  }
}

/** Whether a StartupMessage's `replication` parameter asks for a replication connection (`true`, `database`, ...). */
function asksReplication (value: string | undefined): boolean {
  return value !== undefined && !['false', 'off', 'no', '0'].includes(value.toLowerCase())
}

/** The key/value pairs of a StartupMessage (user, database, options, ...). */
function parseStartupParameters (message: Buffer): Map<string, string> {
  const parameters = new Map<string, string>()
  const parts = message.subarray(8).toString('utf8').split('\0')
  for (let i = 0; i + 1 < parts.length && parts[i] !== ''; i += 2) parameters.set(parts[i]!, parts[i + 1]!)
  return parameters
}

const LOCK_FILE = 'ocp-embedded.pid'

/** Refuses a data directory that another live process has open (PGlite would corrupt it). */
function lockDataDir (dataDir: string): () => void {
  mkdirSync(dataDir, { recursive: true })
  const lockFile = join(dataDir, LOCK_FILE)
  if (existsSync(lockFile)) {
    const pid = Number(readFileSync(lockFile, 'utf8').trim())
    let alive = false
    try {
      process.kill(pid, 0)
      alive = pid !== process.pid
    } catch {}
    if (alive) {
      throw new Error(`the embedded database in ${dataDir} is in use by process ${pid}: stop it, or connect through the URL that process logged ` +
        '(DATABASE_URL=...)')
    }
  }
  writeFileSync(lockFile, String(process.pid))
  return () => rmSync(lockFile, { force: true })
}

/*
 * V8 in Node 24 (13.6) can free a WebAssembly import wrapper twice when its
 * code GC races a wrapper's tier-up, and the process dies on a failed CHECK
 * (`jit_page_->allocations_.erase(addr) == 1` in
 * ThreadIsolation::UnregisterWasmAllocation, SIGILL): nodejs/node#64500 and
 * #66366, fixed in V8 9b8ca54d5a, not yet in a Node 24 release. PGlite, which
 * churns Wasm code, trips it now and then; it killed a CI run here. Without
 * Wasm code GC the race cannot happen (upstream: 16 crashes in 40 runs, then
 * 0 in 20). The cost is that code replaced by its optimized tier stays in
 * memory: bounded by PGlite's one module. Node refuses the flag in
 * NODE_OPTIONS; set before PGlite starts, it holds for this process, and
 * only a process that runs the embedded database pays it.
 */
function avoidWasmCodeGcCrash (): void {
  setFlagsFromString('--no-wasm-code-gc')
}

/**
 * Starts PGlite on `dataDir` (created when new) and a loopback listener
 * that speaks the Postgres protocol for it.
 */
export async function startEmbeddedPostgres (options: EmbeddedPostgresOptions): Promise<EmbeddedPostgres> {
  avoidWasmCodeGcCrash()
  const inMemory = options.dataDir.startsWith('memory://')
  const unlock = inMemory ? () => {} : lockDataDir(options.dataDir)
  let db: PGlite
  try {
    db = await PGlite.create(inMemory ? undefined : options.dataDir)
  } catch (err) {
    unlock()
    throw err
  }
  const bridge = new Bridge(db, options.idleInTransactionTimeoutMs ?? 60_000)
  const server: Server = createServer((socket) => { bridge.connections.add(new Connection(socket, bridge)) })
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject)
    server.listen(options.port ?? 0, '127.0.0.1', () => { server.off('error', reject); resolve() })
  })
  const { port } = server.address() as AddressInfo
  let closing: Promise<void> | undefined
  return {
    url: `postgres://postgres@127.0.0.1:${port}/postgres`,
    dataDir: options.dataDir,
    close () {
      closing ??= (async () => {
        await new Promise<void>((resolve) => {
          server.close(() => resolve())
          for (const connection of bridge.connections) connection.close()
        })
        await db.close()
        unlock()
      })()
      return closing
    }
  }
}

/**
 * Runs `work` against DATABASE_URL when it is set, else against the
 * embedded database in PGLITE_DATA_DIR (for the command-line tools: seed,
 * migrate), opened for the call and closed after it.
 */
export async function withDatabaseUrl<T> (
  settings: { DATABASE_URL?: string | undefined, PGLITE_DATA_DIR: string },
  work: (url: string) => Promise<T>
): Promise<T> {
  if (settings.DATABASE_URL !== undefined) return work(settings.DATABASE_URL)
  const embedded = await startEmbeddedPostgres({ dataDir: settings.PGLITE_DATA_DIR })
  try {
    return await work(embedded.url)
  } finally {
    await embedded.close()
  }
}
