import type pg from 'pg'

/*
 * The event log's upkeep, on a connection that may write (never the request
 * pool): the settled position every reader relies on, and the partitions
 * that bound the history (partitions.ts). Run by
 * one replica at a time: the holder of UPKEEP_LOCK.
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

/** What one tick of the keeper found. */
export interface OrderTick {
  /** The settled position it published. */
  settled: number
  historyFloor: number
  epoch: number
  /** Set when this tick started a new epoch: a failover (a new WAL timeline), or the sequence moved back. */
  rewound: 'failover' | 'sequence' | null
}

/**
 * One tick (events_keep_order, db/sql/): a census of the event
 * writers in flight, the settle mark raised, and the settled position
 * published, committed to disk in one statement. With `pauseMs`, it pauses
 * that long before each later census, to settle a hole in one tick under
 * load.
 */
export async function keepOrder (client: pg.ClientBase, pauseMs = 0): Promise<OrderTick> {
  const { rows: [row] } = await client.query<{ settled: string, history_floor: string, epoch: number, rewound: OrderTick['rewound'] }>(
    'select settled::text, history_floor::text, epoch, rewound from events_keep_order(pause_ms => $1)', [pauseMs])
  return { settled: Number(row!.settled), historyFloor: Number(row!.history_floor), epoch: row!.epoch, rewound: row!.rewound }
}
