-- What the database keeps for replicas of an older version of this
-- service, which may run beside this one during a rolling deploy. Nothing
-- in this version calls them.
--
-- events_settle_bound(): a settled bound as those replicas work it out,
-- each for itself, rather than reading the keeper's (keeper.sql).
--
-- - On a hot standby, from the clock that events_keep_order still writes
--   (clock_value, clock_xid, clock_at in event_log_state): clock_value is
--   the sequence's value read before the tick's transaction took its id,
--   clock_xid, so once a snapshot's xmin has passed clock_xid the writers
--   that drew those ids have ended.
-- - On the primary, a census like events_census, with one bound per writer
--   and no settle mark: a writer seen by the census before keeps its bound;
--   a new one is bounded by the caller's prior `drawn`, the clock when its
--   transaction is younger than the clock's, and the history's floor.
--
-- Security definer, its search_path fixed, like the census (keeper.sql).
-- Neither is executable by public: a replica of such a version reading as a
-- role of its own needs `grant execute` on them (docs/database.md, "Roles
-- and privileges").
--
-- events_drawn(): events_id_drawn (readers.sql) as a function, which those
-- replicas call; security definer, its search_path fixed, since a
-- read-only role has no right on the sequence.
--
-- Not a migration: a change is made by a new migration, then copied here
-- (test/sql-definitions.test.ts fails while the two differ).

create or replace function events_settle_bound(
  prior_drawn bigint default null, prior_writers text[] default '{}', prior_bounds bigint[] default '{}',
  out bound bigint, out waiting_pid integer, out clock_age double precision,
  out drawn bigint, out writers text[], out writer_bounds bigint[])
language plpgsql volatile security definer set search_path = public, pg_temp as $$
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
  select case when s.is_called then s.last_value else s.last_value - 1 end into drawn from events_event_id_seq s;
  with locks as (
    select l.virtualtransaction as vxid, l.pid, l.locktype, l.transactionid
    from pg_locks l
    where l.granted and (
      (l.locktype = 'relation' and l.mode = 'RowExclusiveLock' and l.relation = 'events_event_id_seq'::regclass
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
$$;
revoke execute on function events_settle_bound(bigint, text[], bigint[]) from public;

create or replace function events_drawn() returns bigint
language plpgsql volatile security definer set search_path = public, pg_temp as $$
begin
  if pg_is_in_recovery() then
    return null;
  end if;
  return (select case when s.is_called then s.last_value else s.last_value - 1 end from events_event_id_seq s);
end
$$;
revoke execute on function events_drawn() from public;
