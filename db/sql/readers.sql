-- What a reader asks before it reads events: how far it may read, and
-- whether a client's cursor names an id the log ever had.
--
-- events_id_drawn: the highest id the sequence has handed out, as a view
-- of one row (drawn). A client's cursor above it names no event the log
-- ever had, and is answered 400 at once rather than waited on forever.
-- Null on a hot standby, whose sequence is only as far as it has replayed
-- (a cursor another server handed out may be above it and still to come).
-- It reads the sequence as a relation: pg_sequence_last_value() would take
-- the lock by which the keeper's census counts the writers in flight, and
-- every read would hold the settled position back. A view, because a view
-- reads its relations with its owner's rights: a read-only role granted
-- the tables (views included, docs/operating.md) reads it with no right on
-- the sequence, and no security definer function is called (its fixed
-- search_path is set and undone at every call, which cost a read more than
-- the rest of its position).
--
-- events_settled(known, max_ids): the settled position of the CALLING statement's
-- snapshot. Every id at or below it is visible to that snapshot or will
-- never commit, so a read of the events up to it skips nothing that
-- commits later. It starts from the highest of:
--
-- - `known`, a position settled before the statement began (the poller's
--   head);
-- - the keeper's published position (event_log_state.settled, keeper.sql);
-- - the history's floor (every id at or below it was dropped by retention,
--   or never commits);
--
-- and extends it over the whole run of visible ids just above it: with no
-- hole there is nothing to wait for, so an event that commits with every
-- id below it visible is settled by the next read, however long the run
-- (a burst of thousands of events in one transaction). The walk finds the
-- first visible id whose successor is not visible, by index, one probe per
-- id of the run, and stops after max_ids ids (1,000,000 by default), so
-- that no statement grows with a history nothing settled (a log
-- bulk-loaded while no service ran; a replica that starts walks it in
-- steps of 100,000, events/hub.ts). It looks at the events only when the id sequence has
-- drawn above the position (events_id_drawn): an id visible to the
-- statement's snapshot was drawn, or set for an explicit id, before its
-- transaction committed, so before this read of the sequence; with nothing
-- drawn above, nothing is visible above. A generic plan over the events
-- table locks every partition and its indexes at each call (Postgres 15),
-- so a read on a quiet log takes three relation locks however long the
-- history, not four a partition. On a hot standby (drawn is null there) it
-- always looks. Inside a range of ids reissued after a failover, the
-- answer is the position the range starts at, so a cursor in it answers
-- 410. STABLE, so its queries read the calling statement's snapshot: the
-- position is that snapshot's. PL/pgSQL, so a session keeps its plans (a
-- SQL function of several statements is planned again at every call).
--
-- events_settled_row(known): the same position, as a row that Postgres
-- inlines into the calling statement (a set-returning SQL function, stable,
-- neither strict nor security definer, with no settings, so its query
-- joins the caller's plan and no function is called). On a quiet log
-- (nothing drawn above the position, no range reissued) it answers from
-- event_log_state and events_id_drawn alone, which is where
-- events_settled(known) stops too; otherwise it calls events_settled(known).
-- The two therefore never differ. Every read of the API reports it
-- (X-Event-Cursor, db/settled-position.ts): as a call of the PL/pgSQL
-- function, the position cost a run detail's statement about 80 µs of the
-- database's time; inlined, about 20.
--
-- Not a migration: a change is made by a new migration, then copied here
-- (test/sql-definitions.test.ts fails while the two differ).

create or replace view events_id_drawn as
  select case when pg_is_in_recovery() then null when s.is_called then s.last_value else s.last_value - 1 end as drawn
  from events_event_id_seq s;

create or replace function events_settled(known bigint, max_ids integer default 1000000) returns bigint
language plpgsql stable as $$
declare
  p bigint;
  ranges int8multirange;
  reached bigint;
begin
  select greatest(known, s.settled, s.history_floor), s.reissued into p, ranges from event_log_state s;
  if (select d.drawn from events_id_drawn d) <= p then
    null;
  elsif exists (select 1 from events e where e.event_id = p + 1) then
    select e.event_id into reached from events e
      where e.event_id > p and e.event_id <= p + max_ids
        and not exists (select 1 from events n where n.event_id = e.event_id + 1)
      order by e.event_id limit 1;
    p := coalesce(reached, p + max_ids);
  end if;
  return coalesce((select lower(r) - 1 from unnest(ranges) r where p <@ r), p);
end
$$;

create or replace function events_settled_row(known bigint) returns table (settled bigint)
language sql stable as $$
  select case when s.reissued = '{}' and d.drawn <= greatest(known, s.settled, s.history_floor)
    then greatest(known, s.settled, s.history_floor)
    else events_settled(known) end
  from event_log_state s, events_id_drawn d
$$;
