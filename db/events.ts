import { sql } from 'kysely'
import { Event } from '../schemas/resources.js'
import { rowObject } from './json.js'
import type { Db } from './queries.js'

/*
 * Reads of the persisted event log. Ids are read as JavaScript numbers:
 * exact up to 2^53, which a log growing a million events a second reaches
 * in about 285 years.
 */

export interface EventFilter {
  runId?: string
  threadId?: string
}

/** An event as the stream carries it: its id, the keys it is filtered on, and its envelope as one line of JSON. */
export interface StoredEvent {
  id: number
  runId: string
  threadId: string
  json: string
}

/** The envelope of row `e` as jsonb (rows of a page), and as JSON text (no newline: JSON escapes them). */
const envelope = rowObject(Event, 'e')
const envelopeText = sql<string>`(${envelope})::text`

/**
 * The stream's current end in the statement's snapshot: the highest event
 * id committed (0 when there is none). Event ids commit in order
 * (migration 0002), so every event up to it is visible to that snapshot.
 */
export const streamEnd = sql<string>`(select coalesce(max(event_id), 0) from events)::text`

/** Events `e` after `afterId` that match `filter`, the first `limit` of them in ascending id order. */
function matchingAfter (db: Db, afterId: number, filter: EventFilter, limit: number) {
  return db.selectFrom('events as e')
    .where('e.event_id', '>', String(afterId))
    .$if(filter.runId !== undefined, (query) => query.where('e.run_id', '=', filter.runId!))
    .$if(filter.threadId !== undefined, (query) => query.where('e.thread_id', '=', filter.threadId!))
    .orderBy('e.event_id')
    .limit(limit)
}

export async function latestEventId (db: Db): Promise<number> {
  const row = await db.selectNoFrom(streamEnd.as('id')).executeTakeFirstOrThrow()
  return Number(row.id)
}

/** Up to `limit` events after `afterId` that match `filter`, in ascending id order. */
export async function eventsAfter (db: Db, afterId: number, filter: EventFilter, limit: number): Promise<StoredEvent[]> {
  const rows = await matchingAfter(db, afterId, filter, limit)
    .select(['e.event_id', 'e.run_id', 'e.thread_id', envelopeText.as('json')])
    .execute()
  return rows.map((row) => ({ id: Number(row.event_id), runId: row.run_id, threadId: row.thread_id, json: row.json }))
}

export interface EventPage {
  body: string
  /** Where the client resumes: the last event returned when the page is full, else the stream's end. */
  cursor: string
}

/** listEvents: a JSON page {events: [...]} and its resume cursor, from one snapshot. */
export async function listEvents (db: Db, afterId: number, filter: EventFilter, limit: number): Promise<EventPage> {
  const page = matchingAfter(db, afterId, filter, limit).select(['e.event_id', envelope.as('item')])
  const row = await db.selectFrom(page.as('p'))
    .select([
      sql<string>`json_build_object('events', coalesce(json_agg(p.item order by p.event_id), '[]'::json))::text`.as('body'),
      sql<string>`case when count(*) = ${limit} then max(p.event_id)
        else greatest(${String(afterId)}::bigint, ${streamEnd}::bigint) end::text`.as('cursor')
    ])
    .executeTakeFirstOrThrow()
  return row
}
