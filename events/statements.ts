import { CompiledQuery, sql, type Expression } from 'kysely'
import { jsonArray, jsonObject, rowJson } from '../db/json.ts'
import type { Db } from '../db/schema.ts'
import { settled, settledPosition } from '../db/settled-position.ts'
import { builder, Statement } from '../db/statement.ts'
import { Event } from '../schemas/resources.ts'

/*
 * The statements of the event log: every read of the events table and of
 * the keeper's state (event_log_state). Ids are read as JavaScript numbers:
 * exact up to 2^53, which a log growing a million events a second reaches
 * in about 285 years.
 *
 * Writers may commit ids out of order, so no read goes past the SETTLED
 * position: the highest id at or below which every id is visible or will
 * never commit. The event log's keeper publishes one (LogState.settled); a
 * reader extends it over the visible ids just above it, in the snapshot it
 * reads with (db/settled-position.ts), or as it polls (hub.ts).
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

/** What the event log's keeper publishes (event_log_state), as a reader needs it. */
export interface LogState {
  /** Every id at or below it is visible, or never commits (the keeper's census). */
  settled: number
  /** The history's floor (EVENTS_RETENTION): every event at or below it may be gone. */
  floor: number
  /**
   * Moves on when the history under the log changed (a failover, a restart
   * that went through recovery, a TRUNCATE): every replica drops its memory
   * of recent events, and ends the streams past epochBase, the highest
   * position the epochs share.
   */
  epoch: number
  epochBase: number
  /** Ranges (after, through] of ids skipped at a failover or a restart: an event id in one may have seen events that are gone. */
  reissued: Array<[number, number]>
  /**
   * Whether the database may have lost commits that the keeper has not
   * recorded yet: a standby just promoted, a server that recovered from a
   * crash (db/sql/forks.sql). Always false on a hot standby.
   */
  lossPending: boolean
  /** The writer the keeper's settled position waits for: its backend, or a prepared transaction's name. */
  waitingPid: number | null
  waitingTransaction: string | null
  /** Prepared transactions among the writers in flight. */
  preparedWriters: number
  /** Seconds since the keeper last published the settled position. */
  settledAge: number
  /**
   * The highest id the log has handed out (the sequence, or the keeper's last
   * census if the sequence was just moved back): no event id above it was ever
   * given. Infinity on a hot standby, which cannot tell.
   */
  drawn: number
}

interface LogStateRow {
  settled: string
  floor: string
  epoch: number
  epoch_base: string
  reissued: string[]
  loss_pending: boolean
  waiting_pid: number | null
  waiting_transaction: string | null
  prepared_writers: number
  settled_age: number
  drawn: string
}

/** The row of LogState, as one subquery (`s`) that any read can join. */
const logStateRow = sql<LogStateRow>`(select s.settled::text, s.history_floor::text as floor, s.epoch, s.epoch_base::text,
    array(select (lower(r) - 1)::text || ':' || (upper(r) - 1)::text from unnest(s.reissued) r) as reissued,
    case when t.is_primary then pg_sequence_last_value('events_ids_safe') is null or coalesce(pg_sequence_last_value('events_forks'), 0) > s.forks
      else false end as loss_pending,
    s.waiting_pid, s.waiting_transaction, s.prepared_writers,
    extract(epoch from clock_timestamp() - s.settled_at)::float8 as settled_age,
    case when t.drawn is null then 'Infinity' else greatest(t.drawn, s.census_drawn)::text end as drawn
  from event_log_state s, (select not pg_is_in_recovery() as is_primary, d.drawn from events_id_drawn d) t)`

const toLogState = (row: LogStateRow): LogState => ({
  settled: Number(row.settled),
  floor: Number(row.floor),
  epoch: row.epoch,
  epochBase: Number(row.epoch_base),
  reissued: row.reissued.map((range) => range.split(':').map(Number) as [number, number]),
  lossPending: row.loss_pending,
  waitingPid: row.waiting_pid,
  waitingTransaction: row.waiting_transaction,
  preparedWriters: row.prepared_writers,
  settledAge: row.settled_age,
  drawn: Number(row.drawn)
})

/** The reissued range (after, through] that holds `eventId`, if one does. */
export const reissuedRange = (state: Pick<LogState, 'reissued'>, eventId: number): [number, number] | undefined =>
  state.reissued.find(([after, through]) => eventId > after && eventId <= through)

/**
 * The history's floor (EVENTS_RETENTION), one row: every event at or below
 * it may be gone, so a cursor below it has missed events (410 cursor_expired).
 */
const historyFloor = sql<string>`(select history_floor from event_log_state)`

/** Events `e` in (afterId, upTo] that match `filter`, the first `limit` of them in ascending id order. */
function matchingAfter (db: Db, afterId: number | Expression<string>, filter: EventFilter, limit: number, upTo?: number | Expression<string>) {
  return db.selectFrom('events as e')
    .where('e.event_id', '>', typeof afterId === 'number' ? String(afterId) : afterId)
    .$if(upTo !== undefined, (query) => query.where('e.event_id', '<=', typeof upTo === 'number' ? String(upTo) : upTo!))
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

/**
 * Ids a replica that starts walks per statement: a long run of visible ids
 * above the published position (a history bulk-loaded, a keeper long away)
 * is walked in steps that no statement timeout cuts.
 */
export const START_WALK_IDS = 100_000

/**
 * The position a replica starts at, with the keeper's state (read in the
 * first statement): the published one, extended over the whole run of
 * visible ids above it, a statement per START_WALK_IDS. So it starts
 * where the running replicas are, whatever the history's length.
 */
export async function startingPosition (db: Db): Promise<{ position: number, state: LogState }> {
  const walk = (from: number) => sql<string>`events_settled(${from}::bigint, ${START_WALK_IDS}::integer)::text`
  const row = await db.selectFrom(logStateRow.as('s')).selectAll('s').select(walk(0).as('position')).executeTakeFirstOrThrow()
  let position = Number(row.position)
  for (;;) {
    const next = Number((await db.selectNoFrom(walk(position).as('position')).executeTakeFirstOrThrow()).position)
    if (next < position + START_WALK_IDS) return { position: next, state: toLogState(row) }
    position = next
  }
}

/** The columns a StoredEvent is read from, and the reading. */
const storedEventColumns = ['e.event_id', 'e.run_id', 'e.thread_id', envelope.as('json')] as const
const storedEvents = (query: ReturnType<typeof matchingAfter>) => query.select(storedEventColumns)
const toStoredEvent = (row: { event_id: string, run_id: string, thread_id: string, json: string }): StoredEvent =>
  ({ id: Number(row.event_id), runId: row.run_id, threadId: row.thread_id, json: row.json })

/**
 * Up to `limit` events in (afterId, upTo] that match `filter`, ascending,
 * with the keeper's state read in the same statement: the events are only
 * what the client missed when `afterId` is at or above the history's floor
 * and in no reissued range. `upTo` must be settled (the hub's tail):
 * nothing above it is read.
 */
export async function eventsAfterKept (
  db: Db, afterId: number, filter: EventFilter, limit: number, upTo: number
): Promise<{ state: LogState, events: StoredEvent[] }> {
  return withLogState(db, storedEvents(matchingAfter(db, afterId, filter, limit, upTo)))
}

/**
 * eventsAfterKept up to the settled position of the statement's own
 * snapshot (`known`: one settled before it, the hub's), which it returns,
 * and the highest id of an event matching `filter` visible above that
 * position (`pendingTo`: committed, but not settled yet, behind a writer
 * in flight), if any. Every matching event committed before the statement
 * began is at or below `position`, or at or below `pendingTo`.
 */
export async function freshEventsAfterKept (
  db: Db, afterId: number, filter: EventFilter, limit: number, known: number
): Promise<{ state: LogState, position: number, events: StoredEvent[], pendingTo: number | undefined }> {
  // The position once (a materialized CTE read by scalar subqueries: each
  // is evaluated once, and the partitions are pruned at run time by it).
  const position = sql<string>`(select pos.p from pos)`
  const highest = matchingAfter(db, position, filter, 1).clearOrderBy().orderBy('e.event_id', 'desc').select('e.event_id')
  const rows = await db.with((cte) => cte('pos').materialized(), (query) => query.selectNoFrom(settled(known).as('p')))
    .selectFrom(logStateRow.as('s'))
    .leftJoinLateral(storedEvents(matchingAfter(db, afterId, filter, limit, position)).as('p'), (join) => join.onTrue())
    .selectAll('s')
    .select(['p.event_id', 'p.run_id', 'p.thread_id', 'p.json'])
    .select([sql<string>`${position}::text`.as('position'), sql<string | null>`(${highest})::text`.as('pending_to')])
    .orderBy('p.event_id')
    .execute()
  const events = joinedEvents(rows)
  const pendingTo = rows[0]!.pending_to
  return { state: toLogState(rows[0]!), position: Number(rows[0]!.position), events, pendingTo: pendingTo === null ? undefined : Number(pendingTo) }
}

/**
 * The poller's read: up to `limit` visible events after `tail`, settled or
 * not (the hub settles what it reads), with the keeper's state in the same
 * statement. While delivery waits above a hole (nothing settled past the
 * tail, and the next id not visible), the events above it are not read
 * again, only whether there are any (`waiting`): the state tells when to
 * read them.
 */
export async function pollAfter (db: Db, tail: number, limit: number): Promise<{ state: LogState, events: StoredEvent[], waiting: boolean }> {
  const { rows } = await db.executeQuery<PollRow>(CompiledQuery.raw(pollStatement.text, pollStatement.values([tail, limit])))
  const events = joinedEvents(rows)
  return { state: toLogState(rows[0]!), events, waiting: events.length === 0 && rows[0]!.extra === true }
}

/**
 * pollAfter's statement, built and compiled once: the poll runs up to
 * every WAKE_MIN_GAP_MS, and compiling it each time was a large part of
 * the poll's own CPU.
 */
const pollStatement = new Statement(2, (tail: number, limit: number) => withLogStateQuery(builder, storedEvents(matchingAfter(builder, tail, {}, limit)
  .where(sql<boolean>`(s.settled::bigint > ${tail}::bigint or exists (select 1 from events n where n.event_id = ${tail}::bigint + 1))`)),
// The first id above the tail, by index (an EXISTS may be planned as a scan of the heap, whose newest rows come last).
sql<boolean>`(select n.event_id from events n where n.event_id > ${tail}::bigint order by n.event_id limit 1) is not null`))

type PollRow = LogStateRow & { event_id: string | null, run_id: string | null, thread_id: string | null, json: string | null, extra: boolean | null }

/** The events of a page read joined to the keeper's state (left join: a row without an event when the page is empty). */
function joinedEvents (rows: Array<{ event_id: string | null, run_id: string | null, thread_id: string | null, json: string | null }>): StoredEvent[] {
  return rows.flatMap(({ event_id: eventId, run_id: runId, thread_id: threadId, json }) =>
    eventId === null ? [] : [toStoredEvent({ event_id: eventId, run_id: runId!, thread_id: threadId!, json: json! })])
}

/** `page` (which may refer to the state as `s`), with the keeper's state and `extra`, in one statement. */
function withLogStateQuery (db: Db, page: ReturnType<typeof storedEvents>, extra = sql<boolean | null>`null`) {
  return db.selectFrom(logStateRow.as('s'))
    .leftJoinLateral(page.as('p'), (join) => join.onTrue())
    .selectAll('s')
    .select(['p.event_id', 'p.run_id', 'p.thread_id', 'p.json', extra.as('extra')])
    .orderBy('p.event_id')
}

/** withLogStateQuery run: the keeper's state and the page's events. */
async function withLogState (db: Db, page: ReturnType<typeof storedEvents>) {
  const rows = await withLogStateQuery(db, page).execute()
  return { state: toLogState(rows[0]!), events: joinedEvents(rows) }
}

export interface EventPage {
  body: string
  /** Where the client resumes (X-Event-Cursor): the last event returned when the page is full, else the settled position. */
  eventCursor: string
  /** The keeper's state, read in the same statement (its floor above all). */
  state: LogState
  /** Whether the page holds `limit` events: then no event can ever join it (they are all settled). */
  full: boolean
}

/**
 * listEvents: a JSON page {events: [...]} of settled events after `afterId`
 * (by default, after the history's floor: from the oldest event kept) and
 * its resume event id, from one snapshot. `known` is a position settled
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
        else greatest(${after}, ${settled(known)}) end::text`.as('eventCursor'),
      sql<LogStateRow>`(select to_json(s) from ${logStateRow} s)`.as('state'),
      sql<boolean>`count(*) = ${limit}`.as('full')
    ])
    .executeTakeFirstOrThrow()
  return { ...row, state: toLogState(row.state) }
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
