import { sql, type Expression } from 'kysely'
import { Event } from '../schemas/resources.js'
import { jsonArray, jsonObject, rowJson } from './json.js'
import type { Db } from './schema.js'

/*
 * Reads of the persisted event log. Ids are read as JavaScript numbers:
 * exact up to 2^53, which a log growing a million events a second reaches
 * in about 285 years.
 *
 * Writers may commit ids out of order (migration 0003), so no read goes
 * past the SETTLED position: the highest id at or below which every id is
 * visible or will never commit. The hub settles it as it polls
 * (settleBound, then the rows); a single statement settles its own from a
 * position known before it began (settledPosition).
 */

export interface EventFilter {
  runId?: string
  threadId?: string
}

/** Whether `event` passes `filter` (the SQL of matchingAfter, for events already in memory). */
export const matchesFilter = (filter: EventFilter, event: StoredEvent) =>
  (filter.runId === undefined || filter.runId === event.runId) && (filter.threadId === undefined || filter.threadId === event.threadId)

/** An event as the stream carries it: its id, the keys it is filtered on, and its envelope as one line of JSON. */
export interface StoredEvent {
  id: number
  runId: string
  threadId: string
  json: string
}

/** The envelope of row `e` as one line of JSON text (JSON escapes newlines), built as every response body is (db/json.ts). */
const envelope = rowJson(Event, 'e')

/**
 * The settled position of the statement's own snapshot, as text: `known`
 * (a position settled before the statement began: the hub's) or the
 * clock's, extended over the ids just above it that are all visible.
 * Every event at or below it is visible to the statement or never commits.
 */
const settled = (known: number | string) => sql<string>`events_settled(${known}::bigint)`
export const settledPosition = (known: number | string) => sql<string>`${settled(known)}::text`

export interface SettleBound {
  /** Every id at or below it is settled for any snapshot taken after this call returned. */
  bound: number
  /** The backend of the event writer the bound waits for, when one holds it back (primary only). */
  waitingPid: number | null
  /** How old the clock is, in seconds (standby only: there it is all the bound has). */
  clockAge: number | null
  /** What the next call needs to bound the writers this one saw (primary only). */
  census: WriterCensus | undefined
}

/**
 * A census of the event writers in flight (migration 0008): the sequence's
 * value it read, and each writer's transaction with the id its events are
 * above. Handed to the next census, it lets that one bound each writer:
 * one seen here keeps its bound, a new one drew after `drawn`.
 */
export interface WriterCensus {
  drawn: string
  writers: string[]
  bounds: string[]
}

/**
 * Where the log is settled, for snapshots taken from now on: on a primary,
 * up to the lowest id an event-writing transaction in flight may still
 * commit; on a standby, up to the clock the primary's upkeep writes.
 * `prior` is the census of the caller's previous call, if it made one: the
 * later a census, the closer to each writer's first id its bound is.
 */
export async function settleBound (db: Db, prior?: WriterCensus): Promise<SettleBound> {
  const { rows: [row] } = await sql<{ bound: string, waiting_pid: number | null, clock_age: number | null, drawn: string | null, writers: string[], writer_bounds: string[] }>`
    select bound, waiting_pid, clock_age, drawn, writers, writer_bounds
    from events_settle_bound(${prior?.drawn ?? null}::bigint, ${prior?.writers ?? []}::text[], ${prior?.bounds ?? []}::bigint[])`.execute(db)
  const census = row!.drawn === null ? undefined : { drawn: row!.drawn, writers: row!.writers, bounds: row!.writer_bounds }
  return { bound: Number(row!.bound), waitingPid: row!.waiting_pid, clockAge: row!.clock_age, census }
}

/**
 * The history's floor (EVENTS_RETENTION), one row: every event at or below
 * it may be gone, so a cursor below it has missed events (410 cursor_expired).
 */
const historyFloor = sql<string>`(select history_floor from event_log_state)`

/** Events `e` in (afterId, upTo] that match `filter`, the first `limit` of them in ascending id order. */
function matchingAfter (db: Db, afterId: number | Expression<string>, filter: EventFilter, limit: number, upTo?: number) {
  return db.selectFrom('events as e')
    .where('e.event_id', '>', typeof afterId === 'number' ? String(afterId) : afterId)
    .$if(upTo !== undefined, (query) => query.where('e.event_id', '<=', String(upTo)))
    .$if(filter.runId !== undefined, (query) => query.where('e.run_id', '=', filter.runId!))
    .$if(filter.threadId !== undefined, (query) => query.where('e.thread_id', '=', filter.threadId!))
    .orderBy('e.event_id')
    .limit(limit)
}

/** The settled position of a snapshot taken now, given one settled earlier (`known`). */
export async function settledNow (db: Db, known: number): Promise<number> {
  const row = await db.selectNoFrom(settledPosition(known).as('id')).executeTakeFirstOrThrow()
  return Number(row.id)
}

/** The columns a StoredEvent is read from, and the reading. */
const storedEventColumns = ['e.event_id', 'e.run_id', 'e.thread_id', envelope.as('json')] as const
const toStoredEvent = (row: { event_id: string, run_id: string, thread_id: string, json: string }): StoredEvent =>
  ({ id: Number(row.event_id), runId: row.run_id, threadId: row.thread_id, json: row.json })

/**
 * Up to `limit` events in (afterId, upTo] that match `filter`, ascending,
 * with the history's floor read in the same statement: the events are only
 * what the client missed when `afterId` is at or above it. `upTo` must be
 * settled (the hub's head): nothing above it is read. Without `upTo`, the
 * visible events, settled or not: only the hub reads so, and settles what
 * it reads.
 */
export async function eventsAfterKept (db: Db, afterId: number, filter: EventFilter, limit: number, upTo?: number): Promise<{ floor: number, events: StoredEvent[] }> {
  const page = matchingAfter(db, afterId, filter, limit, upTo).select(storedEventColumns)
  const rows = await db.selectFrom(sql<{ floor: string }>`(select ${historyFloor}::text as floor)`.as('s'))
    .leftJoinLateral(page.as('p'), (join) => join.onTrue())
    .select(['s.floor', 'p.event_id', 'p.run_id', 'p.thread_id', 'p.json'])
    .orderBy('p.event_id')
    .execute()
  const events = rows.flatMap(({ event_id: eventId, run_id: runId, thread_id: threadId, json }) =>
    eventId === null ? [] : [toStoredEvent({ event_id: eventId, run_id: runId!, thread_id: threadId!, json: json! })])
  return { floor: Number(rows[0]!.floor), events }
}

export interface EventPage {
  body: string
  /** Where the client resumes: the last event returned when the page is full, else the settled position. */
  cursor: string
  /** The history's floor, read in the same statement. */
  floor: number
  /** Whether the page holds `limit` events: then no event can ever join it (they are all settled). */
  full: boolean
}

/**
 * listEvents: a JSON page {events: [...]} of settled events after `afterId`
 * (by default, after the history's floor: from the oldest event kept) and
 * its resume cursor, from one snapshot. `known` is a position settled
 * before the statement (the hub's).
 */
export async function listEvents (db: Db, afterId: number | undefined, filter: EventFilter, limit: number, known: number): Promise<EventPage> {
  const after = afterId === undefined ? historyFloor : sql<string>`${String(afterId)}::bigint`
  // Every use of the position and of the floor runs in the statement's one snapshot, so they agree.
  const page = matchingAfter(db, after, filter, limit)
    .where('e.event_id', '<=', settled(known))
    .select(['e.event_id', envelope.as('item')])
  const row = await db.selectFrom(page.as('p'))
    .select([
      jsonObject({ events: jsonArray(sql`p.item`, sql`p.event_id`) }).as('body'),
      sql<string>`case when count(*) = ${limit} then max(p.event_id)
        else greatest(${after}, ${settled(known)}) end::text`.as('cursor'),
      sql<string>`${historyFloor}::text`.as('floor'),
      sql<boolean>`count(*) = ${limit}`.as('full')
    ])
    .executeTakeFirstOrThrow()
  return { ...row, floor: Number(row.floor) }
}

/**
 * Whether the run or thread a Durable Streams URL names (`filter` holds
 * one of them) exists. Events may name a run whose row is not there: the
 * row decides, so a 404 names a run the API does not know at all.
 */
export async function streamSubjectExists (db: Db, filter: EventFilter): Promise<boolean> {
  const row = filter.runId !== undefined
    ? await db.selectFrom('runs').select('run_id as id').where('run_id', '=', filter.runId).executeTakeFirst()
    : await db.selectFrom('threads').select('thread_id as id').where('thread_id', '=', filter.threadId!).executeTakeFirst()
  return row !== undefined
}
