import { sql, type Kysely } from 'kysely'
import { createSettleBound } from './0003_event_order_without_lock.ts'
import * as writerRegistration from './0005_event_writers_inlined.ts'

/*
 * The primary's census without a registration: a writer pays nothing for
 * it. Migrations 0003 and 0005 had each event-writing transaction take a
 * shared advisory lock keyed by the sequence's value before its first id
 * (and set a marker), so that the census could read from pg_locks which
 * transactions may still commit ids, and from which id up. That lock was
 * the whole cost the service added to one orchestrator writer: 0.85 of the
 * bare schema's throughput with it, 1.01 without it (BENCHMARKS.md, "One
 * writer: which part costs").
 *
 * Postgres already keeps the first half of that fact: nextval() takes a
 * ROW EXCLUSIVE lock on the sequence before it draws, owned by the
 * top-level transaction, so it is held to commit or rollback even when the
 * savepoint that drew is rolled back. So the holders of that lock in
 * pg_locks are exactly the transactions that drew an event id and have not
 * ended (and the explicit-id trigger, which reads the sequence, takes it
 * too). What Postgres does not keep is the value each drew first. The
 * census now works it out from the census before it, which the caller
 * hands back (the poller keeps its last one):
 *
 * - A holder that was not a holder at the prior census took the lock, and
 *   so drew, after the prior census read the sequence: its ids are above
 *   the prior census's `drawn`.
 * - A holder that was one already keeps the bound the prior census gave it
 *   (the same transaction: the lock is held to its end).
 * - With no prior census (a poller's first, the keeper's), the clock: a
 *   holder whose transaction id is younger than the clock's (or that has
 *   none yet) drew after the clock read the sequence, so above its value;
 *   any other, above the history's floor only.
 *
 * The order of the reads is what makes it sound, as before: the clock,
 * then the sequence (drawn), then pg_locks. Every id at or below the bound
 * was drawn by a transaction that had ended when pg_locks was read.
 *
 * The writer's path keeps the transaction id before the draw (the clock's
 * argument, on a standby too) and the AFTER trigger that moves the sequence
 * past an explicit id above it; the registration and its marker are gone.
 * Replacing the functions is safe on a live table: a transaction that drew
 * under 0005 holds the sequence's lock like any other drawer.
 */

const SEQUENCE = 'events_event_id_seq'

export async function up (db: Kysely<any>): Promise<void> {
  await sql`
    create or replace function events_next_id() returns bigint
    language sql volatile as $$
      select case when pg_current_xact_id() is null then null else nextval('${sql.raw(SEQUENCE)}') end
    $$`.execute(db)

  await sql`
    create or replace function events_explicit_id() returns trigger
    language plpgsql as $$
    begin
      if new.event_id > coalesce(pg_sequence_last_value('${sql.raw(SEQUENCE)}'), 0) then
        perform setval('${sql.raw(SEQUENCE)}', new.event_id);
      end if;
      return null;
    end
    $$`.execute(db)
  await sql`drop function events_register_writer()`.execute(db)

  await sql`drop function events_settle_bound()`.execute(db)
  await sql`
    create function events_settle_bound(
      prior_drawn bigint default null, prior_writers text[] default '{}', prior_bounds bigint[] default '{}',
      out bound bigint, out waiting_pid integer, out clock_age double precision,
      out drawn bigint, out writers text[], out writer_bounds bigint[])
    language plpgsql volatile security definer set search_path from current as $$
    declare
      clock event_log_state%rowtype;
    begin
      writers := '{}';
      writer_bounds := '{}';
      select * into clock from event_log_state;
      if pg_is_in_recovery() then
        bound := case when clock.clock_xid <= pg_snapshot_xmin(pg_current_snapshot()) then clock.clock_value else 0 end;
        clock_age := extract(epoch from clock_timestamp() - clock.clock_at);
        return;
      end if;
      -- The clock, the sequence, then the census: the order is what makes it sound.
      select case when s.is_called then s.last_value else s.last_value - 1 end into drawn from ${sql.raw(SEQUENCE)} s;
      with locks as (
        select l.virtualtransaction as vxid, l.pid, l.locktype, l.transactionid
        from pg_locks l
        where l.granted and (
          (l.locktype = 'relation' and l.mode = 'RowExclusiveLock' and l.relation = '${sql.raw(SEQUENCE)}'::regclass
            and l.database = (select oid from pg_database where datname = current_database()))
          or (l.locktype = 'transactionid' and l.mode = 'ExclusiveLock'))
      ), holders as (
        select h.vxid, h.pid, (array_agg(x.transactionid::text order by age(x.transactionid) desc))[1] as xid,
               max(age(x.transactionid)) as xid_age
        from locks h left join locks x on x.vxid = h.vxid and x.locktype = 'transactionid'
        where h.locktype = 'relation'
        group by h.vxid, h.pid
      ), census as (
        -- A writer is recorded as 'virtual id:transaction id' (its oldest, the
        -- top-level one; empty while it has none), and recognized by either:
        -- it may take its transaction id after a census, and PREPARE
        -- TRANSACTION gives it another virtual id.
        select h.vxid || ':' || coalesce(h.xid, '') as writer, h.pid, coalesce(p.bound, greatest(prior_drawn,
          case when h.xid_age is null or h.xid_age < age(xid(clock.clock_xid)) then clock.clock_value end,
          clock.history_floor)) as bound
        from holders h left join lateral (
          select min(p.bound) as bound from unnest(prior_writers, prior_bounds) p (writer, bound)
          where split_part(p.writer, ':', 1) = h.vxid or split_part(p.writer, ':', 2) = h.xid
        ) p on true
      )
      select coalesce(array_agg(c.writer order by c.bound), '{}'), coalesce(array_agg(c.bound order by c.bound), '{}'),
             (array_agg(c.pid order by c.bound))[1], min(c.bound)
        into writers, writer_bounds, waiting_pid, bound
        from census c;
      if bound is null or bound >= drawn then
        bound := drawn;
        waiting_pid := null;
      end if;
    end
    $$`.execute(db)
}

export async function down (db: Kysely<any>): Promise<void> {
  await sql`drop function events_settle_bound(bigint, text[], bigint[])`.execute(db)
  await createSettleBound(db)
  // 0005's writer path (the registration, its function, the trigger), made whole again.
  await sql`drop trigger events_explicit_id on events`.execute(db)
  await writerRegistration.up(db)
}
