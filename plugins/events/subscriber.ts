import type { ServerResponse } from 'node:http'
import type { EventFilter, StoredEvent } from '../../db/events.js'

/** One event on the wire (CONTRACT section 5): its id, its envelope as one data line, a blank line. */
export const eventFrame = (event: StoredEvent) => `id: ${event.id}\ndata: ${event.json}\n\n`

export const KEEP_ALIVE = ': keep-alive\n\n'

/**
 * One open stream. It starts "catching up" (reading the table from its
 * cursor while the hub's live events wait in a bounded buffer), then goes
 * live: the hub hands it each matching event as it is polled. Every write
 * goes through `send`, which drops anything at or below the last id
 * written, so the hand-off between the two can neither repeat nor reorder.
 */
export class Subscriber {
  /** The last position this client was told of, by an event or an id-only block. */
  lastId: number
  lastWriteAt = Date.now()
  /** Live events that arrived during catch-up; undefined once live. */
  #waiting: StoredEvent[] | undefined = []
  #waitingBytes = 0
  #overflowed = false

  constructor (
    readonly response: ServerResponse,
    readonly filter: EventFilter,
    startId: number,
    readonly maxBufferedBytes: number,
    /** Called when the client stopped reading: its buffer passed maxBufferedBytes. */
    readonly onSlowConsumer: (subscriber: Subscriber) => void
  ) {
    this.lastId = startId
  }

  get isLive () {
    return this.#waiting === undefined
  }

  get closed () {
    return this.response.destroyed || this.response.writableEnded
  }

  matches (event: StoredEvent): boolean {
    return (this.filter.runId === undefined || this.filter.runId === event.runId) &&
      (this.filter.threadId === undefined || this.filter.threadId === event.threadId)
  }

  /** A live event from the hub: sent now, or kept until catch-up ends. */
  offer (event: StoredEvent): void {
    if (this.#waiting === undefined) {
      this.send(event)
      return
    }
    if (this.#overflowed) return
    this.#waiting.push(event)
    this.#waitingBytes += event.json.length
    if (this.#waitingBytes > this.maxBufferedBytes) {
      // Too much arrived while catching up: forget it, the table still has it.
      this.#overflowed = true
      this.#waiting = []
      this.#waitingBytes = 0
    }
  }

  /** Writes an event past the last id written. False when the socket asks to wait for 'drain'. */
  send (event: StoredEvent): boolean {
    if (event.id <= this.lastId) return true
    this.lastId = event.id
    return this.write(eventFrame(event))
  }

  /**
   * Ends a catch-up pass. When live events overflowed meanwhile, returns
   * false: the caller catches up again from lastId. Otherwise sends what
   * waited and goes live.
   */
  goLive (): boolean {
    if (this.#overflowed) {
      this.#overflowed = false
      return false
    }
    const waiting = this.#waiting ?? []
    this.#waiting = undefined
    this.#waitingBytes = 0
    for (const event of waiting) this.send(event)
    return true
  }

  /**
   * Called periodically: after keepAliveMs without a write, moves a quiet
   * (filtered) client's cursor to the hub's head with an id-only block, and
   * sends a keep-alive comment so proxies keep the connection open.
   */
  heartbeat (now: number, head: number, keepAliveMs: number): void {
    if (!this.isLive || now - this.lastWriteAt < keepAliveMs) return
    let text = KEEP_ALIVE
    if (head > this.lastId) {
      this.lastId = head
      text = `id: ${head}\n\n${text}`
    }
    this.write(text)
  }

  write (text: string): boolean {
    if (this.closed) return true
    if (this.response.writableLength > this.maxBufferedBytes) {
      this.onSlowConsumer(this)
      return true
    }
    this.lastWriteAt = Date.now()
    return this.response.write(text)
  }

  /** Ends the stream cleanly (shutdown): the client reconnects, elsewhere or later. */
  end (): void {
    if (!this.closed) this.response.end()
  }
}
