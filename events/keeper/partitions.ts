import type pg from 'pg'
import { partitionName } from '../../db/migrations/0004_events_partitioned_by_id.ts'

/*
 * The partitions of the events table (ranges of event ids) and the history they
 * bound (EVENTS_RETENTION): the statements, and the policy that the event
 * log's keeper (keeper.ts) runs on its writable connection.
 *
 * Ranges are made ahead of the sequence, each as a standalone table then
 * ATTACHed (SHARE UPDATE EXCLUSIVE on the parent: writers and readers go
 * on). Ids past the last range land in the DEFAULT partition, so an insert
 * never fails when the keeper is down. With a retention, whole partitions
 * are dropped once all their events are older than it and no id in their
 * range can still commit, and the history's floor (event_log_state) is
 * raised, in the same transaction, to the highest id dropped: an event id
 * below it has missed events, and is answered 410 cursor_expired.
 */

export interface RangePartition {
  name: string
  /** The first id of the range; undefined for MINVALUE (the first partition). */
  start: number | undefined
  /** The first id past the range. */
  end: number
}

export interface EventPartitions {
  /** Ascending. */
  ranges: RangePartition[]
  defaultPartition: string | undefined
}

export interface KeeperLog {
  info: (details: object, message: string) => void
  warn: (details: object, message: string) => void
  debug: (details: object, message: string) => void
}

const SEQUENCE = 'events_event_id_seq'
const LOCK_NOT_AVAILABLE = '55P03'

/** Most ids drawn one by one to close a range; a longer way is jumped with setval (see closeRange). */
export const NEXTVAL_CLOSE_LIMIT = 10_000
/** Bounds of a range's size, whatever the observed rate. */
export const MIN_RANGE_IDS = 1000
export const MAX_RANGE_IDS = 2 ** 40
/** Ids kept in ranges ahead of the sequence: this many ranges of the current size. */
export const RANGES_AHEAD = 2
/** Most ranges made, and partitions dropped, in one pass: a pass stays short. */
const MOST_PER_PASS = 4
/** Without a retention, a range spans about a day of events. */
const SPAN_WITHOUT_RETENTION_MS = 86_400_000
/** The sequence's rate is measured over this window, by default. */
const RATE_WINDOW_MS = 600_000
/**
 * How long a transaction of a pass may sit idle between its statements: one
 * that holds the events table's lock (a DETACH) while its process is frozen
 * is ended by the server after this, rather than holding every writer up
 * until the process wakes.
 */
export const PASS_IDLE_MS = 2000

const quoteId = (name: string) => `"${name.replaceAll('"', '""')}"`

/** `FOR VALUES FROM (MINVALUE) TO ('1000')` and the like; undefined for DEFAULT. */
function parseBound (bound: string): { start: number | undefined, end: number } | undefined {
  const match = /FROM \((MINVALUE|'?(-?\d+)'?)\) TO \('?(-?\d+)'?\)/.exec(bound)
  if (match === null) return undefined
  return { start: match[2] === undefined ? undefined : Number(match[2]), end: Number(match[3]) }
}

/** The partitions of `events`; undefined when it is not partitioned (an older schema). */
export async function listPartitions (client: pg.ClientBase): Promise<EventPartitions | undefined> {
  const { rows } = await client.query<{ name: string | null, bound: string | null, partitioned: boolean }>(`
    select c.relname as name, pg_get_expr(c.relpartbound, c.oid) as bound, p.relkind = 'p' as partitioned
    from pg_class p
    left join pg_inherits i on i.inhparent = p.oid
    left join pg_class c on c.oid = i.inhrelid
    where p.oid = to_regclass('events')`)
  if (rows[0]?.partitioned !== true) return undefined
  const partitions: EventPartitions = { ranges: [], defaultPartition: undefined }
  for (const { name, bound } of rows.filter((row) => row.name !== null)) {
    const range = parseBound(bound!)
    if (range === undefined) partitions.defaultPartition = name!
    else partitions.ranges.push({ name: name!, ...range })
  }
  partitions.ranges.sort((a, b) => startOf(a) - startOf(b))
  return partitions
}

/** A range's first id, MINVALUE as -Infinity. */
const startOf = (range: RangePartition) => range.start ?? -Infinity

/** The highest id drawn from the sequence, and the database's clock (Unix ms). */
export async function sequencePosition (client: pg.ClientBase): Promise<{ drawn: number, nowMs: number }> {
  const { rows: [row] } = await client.query<{ drawn: string, now_ms: string }>(`
    select (case when is_called then last_value else last_value - 1 end)::text as drawn,
      (extract(epoch from clock_timestamp()) * 1000)::bigint::text as now_ms
    from ${SEQUENCE}`)
  return { drawn: Number(row!.drawn), nowMs: Number(row!.now_ms) }
}

async function inTransaction<T> (client: pg.ClientBase, lockTimeoutMs: number, work: () => Promise<T>): Promise<T> {
  await client.query('begin')
  try {
    // SET LOCAL: the embedded database shares one session between connections.
    await client.query(`set local lock_timeout = ${Math.round(lockTimeoutMs)}`)
    await client.query(`set local idle_in_transaction_session_timeout = ${PASS_IDLE_MS}`)
    const result = await work()
    await client.query('commit')
    return result
  } catch (err) {
    await client.query('rollback').catch(() => {})
    throw err
  }
}

/** True when `err` is a lock_timeout: the table was busy; the next pass tries again. */
export const isLockTimeout = (err: unknown) => (err as { code?: unknown })?.code === LOCK_NOT_AVAILABLE

/**
 * Makes the range [start, start + size) a partition: a standalone table with
 * the parent's indexes, then ATTACHed. Rows the DEFAULT partition already
 * holds must not fall in the new range (ATTACH would refuse), so the range
 * starts above the default's highest id, read under the lock ATTACH takes
 * on it anyway. Returns the range made.
 */
export async function createRange (
  client: pg.ClientBase, start: number, size: number, defaultPartition: string | undefined, lockTimeoutMs: number
): Promise<RangePartition> {
  return inTransaction(client, lockTimeoutMs, async () => {
    let first = start
    if (defaultPartition !== undefined) {
      await client.query(`lock table ${quoteId(defaultPartition)} in access exclusive mode`)
      const { rows: [row] } = await client.query<{ highest: string | null }>(`select max(event_id)::text as highest from ${quoteId(defaultPartition)}`)
      if (row!.highest !== null) first = Math.max(first, Number(row!.highest) + 1)
    }
    const range = { name: partitionName(first), start: first, end: first + size }
    const table = quoteId(range.name)
    await client.query(`create table ${table} (like events)`)
    await client.query(`alter table ${table} add constraint ${quoteId(`${range.name}_pkey`)} primary key (event_id)`)
    await client.query(`create index ${quoteId(`${range.name}_run_id_event_id_idx`)} on ${table} (run_id, event_id)`)
    await client.query(`create index ${quoteId(`${range.name}_thread_id_event_id_idx`)} on ${table} (thread_id, event_id)`)
    await client.query(`alter table events attach partition ${table} for values from (${range.start}) to (${range.end})`)
    return range
  })
}

/**
 * Takes the sequence's SHARE ROW EXCLUSIVE lock, held to the end of the
 * transaction (see closeRange): re-stating its owner changes nothing else.
 */
export const HOLD_SEQUENCE = `alter sequence ${SEQUENCE} owned by events.event_id`

/**
 * Moves the sequence to the end of a range it is inside of (`drawn` the
 * last id drawn, `end` the first id past the range), so that the range
 * receives no more ids and can be dropped once it expires. Returns false
 * when a writer was in the way (try again on the next pass).
 *
 * A short way is drawn with nextval, which is atomic: writers drawing
 * meanwhile only shorten it. The ids drawn here are never inserted: holes
 * that settle once the statement has ended.
 *
 * A long way is jumped with setval, which would move the sequence BACK if a
 * writer drew past the target between our reading and our setting it. Every
 * drawer holds the sequence's ROW EXCLUSIVE lock from its first draw to its
 * end, and ALTER SEQUENCE takes SHARE ROW EXCLUSIVE, which
 * conflicts with it: once this transaction holds that (by re-stating the
 * sequence's owner, which changes nothing), no transaction that drew is in
 * flight and none can draw until this one commits. It is tried only when
 * the census finds no drawer in flight, so that writers rarely queue behind
 * it, and waits at most lockTimeoutMs for one that came meanwhile.
 */
export async function closeRange (client: pg.ClientBase, drawn: number, end: number, lockTimeoutMs: number): Promise<boolean> {
  const distance = end - 1 - drawn
  if (distance <= NEXTVAL_CLOSE_LIMIT) {
    await client.query(`select max(nextval('${SEQUENCE}')) from generate_series(1, $1::int)`, [distance])
    return true
  }
  const { rows: [census] } = await client.query<{ alone: boolean }>('select cardinality(writers) = 0 as alone from events_census(0, 0)')
  if (!census!.alone) return false
  try {
    return await inTransaction(client, lockTimeoutMs, async () => {
      await client.query(HOLD_SEQUENCE)
      const { drawn: now } = await sequencePosition(client)
      if (now >= end - 1) return false
      await client.query(`select setval('${SEQUENCE}', $1::bigint)`, [end - 1])
      return true
    })
  } catch (err) {
    if (isLockTimeout(err)) return false
    throw err
  }
}

/**
 * Drops a partition and raises the history's floor to the highest id it
 * held, in one transaction (DETACH first: no row can arrive in between).
 * Takes the parent's ACCESS EXCLUSIVE lock, at most lockTimeoutMs in the
 * queue. Returns the floor.
 */
export async function dropRange (client: pg.ClientBase, partition: string, lockTimeoutMs: number): Promise<number> {
  return inTransaction(client, lockTimeoutMs, async () => {
    await client.query(`alter table events detach partition ${quoteId(partition)}`)
    const { rows: [row] } = await client.query<{ floor: string }>(`
      update event_log_state set history_floor = greatest(history_floor, (select coalesce(max(event_id), 0) from ${quoteId(partition)}))
      returning history_floor::text as floor`)
    await client.query(`drop table ${quoteId(partition)}`)
    return Number(row!.floor)
  })
}

/**
 * Deletes the expired rows of the DEFAULT partition (there only when the
 * keeper fell behind) that lie below every remaining range (`below`) and
 * are settled, together with any younger row below the highest of them
 * (rows straddling the boundary), and raises the floor to match.
 */
export async function deleteExpiredDefaultRows (
  client: pg.ClientBase, partition: string, retentionMs: number, below: number, settled: number
): Promise<{ deleted: number, floor: number }> {
  const table = quoteId(partition)
  const { rows: [row] } = await client.query<{ deleted: string, floor: string }>(`
    with doomed as (
      select max(event_id) as upto from ${table}
      where created_at < now() - $1::bigint * interval '1 millisecond' and event_id < $2::float8 and event_id <= $3::bigint
    ), deleted as (
      delete from ${table} d using doomed where d.event_id <= doomed.upto returning d.event_id
    ), raised as (
      update event_log_state set history_floor = greatest(history_floor, (select max(event_id) from deleted))
      where exists (select 1 from deleted) returning history_floor
    )
    select (select count(*) from deleted)::text as deleted,
      coalesce((select history_floor from raised), (select history_floor from event_log_state))::text as floor`,
  [retentionMs, below, settled])
  return { deleted: Number(row!.deleted), floor: Number(row!.floor) }
}

/** The newest created_at of a partition (Unix ms; null when empty): one scan, done once a range is settled. */
async function newestCreatedAt (client: pg.ClientBase, partition: string): Promise<number | null> {
  const { rows: [row] } = await client.query<{ ms: string | null }>(
    `select (extract(epoch from max(created_at)) * 1000)::bigint::text as ms from ${quoteId(partition)}`)
  return row!.ms === null ? null : Number(row!.ms)
}

/** The created_at of a partition's first event (Unix ms; null when empty), by its primary key. */
async function firstCreatedAt (client: pg.ClientBase, partition: string): Promise<number | null> {
  const { rows: [row] } = await client.query<{ ms: string }>(
    `select (extract(epoch from created_at) * 1000)::bigint::text as ms from ${quoteId(partition)} order by event_id limit 1`)
  return row === undefined ? null : Number(row.ms)
}

export interface KeeperOptions {
  /** Undefined: keep every event. */
  retentionMs: number | undefined
  /** The longest a statement that needs the parent's ACCESS EXCLUSIVE lock waits in the lock queue. */
  lockTimeoutMs: number
  /** The window over which the sequence's rate is measured (10 minutes by default). */
  rateWindowMs?: number
  /**
   * The settled position, freshly published (no id at or below it can still
   * commit, nor be inserted later), which may follow a range just closed: a
   * tick of the keeper's, on its own connection (never one beside it); it is
   * handed the pass's.
   */
  settle: (client: pg.ClientBase) => Promise<number>
  log: KeeperLog
}

/**
 * The policy, one pass at a time: ranges ahead of the sequence, sized by its
 * observed rate so that a range spans about a quarter of the retention (a
 * day without one); then, with a retention, the range being filled closed
 * once it and its first event are that old, settled ranges whose events have all
 * expired dropped (lowest first, so everything at or below the floor is
 * gone), and the default partition's expired rows deleted. An event is so
 * gone within retention + span + a pass or two of its created_at (a span
 * more after the keeper changes hands): within twice the retention.
 */
export class PartitionKeeper {
  /** Partitions of the events table at the last pass, the default one included. */
  partitions = 0
  /** Partitions this keeper dropped, and rows it deleted from the default partition. */
  dropped = 0
  deletedRows = 0
  /** Called with the history's new floor once a pass raised it: this process's streams stop serving from memory what went. */
  onFloorRaised: (floor: number) => void = () => {}
  /** (time, ids drawn by writers) samples over RATE_WINDOW_MS. */
  readonly #samples: Array<{ at: number, drawn: number }> = []
  /** Ids this keeper moved the sequence over: not the writers' rate. */
  #skipped = 0
  /** Newest created_at of settled partitions, by name: they receive no more events. */
  readonly #newest = new Map<string, number | null>()
  /** When this keeper first saw the sequence inside a range (Unix ms), by name. */
  readonly #openedAt = new Map<string, number>()

  readonly options: KeeperOptions

  constructor (options: KeeperOptions) {
    this.options = options
  }

  /** The span of a range: a quarter of the retention, or a day. */
  get spanMs (): number {
    return this.options.retentionMs === undefined ? SPAN_WITHOUT_RETENTION_MS : this.options.retentionMs / 4
  }

  /** Ids the writers draw per second, over the last RATE_WINDOW_MS (0 until a second has passed). */
  get rate (): number {
    const first = this.#samples[0]
    const last = this.#samples.at(-1)
    if (first === undefined || last === undefined || last.at - first.at < 1000) return 0
    return (last.drawn - first.drawn) / ((last.at - first.at) / 1000)
  }

  /** Ids that may be drawn while a range is made past the sequence: about a second's worth, at least NEXTVAL_CLOSE_LIMIT. */
  get inFlightMargin (): number {
    return Math.max(NEXTVAL_CLOSE_LIMIT, Math.ceil(this.rate))
  }

  /** The size of the next range made. */
  get rangeSize (): number {
    return Math.min(MAX_RANGE_IDS, Math.max(MIN_RANGE_IDS, Math.ceil(this.rate * this.spanMs / 1000)))
  }

  #observe (drawn: number, at: number): void {
    this.#samples.push({ at, drawn: drawn - this.#skipped })
    while (at - this.#samples[0]!.at > (this.options.rateWindowMs ?? RATE_WINDOW_MS)) this.#samples.shift()
  }

  /** One pass. */
  async keep (client: pg.ClientBase): Promise<void> {
    let partitions = await listPartitions(client)
    if (partitions === undefined) return
    const { drawn, nowMs } = await sequencePosition(client)
    this.#observe(drawn, nowMs)
    await this.#makeRangesAhead(client, partitions, drawn)
    const { retentionMs } = this.options
    if (retentionMs !== undefined) {
      partitions = (await listPartitions(client))!
      await this.#closeOpenRange(client, partitions, drawn, nowMs)
      await this.#dropExpired(client, partitions, nowMs - retentionMs, retentionMs)
    }
    const after = (await listPartitions(client))!
    this.partitions = after.ranges.length + Number(after.defaultPartition !== undefined)
  }

  /** Runs `work`, which needs a lock on the events table; false when that lock was busy (said in the log; the next pass tries again). */
  async #whenFree (what: string, work: () => Promise<void>): Promise<boolean> {
    try {
      await work()
      return true
    } catch (err) {
      if (!isLockTimeout(err)) throw err
      this.options.log.warn({ lockTimeoutMs: this.options.lockTimeoutMs }, `event history: the events table was busy (lock_timeout); ${what} on a later pass`)
      return false
    }
  }

  async #makeRangesAhead (client: pg.ClientBase, partitions: EventPartitions, drawn: number): Promise<void> {
    const size = this.rangeSize
    let top = partitions.ranges.at(-1)?.end
    for (let made = 0; made < MOST_PER_PASS && (top === undefined || top - (drawn + 1) < RANGES_AHEAD * size); made++) {
      // Contiguous with the last range; past the sequence when it has left every range behind (a
      // keeper away, a failover's jump), then by a margin: ids drawn meanwhile may be on their way into
      // the default partition, and a range attached under them would make those inserts fail.
      const start = top === undefined || top <= drawn ? drawn + 1 + this.inFlightMargin : top
      let range: RangePartition | undefined
      const create = async () => { range = await createRange(client, start, size, partitions.defaultPartition, this.options.lockTimeoutMs) }
      if (!await this.#whenFree('a range ahead is made', create)) return
      this.options.log.debug({ partition: range!.name, start: range!.start, end: range!.end }, 'event history: range made ahead of the sequence')
      top = range!.end
    }
  }

  /**
   * Closes the range the sequence is in once its first event is older than
   * a span, so that it can expire as one. Not before the range has been
   * open a span, too: events written with an older created_at than their
   * time of writing would otherwise close a range on every pass.
   */
  async #closeOpenRange (client: pg.ClientBase, partitions: EventPartitions, drawn: number, nowMs: number): Promise<void> {
    const open = partitions.ranges.find((range) => startOf(range) <= drawn + 1 && drawn + 1 < range.end)
    if (open === undefined) return
    if (!this.#openedAt.has(open.name)) this.#openedAt.set(open.name, nowMs)
    if (nowMs - this.#openedAt.get(open.name)! < this.spanMs) return
    const first = await firstCreatedAt(client, open.name)
    if (first === null || nowMs - first < this.spanMs) return
    // The ids after the jump must find their ranges: made first, as if the sequence were already there.
    await this.#makeRangesAhead(client, partitions, open.end - 1)
    if (await closeRange(client, drawn, open.end, this.options.lockTimeoutMs)) {
      this.#openedAt.delete(open.name)
      this.#skipped += open.end - 1 - drawn
      this.options.log.debug({ partition: open.name, from: drawn, to: open.end - 1 }, 'event history: range closed (the sequence moved to its end)')
    }
  }

  async #dropExpired (client: pg.ClientBase, partitions: EventPartitions, cutoffMs: number, retentionMs: number): Promise<void> {
    const settled = await this.options.settle(client)
    let below = Infinity
    let dropped = 0
    for (const range of partitions.ranges) {
      below = startOf(range)
      if (range.end - 1 > settled || dropped === MOST_PER_PASS) break
      if (!this.#newest.has(range.name)) this.#newest.set(range.name, await newestCreatedAt(client, range.name))
      const newest = this.#newest.get(range.name)!
      if (newest !== null && newest >= cutoffMs) break
      let floor = 0
      const drop = async () => { floor = await dropRange(client, range.name, this.options.lockTimeoutMs) }
      if (!await this.#whenFree(`${range.name}, expired, is dropped`, drop)) return
      this.#newest.delete(range.name)
      this.onFloorRaised(floor)
      this.dropped++
      dropped++
      const newestAt = newest === null ? null : new Date(newest).toISOString()
      this.options.log.info({ partition: range.name, end: range.end, newestCreatedAt: newestAt, historyFloor: floor },
        'event history: partition dropped (every event in it older than EVENTS_RETENTION)')
      below = Infinity
    }
    // Without a default partition (an operator's choice: Postgres then refuses ids past every range), nothing more to do.
    const partition = partitions.defaultPartition
    if (partition === undefined) return
    const { deleted, floor } = await deleteExpiredDefaultRows(client, partition, retentionMs, below, settled)
    if (deleted > 0) {
      this.onFloorRaised(floor)
      this.deletedRows += deleted
      this.options.log.info({ partition, deleted, historyFloor: floor },
        'event history: expired events deleted from the default partition (ids past every range, written while the keeper was behind)')
    }
  }
}
