import { sql, type Kysely } from 'kysely'

/*
 * The events table becomes partitioned BY RANGE (event_id), so that the
 * history can be bounded by dropping whole partitions (EVENTS_RETENTION,
 * docs/operating.md, "Event history (retention)") instead of deleting rows.
 *
 * The existing table is converted without being rewritten: it becomes the
 * first partition, [MINVALUE, B), where B is the sequence's value plus a
 * margin (no id drawn while this runs reaches B). ATTACH proves that its
 * rows fit that range from a validated CHECK (event_id < B) instead of
 * scanning, and attaches its indexes to the parent's instead of building.
 * Validating the CHECK is the one scan, and it blocks no writer when it runs
 * outside the migration's transaction: migrateToLatest calls
 * prepareConversion() first, so the migration itself only holds the
 * table's lock for catalog changes. (Without that, as on a fresh database,
 * the migration adds and validates the CHECK itself.)
 *
 * Above B: one partition ahead, then a DEFAULT partition, so that an insert
 * never fails for want of a range (the event log's upkeep makes ranges
 * ahead of the sequence; ids past the last one land in the default).
 *
 * Everything that migration 0003 hung on the table moves to the parent:
 * the events_next_id() default, the BEFORE INSERT trigger (with its WHEN
 * clause; Postgres clones it onto each partition), the primary key and the
 * indexes, the sequence's ownership, and the grants. events_settled() now
 * also starts at the history's floor: every id at or below it is gone or
 * never commits, so it is a settled position.
 */

/** The first partition: the table as it was. */
export const FIRST_PARTITION = 'events_initial'
export const DEFAULT_PARTITION = 'events_default'
/** Ids left between the sequence and the first partition's end, for the ids drawn while the conversion runs. */
export const CONVERSION_MARGIN = 10_000_000
/** The size of the range made ahead of the first partition (the upkeep sizes later ones by the observed rate). */
const FIRST_RANGE_AHEAD = 1_000_000
const BOUND_CHECK = 'events_ids_below_first_partition_end'

/** The name of the partition whose range starts at `start`. */
export const partitionName = (start: bigint | number | string) => `events_from_${start}`

const COLUMNS = 'event_id, event_type, run_id, task_id, thread_id, summary, payload, created_at'

async function isPartitioned (db: Kysely<any>): Promise<boolean> {
  const { rows: [row] } = await sql<{ kind: string | null }>`select relkind::text as kind from pg_class where oid = to_regclass('events')`.execute(db)
  return row?.kind === 'p'
}

/** The end of the first range (exclusive) recorded in the CHECK, or undefined when there is none. */
async function checkedBound (db: Kysely<any>): Promise<{ bound: bigint, validated: boolean } | undefined> {
  const { rows: [row] } = await sql<{ definition: string, validated: boolean }>`
    select pg_get_constraintdef(oid) as definition, convalidated as validated
    from pg_constraint where conrelid = to_regclass('events') and conname = ${BOUND_CHECK}`.execute(db)
  if (row === undefined) return undefined
  return { bound: BigInt(/< \(?'?(\d+)/.exec(row.definition)![1]!), validated: row.validated }
}

/** The highest id drawn from the sequence, or present in the table (explicit ids). */
async function highestId (db: Kysely<any>): Promise<bigint> {
  const { rows: [row] } = await sql<{ id: string }>`
    select greatest(
      (select case when is_called then last_value else last_value - 1 end from events_event_id_seq),
      (select coalesce(max(event_id), 0) from events))::text as id`.execute(db)
  return BigInt(row!.id)
}

async function addBoundCheck (db: Kysely<any>): Promise<void> {
  const bound = await highestId(db) + BigInt(CONVERSION_MARGIN)
  await sql`alter table events add constraint ${sql.id(BOUND_CHECK)} check (event_id < ${sql.lit(bound.toString())}::bigint) not valid`.execute(db)
}

/**
 * Adds and validates the CHECK the conversion needs, each in a transaction
 * of its own, before the migrations' transaction: ADD takes the table's
 * lock for a moment (at most 2 s in the lock queue, else the migration
 * does it), VALIDATE scans without blocking inserts. Best effort: returns
 * whether it added the CHECK, so that a failed migration can take it away.
 */
export async function prepareConversion (db: Kysely<any>): Promise<boolean> {
  try {
    const { rows: [ready] } = await sql<{ ready: boolean }>`
      select to_regclass('events') is not null and to_regprocedure('events_next_id()') is not null as ready`.execute(db)
    if (ready?.ready !== true || await isPartitioned(db)) return false
    let added = false
    if (await checkedBound(db) === undefined) {
      await db.transaction().execute(async (trx) => {
        await sql`set local lock_timeout = '2s'`.execute(trx)
        await addBoundCheck(trx)
      })
      added = true
    }
    await sql`alter table events validate constraint ${sql.id(BOUND_CHECK)}`.execute(db)
    return added
  } catch {
    return false // another replica did it meanwhile, or the lock was busy: the migration does what is left
  }
}

/** Takes away a CHECK that prepareConversion added, after the migration failed (it would refuse ids from B on). */
export async function undoPreparation (db: Kysely<any>): Promise<void> {
  if (!await isPartitioned(db)) await sql`alter table events drop constraint if exists ${sql.id(BOUND_CHECK)}`.execute(db)
}

/** GRANT statements giving `to` the privileges `from` has. */
async function copyGrants (db: Kysely<any>, from: string, to: string): Promise<void> {
  const { rows } = await sql<{ grantee: string | null, privilege: string, grantable: boolean }>`
    select case when a.grantee = 0 then null else a.grantee::regrole::text end as grantee, a.privilege_type as privilege, a.is_grantable as grantable
    from pg_class c, aclexplode(c.relacl) a
    where c.oid = ${from}::regclass and a.grantee <> c.relowner`.execute(db)
  for (const { grantee, privilege, grantable } of rows) {
    await sql`grant ${sql.raw(privilege)} on ${sql.table(to)} to ${grantee === null ? sql.raw('public') : sql.raw(grantee)}${sql.raw(grantable ? ' with grant option' : '')}`.execute(db)
  }
}

/** Renames `table`'s index on exactly `columns` (if it has one) to `name`. */
async function renameIndexOn (db: Kysely<any>, table: string, columns: string, name: string): Promise<void> {
  const { rows: [row] } = await sql<{ index: string }>`
    select i.indexrelid::regclass::text as index from pg_index i
    where i.indrelid = ${table}::regclass and pg_get_indexdef(i.indexrelid) like ${`% USING btree (${columns})`}
    limit 1`.execute(db)
  if (row !== undefined && row.index !== name) await sql`alter index ${sql.id(row.index)} rename to ${sql.id(name)}`.execute(db)
}

const ORDERED_ID_TRIGGER = sql`
  create trigger events_assign_ordered_id
  before insert on events
  for each row
  when (new.event_id > coalesce(pg_sequence_last_value('events_event_id_seq'::regclass), 0))
  execute function events_assign_ordered_id()`

/** events_settled() as this migration defines it: from the clock, the history's floor and `known` (0006 reads the ids ahead by index). */
export const settledFromFloor = sql`
    create or replace function events_settled(known bigint) returns bigint
    language sql stable as $$
      with start as (
        select greatest(known,
          coalesce((select s.clock_value from event_log_state s
            where s.clock_xid <= pg_snapshot_xmin(pg_current_snapshot())), 0),
          coalesce((select s.history_floor from event_log_state s), 0)) as p
      ), ahead as (
        select a.event_id, row_number() over (order by a.event_id) as n
        from (select e.event_id from events e, start where e.event_id > start.p order by e.event_id limit 64) a
      )
      select greatest(start.p, coalesce(max(ahead.event_id) filter (where ahead.event_id = start.p + ahead.n), 0))
      from start left join ahead on true
      group by start.p
    $$`

export async function up (db: Kysely<any>): Promise<void> {
  let check = await checkedBound(db)
  if (check !== undefined && await highestId(db) >= check.bound) {
    // Ids reached the bound since it was chosen: choose again.
    await sql`alter table events drop constraint ${sql.id(BOUND_CHECK)}`.execute(db)
    check = undefined
  }
  if (check === undefined) {
    await addBoundCheck(db)
    check = (await checkedBound(db))!
  }
  if (!check.validated) await sql`alter table events validate constraint ${sql.id(BOUND_CHECK)}`.execute(db)
  const bound = check.bound.toString()

  // From here on, catalog changes only: the table's lock is held for moments.
  await sql`lock table events in access exclusive mode`.execute(db)
  await sql`alter table events rename to ${sql.id(FIRST_PARTITION)}`.execute(db)
  await renameIndexOn(db, FIRST_PARTITION, 'event_id', `${FIRST_PARTITION}_pkey`)
  await renameIndexOn(db, FIRST_PARTITION, 'run_id, event_id', `${FIRST_PARTITION}_run_id_event_id_idx`)
  await renameIndexOn(db, FIRST_PARTITION, 'thread_id, event_id', `${FIRST_PARTITION}_thread_id_event_id_idx`)
  // The parent's trigger and default replace the table's own (the trigger is cloned back onto it by ATTACH).
  await sql`drop trigger events_assign_ordered_id on ${sql.id(FIRST_PARTITION)}`.execute(db)
  await sql`alter table ${sql.id(FIRST_PARTITION)} alter column event_id drop default`.execute(db)

  await sql`
    create table events (
      event_id bigint not null default events_next_id(),
      event_type text not null,
      run_id text not null default '',
      task_id text not null default '',
      thread_id text not null default '',
      summary text not null default '',
      payload jsonb not null default '{}'::jsonb,
      created_at timestamptz not null default now(),
      constraint events_pkey primary key (event_id)
    ) partition by range (event_id)`.execute(db)
  await sql`create index events_run_id_event_id_idx on events (run_id, event_id)`.execute(db)
  await sql`create index events_thread_id_event_id_idx on events (thread_id, event_id)`.execute(db)
  await ORDERED_ID_TRIGGER.execute(db)
  await sql`alter sequence events_event_id_seq owned by events.event_id`.execute(db)
  await copyGrants(db, FIRST_PARTITION, 'events')
  await sql`alter table events owner to ${sql.raw(await ownerOf(db, FIRST_PARTITION))}`.execute(db)

  await sql`alter table events attach partition ${sql.id(FIRST_PARTITION)} for values from (minvalue) to (${sql.lit(bound)})`.execute(db)
  // The partition's bound now says what the CHECK said.
  await sql`alter table ${sql.id(FIRST_PARTITION)} drop constraint ${sql.id(BOUND_CHECK)}`.execute(db)
  const end = (check.bound + BigInt(FIRST_RANGE_AHEAD)).toString()
  await sql`create table ${sql.id(partitionName(bound))} partition of events for values from (${sql.lit(bound)}) to (${sql.lit(end)})`.execute(db)
  await sql`create table ${sql.id(DEFAULT_PARTITION)} partition of events default`.execute(db)

  await settledFromFloor.execute(db)
}

async function ownerOf (db: Kysely<any>, table: string): Promise<string> {
  const { rows: [row] } = await sql<{ owner: string }>`select quote_ident(relowner::regrole::text) as owner from pg_class where oid = ${table}::regclass`.execute(db)
  return row!.owner
}

/** Back to one table: the first partition (or the largest left), with the other partitions' rows copied in. */
export async function down (db: Kysely<any>): Promise<void> {
  await sql`lock table events in access exclusive mode`.execute(db)
  const { rows: partitions } = await sql<{ name: string }>`
    select c.relname as name from pg_inherits i join pg_class c on c.oid = i.inhrelid
    where i.inhparent = 'events'::regclass
    order by c.relname = ${FIRST_PARTITION} desc, pg_relation_size(c.oid) desc`.execute(db)
  const [base, ...others] = partitions.map((partition) => partition.name)
  const owner = await ownerOf(db, 'events')
  await sql`alter sequence events_event_id_seq owned by none`.execute(db)
  for (const name of partitions.map((partition) => partition.name)) {
    await sql`alter table events detach partition ${sql.id(name)}`.execute(db)
  }
  await copyGrants(db, 'events', base!)
  await sql`drop table events`.execute(db)
  await sql`alter table ${sql.id(base!)} rename to events`.execute(db)
  await sql`alter table events owner to ${sql.raw(owner)}`.execute(db)
  for (const name of others) {
    await sql`insert into events (${sql.raw(COLUMNS)}) select ${sql.raw(COLUMNS)} from ${sql.id(name)}`.execute(db)
    await sql`drop table ${sql.id(name)}`.execute(db)
  }
  await renameIndexOn(db, 'events', 'event_id', 'events_pkey')
  await renameIndexOn(db, 'events', 'run_id, event_id', 'events_run_id_event_id_idx')
  await renameIndexOn(db, 'events', 'thread_id, event_id', 'events_thread_id_event_id_idx')
  await sql`alter table events alter column event_id set default events_next_id()`.execute(db)
  await sql`drop trigger if exists events_assign_ordered_id on events`.execute(db)
  await ORDERED_ID_TRIGGER.execute(db)
  await sql`alter sequence events_event_id_seq owned by events.event_id`.execute(db)

  // Migration 0003's definition.
  await sql`
    create or replace function events_settled(known bigint) returns bigint
    language sql stable as $$
      with start as (
        select greatest(known, coalesce((
          select s.clock_value from event_log_state s
          where s.clock_xid <= pg_snapshot_xmin(pg_current_snapshot())), 0)) as p
      ), ahead as (
        select a.event_id, row_number() over (order by a.event_id) as n
        from (select e.event_id from events e, start where e.event_id > start.p order by e.event_id limit 64) a
      )
      select greatest(start.p, coalesce(max(ahead.event_id) filter (where ahead.event_id = start.p + ahead.n), 0))
      from start left join ahead on true
      group by start.p
    $$`.execute(db)
}
