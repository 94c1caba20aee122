-- The event ids: how a writer gets one, and what the events table refuses.
--
-- Every event id comes from one sequence, events_event_id_seq, and the
-- event log can tell from outside a writer's transaction which transactions
-- may still commit an id: those holding the sequence's ROW EXCLUSIVE lock.
-- nextval, setval, currval and pg_sequence_last_value take it, and a
-- transaction keeps it to its end (a rolled-back savepoint does not release
-- it). Writers never wait for each other and take no lock of ours, so ids
-- may commit out of order; the order is settled on the read side
-- (keeper.sql, readers.sql; docs/stream.md, "How the event order is
-- settled"). What the table guarantees, whatever client writes it:
--
-- - An id the inserting transaction drew itself (left to the default, or
--   nextval earlier in the same transaction) is accepted: it is above the
--   settle mark.
-- - An explicit id above the sequence (a fixture on an empty log) is kept,
--   and the sequence is moved past it, so later ids stay above it.
-- - An id at or below the settle mark is refused (check_violation, naming
--   event_id and the constraint events_event_id_drawn_by_its_writer; a
--   serialization_failure to retry when the sequence had been moved back
--   below the mark, which it moves forward again: forks.sql). The
--   event log has settled it, as delivered or as a hole, and streams have
--   moved past it: inserted now, the event would never reach them. Such an
--   id was drawn by another transaction (pooled or hi/lo ids) or left
--   unused by one that rolled back.
-- - An event's id never changes (UPDATE of event_id is refused): streams
--   deliver an event once, under the id it was committed with.
--
-- The settle mark, events_settle_mark, is raised by the keeper at each tick
-- to the lowest id a writer in flight may still draw, so a writer's own ids
-- are always above it, and then to the settled position the tick publishes,
-- if higher (keeper.sql). It is a sequence rather than a column because setval
-- takes effect for every session at once (not at the keeper's commit), is
-- never rolled back, and is read without a snapshot or a row lock: the
-- census that follows a raise knows that every later check sees it. The
-- check runs as the inserting role, hence SELECT on the mark for public
-- (it holds a position, nothing else). The trigger functions are not
-- executable by public: a trigger fires whatever its caller's rights
-- (Postgres checks EXECUTE when the trigger is made); the functions of its
-- WHEN clause and of the default are, since those are checked as the
-- inserting role, and they grant nothing (security invoker).
--
-- The cost on a writer's path. The default is a SQL function that Postgres
-- inlines into the INSERT's plan: a plain nextval. (It names a function so
-- that how an id is drawn can change by replacing the function, without
-- touching the default of the partitioned table and of every partition.)
-- The check is an AFTER INSERT trigger whose WHEN clause is one PL/pgSQL
-- call comparing the row's id with two sequence values; the trigger fires
-- only for the rare rows above the sequence, or at or below the mark. A WHEN
-- clause with both comparisons written out is prepared again at every
-- INSERT statement, and a BEFORE row trigger on a partition makes every
-- row re-check its partition's bounds: both cost a writer more. Checking
-- after the row is in is as sound: it stays invisible until commit.
-- events_id_needs_check reads the sequence first, which takes its lock,
-- then the mark: an insert that passed the check against an older mark
-- already holds the sequence's lock, so the census counts its transaction
-- and bounds it by the mark it could have seen.
--
-- The id sequence keeps CACHE 1, so ids are handed out in increasing order
-- across sessions: a census relies on a writer it has not seen before
-- drawing above the value it read. minvalue 0 lets a sequence nothing has
-- drawn from stand at "called, 0" (as a new database's does), where
-- pg_sequence_last_value() is 0 rather than null, which the WHEN clause
-- could not compare with, and the first id drawn is still 1.
--
-- The events table is partitioned by id range (the keeper makes ranges
-- ahead of the sequence and drops old ones for EVENTS_RETENTION): its row
-- triggers are cloned onto every partition, and its default is copied to
-- each new one.
--
-- The sequence never moves back: what a TRUNCATE, a setval or a failover
-- does to it is forks.sql.
--
-- Not a migration: a change is made by a new migration, then copied here
-- (test/sql-definitions.test.ts fails while the two differ).

create sequence events_event_id_seq as bigint minvalue 0 start 1 cache 1 owned by events.event_id;

create sequence events_settle_mark as bigint minvalue 0 start 0 cache 1;
grant select on sequence events_settle_mark to public;

create or replace function events_next_id() returns bigint
language sql volatile as $$ select nextval('events_event_id_seq') $$;

alter table events alter column event_id set default events_next_id();

-- True for the rows the check must look at: above the sequence, or at or below the mark.
create or replace function events_id_needs_check(event_id bigint) returns boolean
language plpgsql volatile as $$
begin
  return event_id > pg_sequence_last_value('events_event_id_seq') or event_id <= pg_sequence_last_value('events_settle_mark');
end
$$;

create or replace function events_explicit_id() returns trigger
language plpgsql security definer set search_path = public, pg_temp as $$
declare
  mark bigint := pg_sequence_last_value('events_settle_mark');
  drawn bigint := coalesce(pg_sequence_last_value('events_event_id_seq'), 0);
begin
  if new.event_id > drawn then
    perform setval('events_event_id_seq', new.event_id);
  elsif new.event_id <= mark and drawn < mark then
    -- The sequence was moved back below ids the log has settled (forks.sql): forward again, and the writer retries.
    perform events_make_ids_safe();
    raise exception using
      errcode = 'serialization_failure',
      table = 'events', column = 'event_id', constraint = 'events_event_id_drawn_by_its_writer',
      message = format('event_id %s cannot be inserted: events_event_id_seq had been moved back below ids the event log has settled (%s), and has been moved forward again', new.event_id, mark),
      hint = 'Retry the transaction: its ids are drawn above them now. Event ids are never handed out twice; do not move the sequence back.';
  elsif new.event_id <= mark then
    raise exception using
      errcode = 'check_violation',
      table = 'events', column = 'event_id', constraint = 'events_event_id_drawn_by_its_writer',
      message = format('event_id %s cannot be inserted: the event log has settled every id up to %s, and streams have moved past it (or the database failed over or restarted since it was drawn)', new.event_id, mark),
      hint = 'An event''s id must be drawn by the transaction that inserts it: leave event_id out (its default draws one), or use nextval(''events_event_id_seq'') in the same transaction. An id drawn by another transaction, or one a rolled-back transaction left unused, would never reach the streams.';
  end if;
  return null;
end
$$;

revoke execute on function events_explicit_id() from public;

create trigger events_explicit_id
after insert on events
for each row
when (events_id_needs_check(new.event_id))
execute function events_explicit_id();

create or replace function events_id_unchanged() returns trigger
language plpgsql as $$
begin
  raise exception using
    errcode = 'check_violation',
    table = 'events', column = 'event_id', constraint = 'events_event_id_unchanged',
    message = format('event_id %s cannot be changed to %s: streams deliver an event once, under the id it was committed with', old.event_id, new.event_id),
    hint = 'Insert a new event instead.';
end
$$;

revoke execute on function events_id_unchanged() from public;

create trigger events_id_unchanged
before update of event_id on events
for each row
when (old.event_id is distinct from new.event_id)
execute function events_id_unchanged();
