import type { Listener } from '../hub.ts'
import { matchesFilter, type EventFilter, type StoredEvent } from '../statements.ts'

/**
 * One long-poll request of the Durable Streams read path, waiting in
 * memory: the hub offers it each matching event as it polls (no query per
 * waiter) and tells it when a poll has handed out everything up to its
 * tail. It keeps at most `limit` events after `afterId`, and is done as
 * soon as a poll ends with one kept, or when its time is up.
 */
export class Waiter implements Listener {
  readonly events: StoredEvent[] = []
  #done: (() => void) | undefined
  /** Closed (the hub stopped) before or while it waited: it waits no more. */
  #closed = false

  readonly filter: EventFilter
  afterId: number
  readonly limit: number

  constructor (filter: EventFilter, afterId: number, limit: number) {
    this.filter = filter
    this.afterId = afterId
    this.limit = limit
  }

  /** Starts after `afterId` instead (a fresher position): what was kept at or below it goes. */
  raiseTo (afterId: number): void {
    this.afterId = Math.max(this.afterId, afterId)
    const kept = this.events.filter((event) => event.id > this.afterId)
    this.events.splice(0, this.events.length, ...kept)
  }

  matches (event: StoredEvent): boolean {
    return matchesFilter(this.filter, event)
  }

  offer (event: StoredEvent): void {
    if (event.id > this.afterId && this.events.length < this.limit) this.events.push(event)
  }

  /** A poll has handed out everything up to the tail: answer if anything came (true when it answers now). */
  answer (): boolean {
    if (this.events.length === 0) return false
    this.#done?.()
    return true
  }

  /** Ends the wait now (the hub stops): it answers what it holds. */
  close (): void {
    this.#closed = true
    this.#done?.()
  }

  /** A new epoch began at `base`: a long-poll past it answers as it stands. */
  rewound (base: number): void {
    if (this.afterId > base) this.close()
  }

  /**
   * Resolves once events came (at once if some already did, or if it was
   * closed), after
   * `timeoutMs`, or when the client goes away: `whenGone` is handed the
   * function that stops the wait (a listener, not an AbortSignal: one per
   * long-poll of a crowd, its EventTarget cost 3% of the CPU).
   */
  wait (timeoutMs: number, whenGone: (stop: () => void) => void): Promise<void> {
    if (this.events.length > 0 || this.#closed) return Promise.resolve()
    return new Promise((resolve) => {
      const done = () => {
        this.#done = undefined
        clearTimeout(timer)
        resolve()
      }
      const timer = setTimeout(done, timeoutMs)
      this.#done = done
      whenGone(() => this.#done?.())
    })
  }
}
