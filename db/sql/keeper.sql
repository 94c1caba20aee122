-- The keeper: the one statement that works out how far the event log is
-- settled, and publishes it for every reader. What the settled position
-- guarantees, the census, the settle mark, the lease and how long a hole
-- waits are stated once, in docs/stream.md, "How the event order is
-- settled"; this header says only what reading the SQL needs.
--
-- A tick (events_keep_order), one statement, one transaction:
--
-- 1. The row locked; the lease checked (a tick given a keeper and a term
--    that no longer hold it publishes nothing, leads false); the ids made
--    safe on this server and a fork recorded as a new epoch (forks.sql).
-- 2. A sequence moved back below the last census is moved forward again
--    (forks.sql), and the census starts over from the settled position.
-- 3. A census (events_census); the settle mark raised to the lowest id a
--    writer in flight may still draw; a census again, so that the holders
--    it finds new are bounded by fresh values.
-- 4. settled := the lowest of the mark in effect when that census read
--    pg_locks, the sequence's value and every holder's bounds, never lower
--    than before, extended over the run of visible ids above it (100,000 a
--    tick); the settle mark raised to it.
-- 5. The row written, committed synchronously even where
--    synchronous_commit is off: a crash never hands a published hole out
--    again.
--
-- Why the census is written as it is:
-- - it reads the mark, then the sequence, then pg_locks: that order is
--   what makes it sound;
-- - it reads the sequences as relations, never with
--   pg_sequence_last_value(), which would take the very lock it counts;
-- - a holder is recorded as 'virtual id:transaction id' and recognized by
--   either: a writer may take its transaction id after a census, and
--   PREPARE TRANSACTION gives it another virtual id.
--
-- The clock columns (clock_value, clock_xid, clock_at) are still written,
-- for replicas of an older version during a rolling deploy
-- (older-replicas.sql); nothing here reads them.
--
-- Security definer, with "set search_path = public, pg_temp" (Postgres's
-- "Writing SECURITY DEFINER Functions Safely"), and executable by the
-- owner alone: a login that can read nothing can neither take the lease
-- nor hold the row. The keeper's lock_timeout (events/keeper/keeper.ts)
-- bounds how long a tick waits on a session that holds it.
--
-- Not a migration: a change is made by a new migration, then copied here
-- (test/sql-definitions.test.ts fails while the two differ).

create or replace function events_census(
  prior_drawn bigint, prior_mark bigint,
  prior_writers text[] default '{}', prior_draw_bounds bigint[] default '{}', prior_late_bounds bigint[] default '{}',
  prepared_bound bigint default null,
  out drawn bigint, out mark bigint, out writers text[], out draw_bounds bigint[], out late_bounds bigint[],
  out waiting_pid integer, out waiting_transaction text, out prepared integer)
language plpgsql volatile security definer set search_path = public, pg_temp as $$
begin
  -- The mark, the sequence, then pg_locks: the order is what makes it sound.
  select m.last_value into mark from events_settle_mark m;
  select case when s.is_called then s.last_value else s.last_value - 1 end into drawn from events_event_id_seq s;
  with locks as (
    select l.virtualtransaction as vxid, l.pid, l.locktype, l.transactionid
    from pg_locks l
    where l.granted and (
      (l.locktype = 'relation' and l.mode = 'RowExclusiveLock' and l.relation = 'events_event_id_seq'::regclass
        and l.database = (select oid from pg_database where datname = current_database()))
      or (l.locktype = 'transactionid' and l.mode = 'ExclusiveLock'))
  ), holders as (
    -- A holder's transaction id is its oldest (the top-level one), if it has taken one.
    select h.vxid, h.pid, (array_agg(x.transactionid::text order by age(x.transactionid) desc))[1] as xid
    from locks h left join locks x on x.vxid = h.vxid and x.locktype = 'transactionid'
    where h.locktype = 'relation'
    group by h.vxid, h.pid
  ), unknown as (
    -- What a prepared transaction not recognized may be, besides a writer not seen before: one of the prior
    -- census's holders recorded without a transaction id (it took one, then prepared under another virtual id),
    -- gone under that virtual id since.
    select min(p.draw_bound) as draw_bound, min(p.late_bound) as late_bound
    from unnest(prior_writers, prior_draw_bounds, prior_late_bounds) p (writer, draw_bound, late_bound)
    where split_part(p.writer, ':', 2) = '' and split_part(p.writer, ':', 1) not in (select h.vxid from holders h)
  ), census as (
    -- Recorded as 'virtual id:transaction id', recognized by either: a writer may
    -- take its transaction id after a census. One not seen before took the lock
    -- after that census read pg_locks. A prepared transaction not recognized
    -- gets the lowest bounds of those it may be (unknown), and prepared_bound
    -- when there was no census before (one prepared before a fork or a restart).
    select h.vxid || ':' || coalesce(h.xid, '') as writer, h.pid, h.xid,
      coalesce(p.draw_bound, case when h.pid is null then least(prior_drawn, u.draw_bound, prepared_bound) else prior_drawn end) as draw_bound,
      coalesce(p.late_bound, case when h.pid is null then least(prior_mark, u.late_bound, prepared_bound) else prior_mark end) as late_bound
    from holders h left join lateral (
      select min(p.draw_bound) as draw_bound, min(p.late_bound) as late_bound
      from unnest(prior_writers, prior_draw_bounds, prior_late_bounds) p (writer, draw_bound, late_bound)
      where split_part(p.writer, ':', 1) = h.vxid or (h.xid is not null and split_part(p.writer, ':', 2) = h.xid)
    ) p on true
    cross join unknown u
  )
  select coalesce(array_agg(c.writer order by least(c.draw_bound, c.late_bound)), '{}'),
         coalesce(array_agg(c.draw_bound order by least(c.draw_bound, c.late_bound)), '{}'),
         coalesce(array_agg(c.late_bound order by least(c.draw_bound, c.late_bound)), '{}'),
         (array_agg(c.pid order by least(c.draw_bound, c.late_bound)))[1],
         (array_agg(x.gid order by least(c.draw_bound, c.late_bound)))[1],
         count(*) filter (where c.pid is null)
    into writers, draw_bounds, late_bounds, waiting_pid, waiting_transaction, prepared
    from census c left join pg_prepared_xacts x on c.pid is null and x.transaction::text = c.xid and x.database = current_database();
end
$$;
revoke execute on function events_census(bigint, bigint, text[], bigint[], bigint[], bigint) from public;

-- The primary's WAL timeline; null on a standby, and where the server does not say.
create or replace function events_timeline() returns bigint
language plpgsql volatile as $$
begin
  if pg_is_in_recovery() then
    return null;
  end if;
  return ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint;
exception when others then
  return null;
end
$$;
revoke execute on function events_timeline() from public;

create or replace function events_keep_order(pause_ms integer default 0, keeper text default null, term bigint default null, lease_ms integer default 0,
  out settled bigint, out history_floor bigint, out epoch integer, out rewound text, out leads boolean)
language plpgsql volatile security definer set search_path = public, pg_temp as $$
declare
  walk constant bigint := 100000;
  s event_log_state%rowtype;
  drawn_before_xid bigint;
  drawn bigint;
  census_from bigint;
  prior record;
  a record;
  b record;
  lowest_bound bigint;
  last_drawn bigint;
  moved_back boolean;
  reached bigint;
begin
  -- Read while this transaction holds no transaction id yet: the clock's value (older-replicas.sql).
  select case when q.is_called then q.last_value else q.last_value - 1 end into drawn_before_xid from events_event_id_seq q;
  -- The settled position is only ever written to disk first: a crash must not hand out again an id it settled.
  if current_setting('synchronous_commit') = 'off' then
    perform set_config('synchronous_commit', 'local', true);
  end if;
  -- The row first: every tick, from any process, reads the census of the one before it, and the sequence after it.
  select * into s from event_log_state for update;
  settled := s.settled;
  history_floor := s.history_floor;
  epoch := s.epoch;
  leads := keeper is null or (s.keeper = keeper and s.keeper_term = term);
  if not leads then
    -- Another replica took the lease: this one publishes nothing.
    return;
  end if;

  -- The ids made safe on this server, and a sequence moved back moved forward again (forks.sql): ids it took
  -- for drawn may have been handed out again, so the census starts over from the settled position (every
  -- writer in flight is bounded by it).
  rewound := events_make_ids_safe();
  if rewound is not null then
    s.census_drawn := null;
  end if;
  -- On the first tick after a fork, the fork recorded.
  census_from := s.settled;
  if pg_sequence_last_value('events_forks') > s.forks then
    rewound := case when events_timeline() is distinct from s.timeline then 'failover' else 'restart' end;
    s.forks := pg_sequence_last_value('events_forks');
    s.epoch := s.epoch + 1;
    s.epoch_base := pg_sequence_last_value('events_fork_from') - 1;
    s.reissued := s.reissued + int8multirange(int8range(s.epoch_base, pg_sequence_last_value('events_fork_to'), '()'));
    -- Every writer in flight drew above the fork's jump, or is refused (its id is below the mark).
    s.census_drawn := null;
    census_from := pg_sequence_last_value('events_fork_to');
  end if;

  select case when q.is_called then q.last_value else q.last_value - 1 end into drawn from events_event_id_seq q;

  -- With no census before (the first tick, after a fork or a rewind): every writer in flight is above census_from.
  select coalesce(s.census_drawn, census_from) as drawn,
    case when s.census_drawn is null then census_from else s.census_mark end as mark,
    case when s.census_drawn is null then '{}'::text[] else s.census_writers end as writers,
    case when s.census_drawn is null then '{}'::bigint[] else s.census_draw_bounds end as draw_bounds,
    case when s.census_drawn is null then '{}'::bigint[] else s.census_late_bounds end as late_bounds
    into prior;
  -- Each read of the sequence must be at or above the one before: below it, the sequence moved back while
  -- this tick ran (a TRUNCATE ... RESTART IDENTITY or a setval committed under it).
  last_drawn := greatest(prior.drawn, drawn);
  -- A prepared transaction may have drawn at any time before (on the old primary, before a crash): with no census
  -- before, it is bounded by the position published while it was counted.
  select * into a from events_census(prior.drawn, prior.mark, prior.writers, prior.draw_bounds, prior.late_bounds,
    case when s.census_drawn is null then s.settled end);
  moved_back := a.drawn < last_drawn;
  if pause_ms > 0 and cardinality(a.writers) > 0 then
    -- Writers in flight, seen by a census that may be old: a census a pause later bounds those that
    -- came since by the sequence's value it read (the others, short, have ended meanwhile).
    perform pg_sleep(pause_ms / 1000.0);
    last_drawn := a.drawn;
    select * into a from events_census(a.drawn, a.mark, a.writers, a.draw_bounds, a.late_bounds);
    moved_back := moved_back or a.drawn < last_drawn;
  end if;
  -- The lowest id a writer in flight may still draw: no writer's own id is at or below it.
  perform setval('events_settle_mark', greatest(a.mark, least(a.drawn, (select min(d) from unnest(a.draw_bounds) d))), true);
  select * into b from events_census(a.drawn, a.mark, a.writers, a.draw_bounds, a.late_bounds);
  moved_back := moved_back or b.drawn < a.drawn;
  if pause_ms > 0 and cardinality(b.writers) > 0 then
    -- The same for the mark: those that come after the census above cannot have seen the mark before it.
    perform pg_sleep(pause_ms / 1000.0);
    last_drawn := b.drawn;
    select * into b from events_census(b.drawn, b.mark, b.writers, b.draw_bounds, b.late_bounds);
    moved_back := moved_back or b.drawn < last_drawn;
  end if;
  if moved_back then
    -- Publish nothing: the next tick finds the sequence below the census stored, and moves it forward.
    return;
  end if;
  select min(least(d, l)) into lowest_bound from unnest(b.draw_bounds, b.late_bounds) u (d, l);
  settled := greatest(s.settled, least(b.mark, b.drawn, lowest_bound));
  -- Over the run of visible ids just above it: nothing to wait for there. (Not events_settled(), which starts
  -- from the history's floor too: the tick publishes what its census found, and the floor stays the floor.)
  if exists (select 1 from events e where e.event_id = settled + 1) then
    select e.event_id into reached from events e
      where e.event_id > settled and e.event_id <= settled + walk
        and not exists (select 1 from events n where n.event_id = e.event_id + 1)
      order by e.event_id limit 1;
    settled := coalesce(reached, settled + walk);
  end if;
  -- The mark raised to it: no writer in flight may insert an id at or below it (the census bounds each above it, the run over it is visible; docs/stream.md, "How the event order is settled").
  if settled > b.mark then
    perform setval('events_settle_mark', settled, true);
  end if;

  update event_log_state set
    settled = events_keep_order.settled, settled_at = clock_timestamp(),
    census_drawn = b.drawn, census_mark = b.mark, census_writers = b.writers,
    census_draw_bounds = b.draw_bounds, census_late_bounds = b.late_bounds,
    waiting_pid = case when lowest_bound < b.drawn then b.waiting_pid end,
    waiting_transaction = case when lowest_bound < b.drawn then b.waiting_transaction end,
    prepared_writers = b.prepared,
    timeline = coalesce(events_timeline(), s.timeline), forks = s.forks,
    epoch = s.epoch, epoch_base = s.epoch_base, reissued = s.reissued,
    keeper_until = case when events_keep_order.keeper is null then event_log_state.keeper_until else clock_timestamp() + lease_ms * interval '1 millisecond' end,
    clock_value = drawn_before_xid, clock_xid = pg_current_xact_id(), clock_at = clock_timestamp()
  returning event_log_state.epoch into epoch;
end
$$;
revoke execute on function events_keep_order(integer, text, bigint, integer) from public;

-- The keeper's lease, to `keeper` with a new term, when it is free, has expired, or is already its own; null when another holds it.
create or replace function events_take_lease(keeper text, lease_ms integer, out term bigint)
language plpgsql volatile security definer set search_path = public, pg_temp as $$
begin
  update event_log_state s set keeper = events_take_lease.keeper, keeper_term = s.keeper_term + 1,
    keeper_until = clock_timestamp() + lease_ms * interval '1 millisecond'
  where s.keeper is null or s.keeper_until < clock_timestamp() or s.keeper = events_take_lease.keeper
  returning s.keeper_term into term;
end
$$;
revoke execute on function events_take_lease(text, integer) from public;

-- Gives the lease up (a keeper that stops): another replica takes it at once.
create or replace function events_release_lease(keeper text, term bigint) returns void
language plpgsql volatile security definer set search_path = public, pg_temp as $$
begin
  update event_log_state s set keeper_until = clock_timestamp() - interval '1 millisecond'
  where s.keeper = events_release_lease.keeper and s.keeper_term = events_release_lease.term;
end
$$;
revoke execute on function events_release_lease(text, bigint) from public;
