-- The keeper: the one statement that works out how far the event log is
-- settled, and publishes it for every reader.
--
-- What it guarantees. event_log_state.settled is the settled position:
-- every event id at or below it is visible to any snapshot that sees the
-- row, or will never commit. Readers (readers.sql) read it in the same
-- statement as the events, on the primary or on a hot standby, starting or
-- running, and never go past it (beyond the visible ids just above it). So
-- no reader moves past an id that commits later, though writers commit ids
-- out of order and nothing makes them wait.
--
-- Who runs it. One replica at a time, on the primary: the one holding the
-- event log's upkeep lock (a session advisory lock, events/upkeep/) calls
-- events_keep_order() every EVENTS_CLOCK_INTERVAL_MS, and within about
-- 10 ms when a reader waits on a hole (an id drawn and not visible).
--
-- The census (events_census): who may still commit an id. The writers in
-- flight are the transactions holding the id sequence's ROW EXCLUSIVE lock
-- (event-ids.sql). Postgres does not record which ids each one drew, so a
-- census is given the one before it (kept in event_log_state):
--
-- - a holder seen then keeps its bounds;
-- - a holder not seen then took the lock after that census read pg_locks,
--   so it draws above that census's sequence value (its draw bound), and
--   its inserts were checked against that census's mark or a later one
--   (its late bound: the lowest id it may insert without having drawn it);
-- - a prepared transaction not recognized (it may have drawn before it took
--   the transaction id it was prepared under) gets the lowest bounds of the
--   census before.
--
-- A holder is recorded as 'virtual id:transaction id' and recognized by
-- either: a writer may take its transaction id after a census, and PREPARE
-- TRANSACTION gives it another virtual id. Nothing depends on transaction
-- ids otherwise: a writer that drew before it took one is counted like any
-- other. The census reads the mark, then the sequence, then pg_locks: that
-- order is what makes it sound. It reads the sequences as relations, never
-- with pg_sequence_last_value(), which would take the very lock it counts.
--
-- A tick (events_keep_order), one statement, one transaction:
--
-- 1. A census; the settle mark raised to the lowest id a writer in flight
--    may still draw (no writer's own id is at or below it); a census again,
--    so that the holders it finds new are bounded by fresh values.
-- 2. settled := the lowest of the mark in effect when that census read
--    pg_locks, the sequence's value, and every holder's bounds; never lower
--    than before.
-- 3. The row written and committed synchronously, even where
--    synchronous_commit is off: a hole is published as settled only once
--    the sequence's record of it is on disk, so a crash never hands it out
--    again.
--
-- A hole is settled by the first tick after its writer ended when no other
-- writer is in flight, else by the second; or by the first when the tick
-- pauses (pause_ms) before each of its later censuses, long enough for the
-- short writers of the census before to end (the keeper pauses when a
-- reader waits on a hole).
--
-- Failover and rewinds. The tick records the WAL timeline
-- (events_timeline(), which every reader also reads, to notice a new one
-- before the keeper has: null on a standby, and where the server refuses
-- the WAL functions, as some managed services do; failovers then go
-- unnoticed). On a new timeline (a standby promoted: it may have lost the
-- old primary's last commits, and with them ids that clients saw), any id
-- above the last position it had settled may be handed out again: the tick
-- moves the sequence `jump` ids (2^32) past it, records the range in
-- between in `reissued` (a cursor inside it answers 410 cursor_expired),
-- and starts a new `epoch`, on which every replica ends its streams above
-- `epoch_base` and reads on from there. A sequence moved back (TRUNCATE ...
-- RESTART IDENTITY or ALTER SEQUENCE ... RESTART, which give it a new file;
-- a setval, seen by its value) starts a new epoch from 0, without a jump:
-- the operator chose the ids. If the sequence moves back while a tick runs,
-- the tick publishes nothing, and the next one starts the epoch.
--
-- The clock columns (clock_value, clock_xid, clock_at) are still written,
-- for replicas of an older version during a rolling deploy
-- (older-replicas.sql); nothing here reads them.
--
-- Security definer: a tick reads the sequences and pg_prepared_xacts and
-- writes the mark and event_log_state whatever role calls it. Like every
-- security definer function here, it keeps the search_path in effect when
-- it was made ("set search_path from current": the migrating session's,
-- "$user", public on a server with the default setting), so a caller's own
-- search_path cannot point it at other objects.
--
-- Not a migration: a change is made by a new migration, then copied here
-- (test/sql-definitions.test.ts fails while the two differ).

create or replace function events_census(
  prior_drawn bigint, prior_mark bigint,
  prior_writers text[] default '{}', prior_draw_bounds bigint[] default '{}', prior_late_bounds bigint[] default '{}',
  out drawn bigint, out mark bigint, out writers text[], out draw_bounds bigint[], out late_bounds bigint[],
  out waiting_pid integer, out waiting_transaction text, out prepared integer)
language plpgsql volatile security definer set search_path from current as $$
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
  ), census as (
    -- Recorded as 'virtual id:transaction id', recognized by either: a writer may
    -- take its transaction id after a census. One not seen before took the lock
    -- after that census read pg_locks. A prepared transaction not recognized
    -- (it may have drawn before it took the id it was prepared under) gets the
    -- lowest bounds of the prior census.
    select h.vxid || ':' || coalesce(h.xid, '') as writer, h.pid, h.xid,
      coalesce(p.draw_bound, case when h.pid is null then least(prior_drawn, (select min(b) from unnest(prior_draw_bounds) b)) else prior_drawn end) as draw_bound,
      coalesce(p.late_bound, case when h.pid is null then least(prior_mark, (select min(b) from unnest(prior_late_bounds) b)) else prior_mark end) as late_bound
    from holders h left join lateral (
      select min(p.draw_bound) as draw_bound, min(p.late_bound) as late_bound
      from unnest(prior_writers, prior_draw_bounds, prior_late_bounds) p (writer, draw_bound, late_bound)
      where split_part(p.writer, ':', 1) = h.vxid or (h.xid is not null and split_part(p.writer, ':', 2) = h.xid)
    ) p on true
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

create or replace function events_keep_order(jump bigint default 4294967296, pause_ms integer default 0,
  out settled bigint, out history_floor bigint, out epoch integer, out rewound text)
language plpgsql volatile security definer set search_path from current as $$
declare
  s event_log_state%rowtype;
  drawn_before_xid bigint;
  current_timeline bigint;
  prior record;
  a record;
  b record;
  lowest_bound bigint;
  last_drawn bigint;
  moved_back boolean;
begin
  -- Read while this transaction holds no transaction id yet: the clock's value.
  select case when q.is_called then q.last_value else q.last_value - 1 end into drawn_before_xid from events_event_id_seq q;
  -- The settled position is only ever written to disk first: a crash must not hand out again an id it settled.
  if current_setting('synchronous_commit') = 'off' then
    perform set_config('synchronous_commit', 'local', true);
  end if;
  select * into s from event_log_state for update;
  current_timeline := events_timeline();

  if current_timeline is not null and s.timeline is not null and current_timeline <> s.timeline then
    -- A standby promoted: ids above the last position it had settled may have been handed out by the old primary.
    rewound := 'failover';
    s.epoch := s.epoch + 1;
    s.epoch_base := s.settled;
    s.reissued := s.reissued + int8multirange(int8range(s.settled, greatest(drawn_before_xid, s.census_drawn, s.settled) + jump, '(]'));
    perform setval('events_event_id_seq', upper(s.reissued) - 1)
      where (select case when q.is_called then q.last_value else q.last_value - 1 end from events_event_id_seq q) < upper(s.reissued) - 1;
    s.census_drawn := null;
  elsif s.rewind_pending
    or s.sequence_file <> (select c.relfilenode from pg_class c where c.oid = 'events_event_id_seq'::regclass)
    or (s.census_drawn is not null and drawn_before_xid < s.census_drawn) then
    -- The sequence was moved back (TRUNCATE ... RESTART IDENTITY and ALTER SEQUENCE ... RESTART
    -- give it a new file; setval is seen by its value): its ids will be handed out again.
    rewound := 'sequence';
    s.epoch := s.epoch + 1;
    s.epoch_base := 0;
    s.settled := 0;
    s.history_floor := 0;
    s.census_drawn := null;
    perform setval('events_settle_mark', 0, true);
  end if;

  -- With no census before (the first tick, or a new epoch): every writer in flight is above the settled position.
  select coalesce(s.census_drawn, s.settled) as drawn,
    case when s.census_drawn is null then s.settled else s.census_mark end as mark,
    case when s.census_drawn is null then '{}'::text[] else s.census_writers end as writers,
    case when s.census_drawn is null then '{}'::bigint[] else s.census_draw_bounds end as draw_bounds,
    case when s.census_drawn is null then '{}'::bigint[] else s.census_late_bounds end as late_bounds
    into prior;
  -- Each read of the sequence must be at or above the one before: below it, the sequence moved back while
  -- this tick ran (a TRUNCATE ... RESTART IDENTITY committed under it).
  last_drawn := greatest(prior.drawn, drawn_before_xid);
  select * into a from events_census(prior.drawn, prior.mark, prior.writers, prior.draw_bounds, prior.late_bounds);
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
    -- Publish nothing: the next tick finds the sequence below the census stored, and starts the epoch.
    settled := s.settled;
    history_floor := s.history_floor;
    epoch := s.epoch;
    return;
  end if;
  select min(least(d, l)) into lowest_bound from unnest(b.draw_bounds, b.late_bounds) u (d, l);
  settled := greatest(s.settled, least(b.mark, b.drawn, lowest_bound));

  update event_log_state set
    settled = events_keep_order.settled, settled_at = clock_timestamp(),
    census_drawn = b.drawn, census_mark = b.mark, census_writers = b.writers,
    census_draw_bounds = b.draw_bounds, census_late_bounds = b.late_bounds,
    waiting_pid = case when lowest_bound < b.drawn then b.waiting_pid end,
    waiting_transaction = case when lowest_bound < b.drawn then b.waiting_transaction end,
    prepared_writers = b.prepared,
    timeline = coalesce(current_timeline, s.timeline),
    epoch = s.epoch, epoch_base = s.epoch_base, reissued = s.reissued, rewind_pending = false,
    sequence_file = (select c.relfilenode from pg_class c where c.oid = 'events_event_id_seq'::regclass),
    history_floor = s.history_floor,
    clock_value = drawn_before_xid, clock_xid = pg_current_xact_id(), clock_at = clock_timestamp()
  returning event_log_state.history_floor, event_log_state.epoch into history_floor, epoch;
end
$$;
