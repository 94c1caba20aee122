import type { Db } from '../../db/schema.ts'
import { notFound } from '../../errors.ts'
import { streamSubjectExists, type EventFilter } from '../statements.ts'

/** How long a run or thread found to exist is remembered, so that a crowd of long-polls costs no query each. */
export const KNOWN_SUBJECT_MS = 60_000
/** The most subjects remembered of each kind (then the memory starts over). */
export const MAX_KNOWN_SUBJECTS = 100_000

type SubjectKind = 'run' | 'thread'

/**
 * Whether the run or thread a Durable Stream reads exists (404 if not):
 * remembered for KNOWN_SUBJECT_MS once found (runs and threads are not
 * deleted while watched; that long bounds the error), and asked once for a
 * crowd arriving together.
 */
export class SubjectChecks {
  /** Runs and threads found to exist, and when. */
  readonly #known = { run: new Map<string, number>(), thread: new Map<string, number>() }
  /**
   * The checks in flight, by subject: a crowd arriving at once (5,000
   * long-polls of one run) shares one query, rather than each holding its
   * request in memory while its own query waits for a connection.
   */
  readonly #checking = { run: new Map<string, Promise<boolean>>(), thread: new Map<string, Promise<boolean>>() }

  private readonly db: Db
  private readonly maxKnown: number

  constructor (db: Db, maxKnown = MAX_KNOWN_SUBJECTS) {
    this.db = db
    this.maxKnown = maxKnown
  }

  /** Throws 404 for a run or thread that does not exist; undefined (no promise) when it is known to, or the stream is every event's. */
  check (filter: EventFilter, now = Date.now()): Promise<void> | undefined {
    const kind = filter.runId !== undefined ? 'run' : filter.threadId !== undefined ? 'thread' : undefined
    if (kind === undefined) return undefined
    const id = (kind === 'run' ? filter.runId : filter.threadId)!
    if ((this.#known[kind].get(id) ?? -Infinity) > now - KNOWN_SUBJECT_MS) return undefined
    return this.#query(kind, id, filter, now)
  }

  async #query (kind: SubjectKind, id: string, filter: EventFilter, now: number): Promise<void> {
    const checking = this.#checking[kind]
    let check = checking.get(id)
    if (check === undefined) {
      check = streamSubjectExists(this.db, filter).finally(() => checking.delete(id))
      checking.set(id, check)
    }
    if (!await check) throw notFound(kind)
    const known = this.#known[kind]
    if (known.size >= this.maxKnown) known.clear()
    known.set(id, now)
  }
}
