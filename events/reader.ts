import type { Db } from '../db/schema.ts'
import type { PositionErrors } from '../errors.ts'
import type { EventHub } from './hub.ts'
import { eventsAfterKept, reissuedRange, type EventFilter, type LogState, type StoredEvent } from './statements.ts'

/** Events read per catch-up query of a stream or page that resumes from an older event id. */
export const CATCH_UP_PAGE_SIZE = 500

/**
 * Throws when a client's event id (after_event_id, Last-Event-ID, an
 * offset: `errors` say it in its words) cannot be served as it stands: below the
 * history's floor, or inside a range of ids skipped after a failover or a
 * crash (410 cursor_expired: the client refetches); above what is settled
 * while the database may have lost commits its keeper has not recorded yet
 * (a transient refusal: the client retries; the position may name an event
 * that is gone); above every id the log has handed out (400: it would wait
 * forever). A position merely ahead of the settled position waits.
 */
export function assertPositionKept (errors: PositionErrors, position: number, state: LogState, floor = state.floor): void {
  if (position < floor) throw errors.expired(position, floor)
  const reissued = reissuedRange(state, position)
  if (reissued !== undefined) throw errors.lost(position, ...reissued)
  if (state.lossPending && position > state.settled) throw errors.lossPending()
  if (position > state.drawn) throw errors.beyond(position, state.drawn)
}

/** A position as a client may be given it: inside a range skipped after a failover or a crash, the position that range starts at. */
export const reportable = (state: LogState, position: number) => reissuedRange(state, position)?.[0] ?? position

/**
 * The reads after an event id that streams and Durable Streams pages
 * catch up with: a page of events from the hub's window of recent events
 * when it holds them all, else from the table, never past a settled
 * position.
 */
export class EventReader {
  /** Catch-ups served from the window and from the table, since start (a metric). */
  readonly catchUps = { memory: 0, database: 0 }

  private readonly db: Db
  private readonly hub: EventHub

  constructor (db: Db, hub: EventHub) {
    this.db = db
    this.hub = hub
  }

  /**
   * Up to `limit` events after `afterId` matching `filter`, from memory,
   * when the window holds every one of them; undefined when the table must
   * be read. Never past the hub's tail (the settled position).
   */
  recentAfter (afterId: number, filter: EventFilter, limit: number): StoredEvent[] | undefined {
    const window = this.hub.window
    if (window === undefined || !window.covers(afterId)) {
      this.catchUps.database++
      return undefined
    }
    this.catchUps.memory++
    return window.after(afterId, filter, limit)
  }

  /**
   * A page of events after `afterId`, never past `upTo`, from the window of
   * recent events when it holds them all; undefined when the table must be
   * read. The window ends at the hub's tail: a read up to a fresher
   * position goes to the table. So does a position above the ids drawn when
   * the hub last polled: handed out since, or never (assertPositionKept).
   */
  #fromWindow (afterId: number, filter: EventFilter, upTo: number): StoredEvent[] | undefined {
    return upTo > this.hub.tail! || afterId > this.hub.state!.drawn ? undefined : this.recentAfter(afterId, filter, CATCH_UP_PAGE_SIZE)
  }

  /**
   * Up to a page of events after `afterId`, never past `upTo` (a settled
   * tail: what lies above it reaches a stream live), with the history's
   * floor: from the window of recent events when it holds them all (then
   * nothing after `afterId` has gone: the floor is not read), else from the
   * table, the floor read in the same statement.
   */
  async readKept (afterId: number, filter: EventFilter, upTo: number): Promise<{ state: LogState, events: StoredEvent[] }> {
    const recent = this.#fromWindow(afterId, filter, upTo)
    if (recent !== undefined) return { state: { ...this.hub.state!, floor: 0 }, events: recent }
    return eventsAfterKept(this.db, afterId, filter, CATCH_UP_PAGE_SIZE, upTo)
  }

  /**
   * readAfter's events when the window holds them all (then nothing after
   * `afterId` has gone: the floor is not checked), at once, without a
   * promise: a crowd of long-polls re-polling from the tail takes this
   * path. Undefined when the table must be read.
   */
  recentKeptAfter (afterId: number, filter: EventFilter, errors: PositionErrors, upTo = this.hub.tail!): StoredEvent[] | undefined {
    const recent = this.#fromWindow(afterId, filter, upTo)
    if (recent !== undefined) assertPositionKept(errors, afterId, this.hub.state!, 0)
    return recent
  }

  /** As readKept, for an event id that a client gave, its errors in `errors`' words (assertPositionKept). */
  async readAfter (afterId: number, filter: EventFilter, errors: PositionErrors, upTo = this.hub.tail!): Promise<StoredEvent[]> {
    const recent = this.recentKeptAfter(afterId, filter, errors, upTo)
    if (recent !== undefined) return recent
    const { state, events } = await eventsAfterKept(this.db, afterId, filter, CATCH_UP_PAGE_SIZE, upTo)
    assertPositionKept(errors, afterId, state)
    return events
  }
}
