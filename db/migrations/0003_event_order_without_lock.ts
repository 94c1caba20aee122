import { sql, type Kysely } from 'kysely'
import * as lockedEventOrder from './0002_event_stream.ts'

/*
 * Orders the event log on the READ side, so that no writer waits for
 * another (migration 0002 held an advisory lock from an event's insert to
 * its commit: every event-writing transaction of the orchestrator committed
 * one at a time). Ids are drawn from the sequence as an identity would draw
 * them, so they may commit out of order; a reader moves past an id only
 * once every id below it is settled: committed, or known never to commit.
 * Why each piece is sound is in docs/stream.md ("How the event order is
 * settled"); in short:
 *
 * - Registration (primary). The column default events_next_id(), before the
 *   first id a transaction draws, takes a SHARED transaction-level advisory
 *   lock keyed by the sequence's value at that moment (lb). Shared locks
 *   never wait for each other, and the lock only says "this transaction may
 *   still commit ids above lb" until it ends.
 * - Census (primary). events_settle_bound() reads the sequence (V), THEN the
 *   registered writers (pg_locks): every id <= min(V, lowest lb) was drawn
 *   by a transaction that had ended when pg_locks was read, so any snapshot
 *   taken afterwards shows it or it never commits. Only transactions that
 *   drew an event id are waited for; any other open transaction is not.
 * - Clock (standby, and in-statement positions). A standby has no pg_locks
 *   of the primary. The service's upkeep on the primary writes a clock row:
 *   the sequence value read BEFORE its own transaction id was assigned, and
 *   that id. Every id <= clock_value was drawn by a transaction older than
 *   clock_xid, so once a snapshot's xmin passes clock_xid (all older
 *   transactions have ended: a snapshot's xmin is below every transaction still
 *   running) those ids are settled.
 * - Contiguity. Ids just above a settled position that are all visible are
 *   settled too: no hole, nothing to wait for.
 *
 * The sequence keeps CACHE 1, so ids are handed out in increasing order
 * across sessions. The statements are safe on a live table: an insert that
 * drew its id under 0002 holds 0002's exclusive lock, which the census
 * counts as a writer at the bottom of the log until it commits.
 */

/** Registration lock keys are REGISTRATION_KEY_BASE + lb (bigint advisory keys; lb < 2^52). */
export const REGISTRATION_NAMESPACE = 935
const REGISTRATION_KEY_BASE = `(${REGISTRATION_NAMESPACE}::bigint << 52)`

/**
 * The writer path: registration, the column default and the trigger for
 * explicit ids (migration 0005 replaces them with cheaper ones; its down
 * migration puts these back).
 */
export async function createWriterRegistration (db: Kysely<any>): Promise<void> {
  // Registers the transaction as an event writer, once per transaction (a
  // transaction-local setting remembers it; a rolled-back savepoint forgets
  // it together with its lock). Inlined in events_next_id(), the column's
  // default, because each plpgsql call costs the orchestrator's writes.
  const registration = sql.raw(`
      if current_setting('ocp.events_writer', true) is distinct from 'on' then
        -- The transaction id first (the clock's argument needs every drawer
        -- to hold one before it draws), then the registration.
        perform pg_current_xact_id();
        perform pg_advisory_xact_lock_shared(${REGISTRATION_KEY_BASE} + coalesce(pg_sequence_last_value('events_event_id_seq'), 0));
        perform set_config('ocp.events_writer', 'on', true);
      end if;`)
  await sql`
    create or replace function events_register_writer() returns void
    language plpgsql volatile as $$
    begin ${registration}
    end
    $$`.execute(db)

  await sql`
    create or replace function events_next_id() returns bigint
    language plpgsql volatile as $$
    begin ${registration}
      return nextval('events_event_id_seq');
    end
    $$`.execute(db)

  // An explicit id ahead of the sequence (a fixture): registered like a
  // drawn one, and the sequence moved past it so later ids stay above it.
  await sql`
    create or replace function events_assign_ordered_id() returns trigger
    language plpgsql as $$
    begin
      perform events_register_writer();
      perform setval('events_event_id_seq', new.event_id);
      return new;
    end
    $$`.execute(db)
  await sql`drop trigger if exists events_assign_ordered_id on events`.execute(db)
  await sql`
    create trigger events_assign_ordered_id
    before insert on events
    for each row
    when (new.event_id > coalesce(pg_sequence_last_value('events_event_id_seq'::regclass), 0))
    execute function events_assign_ordered_id()`.execute(db)
  await sql`alter table events alter column event_id set default events_next_id()`.execute(db)
}

/**
 * The census (primary) and the clock's bound (standby): events_settle_bound()
 * as this migration made it (migration 0008 replaces it; its down migration
 * puts this back).
 */
export async function createSettleBound (db: Kysely<any>): Promise<void> {
  const legacyLock = lockedEventOrder.EVENTS_WRITE_LOCK
  await sql`
    create or replace function events_settle_bound(out bound bigint, out waiting_pid integer, out clock_age double precision)
    language plpgsql volatile security definer set search_path from current as $$
    declare
      drawn bigint;
    begin
      if pg_is_in_recovery() then
        select case when s.clock_xid <= pg_snapshot_xmin(pg_current_snapshot()) then s.clock_value else 0 end,
               extract(epoch from clock_timestamp() - s.clock_at)
          into bound, clock_age from event_log_state s;
        bound := coalesce(bound, 0);
        return;
      end if;
      -- The sequence first, the census second: the order is what makes it sound.
      select case when s.is_called then s.last_value else s.last_value - 1 end into drawn from events_event_id_seq s;
      select w.lb, w.pid into bound, waiting_pid from (
        select ((l.classid::bigint << 32) | l.objid::bigint) - ${sql.raw(REGISTRATION_KEY_BASE)} as lb, l.pid
          from pg_locks l
          where l.locktype = 'advisory' and l.objsubid = 1 and l.classid::bigint >> 20 = ${sql.lit(REGISTRATION_NAMESPACE)}
            and l.database = (select oid from pg_database where datname = current_database())
        union all
        select 0, l.pid from pg_locks l
          where l.locktype = 'advisory' and l.objsubid = 1
            and l.classid::bigint = ${sql.lit(Number(legacyLock >> 32n))} and l.objid::bigint = ${sql.lit(Number(legacyLock & 0xffffffffn))}
            and l.database = (select oid from pg_database where datname = current_database())
      ) w order by w.lb limit 1;
      if bound is null or bound >= drawn then
        bound := drawn;
        waiting_pid := null;
      end if;
    end
    $$`.execute(db)
}

export async function up (db: Kysely<any>): Promise<void> {
  await sql`alter sequence events_event_id_seq cache 1`.execute(db)

  // One row: the history's floor (retention) and the clock (see above).
  await sql`
    create table if not exists event_log_state (
      singleton boolean primary key default true check (singleton),
      history_floor bigint not null default 0,
      clock_value bigint not null default 0,
      clock_xid xid8 not null default '0',
      clock_at timestamptz not null default now()
    )`.execute(db)
  await sql`insert into event_log_state default values on conflict do nothing`.execute(db)

  await createWriterRegistration(db)

  await createSettleBound(db)

  // The settled position of the CALLING statement's snapshot (a stable
  // function runs in it): `known` (a position settled before the statement
  // began, or 0), or the clock's, extended over ids visible without a hole.
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

export async function down (db: Kysely<any>): Promise<void> {
  await sql`drop function events_settled(bigint)`.execute(db)
  await sql`drop function events_settle_bound()`.execute(db)
  await sql`alter table events alter column event_id drop default`.execute(db)
  await sql`drop trigger events_assign_ordered_id on events`.execute(db)
  await sql`drop function events_next_id()`.execute(db)
  await sql`drop function events_assign_ordered_id()`.execute(db)
  await sql`drop function events_register_writer()`.execute(db)
  await sql`drop table event_log_state`.execute(db)
  // Back to 0002's ordering lock (its statements tolerate what exists).
  await lockedEventOrder.up(db)
}
