import type { ServerResponse } from 'node:http'
import { Socket } from 'node:net'
import type { Listener } from '../hub.ts'
import { matchesFilter, type EventFilter, type StoredEvent } from '../statements.ts'

/**
 * The frame of the last event built: the hub hands one event to every
 * matching stream before the next, so thousands of streams share one string
 * instead of each building (and flattening) its own copy.
 */
let lastFramed: { event: StoredEvent, frame: string } | undefined

/** One event on the wire (docs/reference.md, "The event stream"): its id, its envelope as one data line, a blank line. */
export function eventFrame (event: StoredEvent): string {
  if (lastFramed?.event !== event) lastFramed = { event, frame: `id: ${event.id}\ndata: ${event.json}\n\n` }
  return lastFramed.frame
}

/**
 * The last text written, as one HTTP/1.1 chunk (size line, text, CRLF):
 * the fan-out writes the same text to thousands of streams in a row, so
 * they share one Buffer.
 */
let lastChunk: { text: string, chunk: Buffer } | undefined

function chunkOf (text: string): Buffer {
  if (lastChunk?.text !== text) lastChunk = { text, chunk: Buffer.from(`${Buffer.byteLength(text).toString(16)}\r\n${text}\r\n`) }
  return lastChunk.chunk
}

export const KEEP_ALIVE = ': keep-alive\n\n'

/** How often a client that fell behind is looked at for room (see Subscriber's #drained). */
const ROOM_CHECK_MS = 10

/**
 * How a stream writes what it tells its client: an event, a position it
 * has reached without an event (a quiet filtered stream), and, optionally,
 * a catch-up page at once. The event stream's own format
 * (docs/reference.md, "The event stream") is EVENT_STREAM_FORMAT; the Durable Streams SSE
 * mode has its own (durable/format.ts).
 */
export interface StreamFormat {
  event: (event: StoredEvent, live: boolean) => string
  position: (position: number) => string
  /**
   * A catch-up page at once (the Durable Streams SSE mode): its events, then
   * one word of where the client is, at `position` or, `upToDate`, at the
   * tail if that is further; returns the text and the position told.
   */
  batch?: (events: StoredEvent[], position: number, upToDate: boolean) => { text: string, position: number }
}

export const EVENT_STREAM_FORMAT: StreamFormat = {
  event: eventFrame,
  position: (position) => `id: ${position}\n\n`
}

export interface SubscriberOptions {
  /** Reads up to pageSize matching events after an id (the event reader: the window, or the table). */
  readAfter: (afterId: number, filter: EventFilter) => Promise<StoredEvent[]>
  pageSize: number
  /** Most bytes queued for the client before it stops receiving live events. */
  maxBufferedBytes: number
  /** How long a client over the bound may take to drain before it is disconnected. */
  slowClientMs: number
  /** Told why a stream was cut (a client that does not read, a failed read). */
  onDrop: (subscriber: Subscriber, reason: string, err?: unknown) => void
}

/**
 * One open stream. It is either live (the hub hands it each matching event
 * as it is polled) or catching up (reading the table from its last id while
 * the hub's live events wait in a bounded buffer). Every write goes through
 * `send`, which drops anything at or below the last id written, so the
 * hand-off between the two can neither repeat nor reorder an event.
 *
 * A client whose unsent bytes pass maxBufferedBytes stops receiving live
 * events and catches up from the table once it drains; if it does not drain
 * within slowClientMs it is disconnected. Memory per client stays bounded.
 */
export class Subscriber implements Listener {
  /** The last position this client was told of, by an event or an id-only block. */
  lastId: number
  /** Events written to this client (its stream's end line says it). */
  sent = 0
  lastWriteAt = Date.now()
  /**
   * The share of keepAliveMs this stream stays quiet before its keep-alive:
   * its own, from a half to the whole. Streams opened together (a reconnect
   * storm, a replica's start) would otherwise get their keep-alives in the
   * same sweep, every keepAliveMs from then on: at 5,000 streams a burst of
   * writes as long as a fan-out, which an event arriving then waits behind.
   */
  readonly #quietShare = 0.5 + Math.random() / 2
  /** Live events that arrived while catching up; undefined when live. */
  #waiting: StoredEvent[] | undefined = []
  #waitingBytes = 0
  #overflowed = false
  /** Set by the first write, which sends the response's headers with it. */
  #headersSent = false

  readonly response: ServerResponse
  readonly filter: EventFilter
  readonly options: SubscriberOptions
  readonly format: StreamFormat

  constructor (response: ServerResponse, filter: EventFilter, startId: number, options: SubscriberOptions, format: StreamFormat = EVENT_STREAM_FORMAT) {
    this.response = response
    this.filter = filter
    this.lastId = startId
    this.options = options
    this.format = format
  }

  get isLive () {
    return this.#waiting === undefined
  }

  get closed () {
    return this.response.destroyed || this.response.writableEnded
  }

  matches (event: StoredEvent): boolean {
    return matchesFilter(this.filter, event)
  }

  /** A live event from the hub: sent now, or kept until catch-up ends. */
  offer (event: StoredEvent): void {
    if (this.#waiting === undefined) {
      if (this.response.writableLength <= this.options.maxBufferedBytes) {
        this.send(event)
        return
      }
      this.#fallBehind()
    }
    if (this.#overflowed) return
    this.#waiting!.push(event)
    this.#waitingBytes += event.json.length
    if (this.#waitingBytes > this.options.maxBufferedBytes) {
      // Too much arrived meanwhile: forget it, the table still has it.
      this.#overflowed = true
      this.#waiting = []
      this.#waitingBytes = 0
    }
  }

  /**
   * Writes events from the table until level with the hub, then goes live.
   * `firstPage`, when given, is the first page already read after lastId
   * (empty: nothing to read). Failures end the stream: the client resumes
   * from its last id.
   */
  async catchUp (firstPage?: StoredEvent[]): Promise<void> {
    try {
      let page = firstPage ?? await this.options.readAfter(this.lastId, this.filter)
      for (;;) {
        const last = page.length < this.options.pageSize
        if (this.format.batch !== undefined) {
          // The last page, the live events that came meanwhile and the tail: one batch, one word that it is up to date.
          const waiting = last ? this.#takeWaiting() : undefined
          if (!this.#sendBatch(waiting === undefined ? page : [...page, ...waiting], waiting !== undefined) && !await this.#drained()) return
          if (waiting !== undefined || this.closed) return
        } else {
          for (const event of page) {
            if (!this.send(event) && !await this.#drained()) return
          }
          if (this.closed) return
          if (last && this.#goLive()) return
        }
        page = await this.options.readAfter(this.lastId, this.filter)
      }
    } catch (err) {
      this.options.onDrop(this, 'reading the events failed', err)
      this.end()
    }
  }

  /**
   * Called periodically: after its share of keepAliveMs without a write, moves a quiet
   * (filtered) client's event id to the hub's tail with an id-only block, and
   * sends a keep-alive comment so proxies keep the connection open.
   */
  heartbeat (now: number, tail: number, keepAliveMs: number): void {
    if (!this.isLive || now - this.lastWriteAt < keepAliveMs * this.#quietShare) return
    let text = KEEP_ALIVE
    if (tail > this.lastId) {
      this.lastId = tail
      text = this.format.position(tail) + text
    }
    this.write(text)
  }

  /** Writes an event past the last id written. False when the socket asks to wait for 'drain'. */
  send (event: StoredEvent): boolean {
    if (event.id <= this.lastId) return true
    this.lastId = event.id
    this.sent++
    return this.write(this.format.event(event, this.isLive))
  }

  /**
   * Once the headers are out, a chunked response's text goes to the socket
   * as one ready-made chunk: one write system call per stream and event,
   * where ServerResponse.write makes a writev of four pieces (size, CRLF,
   * text, CRLF) and encodes the text again for every stream. At thousands
   * of streams those calls are the fan-out's cost (BENCHMARKS.md, "Event
   * wake-up"). The bytes on the wire are the same; response.writableLength
   * counts the socket's queue, and response.end() still ends the body.
   */
  write (text: string): boolean {
    if (this.closed) return true
    this.lastWriteAt = Date.now()
    const socket = this.response.socket
    if (this.#headersSent && this.response.chunkedEncoding && socket instanceof Socket) return socket.write(chunkOf(text))
    this.#headersSent = true
    return this.response.write(text)
  }

  /** Ends the stream cleanly (shutdown): the client reconnects, elsewhere or later. */
  end (): void {
    if (!this.closed) this.response.end()
  }

  /**
   * The hub stops: the stream ends, and its client resumes from its last
   * id. One still opening (no byte sent yet) is left to its open, which
   * answers it as a retry (EventStreams.open).
   */
  close (): void {
    if (this.response.headersSent) this.end()
  }

  /** A new epoch began at `base`: a stream past it ends; its client's reconnect learns (410) to refetch. */
  rewound (base: number): void {
    if (this.lastId > base) this.end()
  }

  /** Ends a catch-up pass: false when live events overflowed meanwhile (another pass is needed). */
  #goLive (): boolean {
    const waiting = this.#takeWaiting()
    if (waiting === undefined) return false
    for (const event of waiting) this.send(event)
    return true
  }

  /** Goes live, with the live events that waited; undefined when they overflowed (another pass is needed). */
  #takeWaiting (): StoredEvent[] | undefined {
    if (this.#overflowed) {
      this.#overflowed = false
      return undefined
    }
    const waiting = this.#waiting!
    this.#waiting = undefined
    this.#waitingBytes = 0
    return waiting
  }

  /**
   * Writes the events past the last id written as one batch (format.batch),
   * each once: a live event that waited may be on the page too. False when
   * the socket asks to wait for 'drain'.
   */
  #sendBatch (events: StoredEvent[], upToDate: boolean): boolean {
    const fresh: StoredEvent[] = []
    for (const event of events) {
      if (event.id > (fresh.at(-1)?.id ?? this.lastId)) fresh.push(event)
    }
    const { text, position } = this.format.batch!(fresh, fresh.at(-1)?.id ?? this.lastId, upToDate)
    this.lastId = position
    this.sent += fresh.length
    return this.write(text)
  }

  /** The client is not keeping up: buffer live events, and catch up once it drains. */
  #fallBehind (): void {
    this.#waiting = []
    void this.#drained().then((drained) => drained ? this.catchUp() : undefined)
  }

  /**
   * Waits for the client to get back within maxBufferedBytes; false (and
   * disconnected) if it does not within slowClientMs. Looked at every
   * ROOM_CHECK_MS: 'drain' comes only after a write past the socket's
   * high-water mark (64 KiB since Node 22), which can lie above
   * maxBufferedBytes, and a callback on every write (which would tell)
   * costs every stream's every write a tick and its garbage, for the rare
   * client that falls behind.
   */
  #drained (): Promise<boolean> {
    if (this.closed) return Promise.resolve(false)
    return new Promise((resolve) => {
      const finish = (drained: boolean) => {
        clearInterval(check)
        clearTimeout(timer)
        this.response.off('close', onClose)
        if (!drained && !this.closed) {
          this.options.onDrop(this, 'the client is not reading')
          this.response.destroy()
        }
        resolve(drained && !this.closed)
      }
      const onClose = () => finish(false)
      const check = setInterval(() => { if (this.response.writableLength <= this.options.maxBufferedBytes) finish(true) }, ROOM_CHECK_MS)
      const timer = setTimeout(() => finish(false), this.options.slowClientMs)
      this.response.on('close', onClose)
    })
  }
}
