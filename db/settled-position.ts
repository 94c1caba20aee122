import { sql } from 'kysely'

/*
 * The settled position as a piece of SQL, for any statement to read in its
 * own snapshot: every read of the API reports it (X-Event-Cursor), and the
 * event log (events/) reads with it. Writers may commit event ids out of
 * order, so no read goes past it: the highest id at or below which every
 * id is visible or will never commit. events_settled_row() (db/sql/)
 * extends the position the event log's keeper publishes over the visible
 * ids just above it; Postgres inlines it into the statement, so on a quiet
 * log the position costs the statement two one-row reads and no call.
 */

/**
 * The settled position of the statement's own snapshot: `known` (a
 * position settled before the statement began: the poller's) or the
 * keeper's, extended over the ids just above it that are all visible.
 */
export const settled = (known: number | string) => sql<string>`(select r.settled from events_settled_row(${known}::bigint) r)`

/** settled() as text (an id is a bigint, which pg returns as a string anyway). */
export const settledPosition = (known: number | string) => sql<string>`${settled(known)}::text`
