import type pg from 'pg'

/*
 * The event log's keeper, on a connection that may write (never the request
 * pool): the settled position every reader relies on, and the partitions
 * that bound the history (partitions.ts). Run by one replica at a time: the
 * holder of the keeper's lease (events_take_lease, db/sql/keeper.sql).
 */

/** The lease, to `keeper`, with a new term, if it is free or has expired; undefined while another replica holds it. */
export async function takeLease (client: pg.ClientBase, keeper: string, leaseMs: number): Promise<number | undefined> {
  const { rows: [row] } = await client.query<{ term: string | null }>('select term::text from events_take_lease($1, $2)', [keeper, leaseMs])
  return row!.term === null ? undefined : Number(row!.term)
}

/** Gives the lease up (a keeper that stops), so that another replica takes it at once. */
export async function releaseLease (client: pg.ClientBase, keeper: string, term: number): Promise<void> {
  await client.query('select events_release_lease($1, $2)', [keeper, term])
}

/** Whether `keeper` still holds the lease under `term` (a pass of the partitions runs only then). */
export async function holdsLease (client: pg.ClientBase, keeper: string, term: number): Promise<boolean> {
  const { rows: [row] } = await client.query<{ holds: boolean }>(
    'select keeper = $1 and keeper_term = $2 and keeper_until > clock_timestamp() as holds from event_log_state', [keeper, term])
  return row!.holds === true
}

/** A session holding event_log_state beyond a read: its row's lock, or a stronger one on the table. */
export interface LockHolder {
  pid: number
  role: string
  applicationName: string
  /** null when this role may not see it (another role's session, without pg_read_all_stats). */
  state: string | null
  transactionSeconds: number | null
}

/** The sessions, this one aside, holding a lock on event_log_state that a tick may wait on (a read's ACCESS SHARE aside). */
export async function lockHolders (client: pg.ClientBase): Promise<LockHolder[]> {
  const { rows } = await client.query<LockHolder>(
    `select distinct a.pid, a.usename as "role", a.application_name as "applicationName", a.state,
       extract(epoch from clock_timestamp() - a.xact_start)::int as "transactionSeconds"
     from pg_locks l join pg_stat_activity a on a.pid = l.pid
     where l.relation = 'event_log_state'::regclass and l.database = (select oid from pg_database where datname = current_database())
       and l.granted and l.mode <> 'AccessShareLock' and l.pid <> pg_backend_pid()
     order by a.pid`)
  return rows
}

/** The history's floor: every event at or below it may be gone (EVENTS_RETENTION). */
export async function readHistoryFloor (client: pg.ClientBase): Promise<number> {
  const { rows: [row] } = await client.query<{ floor: string }>('select history_floor::text as floor from event_log_state')
  return Number(row!.floor)
}

/**
 * How the history changed under the log at this tick: a standby promoted
 * ('failover'), a server that restarted through recovery ('restart'; either
 * way a new epoch, ids skipped), or a sequence moved back ('sequence',
 * moved forward again).
 */
export type Rewind = 'failover' | 'restart' | 'sequence'

/** What one tick of the keeper found. */
export interface OrderTick {
  /** False when this keeper no longer holds the lease: it published nothing. */
  leads: boolean
  /** The settled position it published. */
  settled: number
  historyFloor: number
  epoch: number
  rewound: Rewind | null
}

export interface TickOptions {
  /** How long it pauses before each later census, to settle a hole in one tick under load. */
  pauseMs: number
  /** The lease it ticks under, renewed for leaseMs. */
  keeper: string
  term: number
  leaseMs: number
}

/**
 * One tick (events_keep_order, db/sql/keeper.sql): a census of the event
 * writers in flight, the settle mark raised, and the settled position
 * published, committed to disk in one statement, under the lease.
 */
export async function keepOrder (client: pg.ClientBase, { pauseMs, keeper, term, leaseMs }: TickOptions): Promise<OrderTick> {
  const { rows: [row] } = await client.query<{ leads: boolean, settled: string, history_floor: string, epoch: number, rewound: Rewind | null }>(
    'select leads, settled::text, history_floor::text, epoch, rewound from events_keep_order(pause_ms => $1, keeper => $2, term => $3, lease_ms => $4)',
    [pauseMs, keeper, term, leaseMs])
  return { leads: row!.leads, settled: Number(row!.settled), historyFloor: Number(row!.history_floor), epoch: row!.epoch, rewound: row!.rewound }
}
