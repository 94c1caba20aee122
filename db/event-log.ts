import type pg from 'pg'
import { sequencePosition } from './event-partitions.js'

/*
 * The event log's upkeep, on a connection that may write (never the request
 * pool): the clock that lets a hot standby settle the event order
 * (migration 0003), and the partitions that bound the history
 * (db/event-partitions.ts). Run by one replica at a time: the holder of UPKEEP_LOCK.
 */

/** Session-level advisory lock held by the replica that keeps the event log. */
export const UPKEEP_LOCK = 7_061_737_470_931_417_002n

/** True when this session now holds the upkeep lock (it keeps it until the session ends). */
export async function tryLeadUpkeep (client: pg.ClientBase): Promise<boolean> {
  const { rows: [row] } = await client.query<{ leads: boolean }>('select pg_try_advisory_lock($1::bigint) as leads', [UPKEEP_LOCK.toString()])
  return row!.leads
}

/** The history's floor: every event at or below it may be gone (EVENTS_RETENTION). */
export async function readHistoryFloor (client: pg.ClientBase): Promise<number> {
  const { rows: [row] } = await client.query<{ floor: string }>('select history_floor::text as floor from event_log_state')
  return Number(row!.floor)
}

/**
 * Writes the clock (and returns the history's floor): the sequence's value read BEFORE this transaction holds
 * an id, then that id. Every event id at or below the value was drawn by a
 * transaction whose id is below this one's (writers take theirs before they
 * draw), so a snapshot whose xmin has passed it sees each of those events or
 * never will.
 */
export async function writeClock (client: pg.ClientBase): Promise<number> {
  await client.query('begin')
  try {
    const { drawn } = await sequencePosition(client)
    const { rows: [state] } = await client.query<{ floor: string }>(
      'update event_log_state set clock_value = $1, clock_xid = pg_current_xact_id(), clock_at = now() returning history_floor::text as floor', [drawn])
    await client.query('commit')
    return Number(state!.floor)
  } catch (err) {
    await client.query('rollback').catch(() => {})
    throw err
  }
}
