import { matchesFilter, type EventFilter, type StoredEvent } from './statements.ts'

/**
 * Bytes counted per event besides its JSON: the object, its fields and its
 * slot in the array (V8 keeps an ASCII string at one byte a character).
 */
export const EVENT_OVERHEAD_BYTES = 160

/**
 * The recent settled events in memory, so that a stream resuming from a
 * recent event id (thousands at once when a replica restarts or a deploy
 * rolls) catches up without reading the table, like the Kubernetes API
 * server's watch cache.
 *
 * It covers a range of positions, not a set of events: every settled event
 * with an id in (from, tail] is in it, in ascending order, so a catch-up
 * from an event id in that range is exactly what the table would return. The
 * hub appends each event as it hands it out and then moves the tail to the
 * settled position (appended ids only ever ascend, and nothing above the
 * settled position enters). The oldest events leave when the window passes
 * its size in bytes, and when the history's floor (retention) passes them:
 * either way `from` rises, and older event ids read the table.
 */
export class EventWindow {
  readonly #events: StoredEvent[] = []
  /** Index of the oldest event kept in #events (the array is compacted now and then, not shifted per event). */
  #first = 0
  #bytes = 0
  #from: number
  #tail: number
  readonly maxBytes: number

  /** An empty window at position `tail`, holding at most `maxBytes` (0: none at all). */
  constructor (tail: number, maxBytes: number) {
    this.maxBytes = maxBytes
    this.#from = tail
    this.#tail = tail
  }

  /** The window covers the positions in (from, tail]. */
  get from (): number {
    return this.#from
  }

  get tail (): number {
    return this.#tail
  }

  get size (): number {
    return this.#events.length - this.#first
  }

  get bytes (): number {
    return this.#bytes
  }

  /** Adds an event just handed out (its id above every id held). */
  append (event: StoredEvent): void {
    this.#tail = event.id
    if (this.maxBytes === 0) {
      this.#from = event.id
      return
    }
    this.#events.push(event)
    this.#bytes += event.json.length + EVENT_OVERHEAD_BYTES
    while (this.#bytes > this.maxBytes) this.#dropOldest()
  }

  /** Every settled event up to `tail` has been appended: the window covers it. */
  advance (tail: number): void {
    if (tail > this.#tail) this.#tail = tail
  }

  /** Events at or below the history's floor may be gone from the table: no catch-up is served at or below it. */
  raiseFloor (floor: number): void {
    while (this.size > 0 && this.#events[this.#first]!.id <= floor) this.#dropOldest()
    if (floor > this.#from) this.#from = Math.min(floor, this.#tail)
  }

  /** Whether a catch-up from `afterId` is wholly in the window. */
  covers (afterId: number): boolean {
    return afterId >= this.#from
  }

  /** Up to `limit` events after `afterId` that match `filter`, ascending (afterId must be covered). */
  after (afterId: number, filter: EventFilter, limit: number): StoredEvent[] {
    const events = this.#events
    // The first event above afterId, by binary search.
    let low = this.#first
    let high = events.length
    while (low < high) {
      const middle = (low + high) >>> 1
      if (events[middle]!.id <= afterId) low = middle + 1
      else high = middle
    }
    const page: StoredEvent[] = []
    for (let i = low; i < events.length && page.length < limit; i++) {
      const event = events[i]!
      if (matchesFilter(filter, event)) page.push(event)
    }
    return page
  }

  #dropOldest (): void {
    const event = this.#events[this.#first]!
    this.#events[this.#first] = undefined as unknown as StoredEvent
    this.#first++
    this.#bytes -= event.json.length + EVENT_OVERHEAD_BYTES
    this.#from = event.id
    // Compact once the dropped slots are half the array: amortised O(1) per event.
    if (this.#first > 1024 && this.#first * 2 > this.#events.length) {
      this.#events.splice(0, this.#first)
      this.#first = 0
    }
  }
}
