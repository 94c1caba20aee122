-- When the history under the event log changes: a standby promoted, a
-- server that crashed (commits that readers saw may be gone), the
-- sequence moved back, the table truncated. What holds through each: an
-- event id is never handed out twice, and a cursor a client holds is
-- either served exactly as before or answered 410, never served past
-- events it did not get.
--
-- Knowing that commits may be gone: events_ids_safe is an UNLOGGED
-- sequence, set once the ids have been made safe. Postgres resets an
-- unlogged relation to its first state after a crash or an immediate
-- shutdown, and a standby has none of its contents, so it reads "not
-- called" on exactly the servers whose history may have lost commits:
-- one that recovered from a crash, and a standby promoted (a clean
-- restart keeps it: nothing was lost). The first INSERT statement on such
-- a server (the BEFORE STATEMENT trigger events_ids_safe, whose WHEN
-- clause reads it), or the keeper's next tick, whichever comes first,
-- calls events_make_ids_safe() before any of its rows draws an id.
--
-- It forks the ids: the ids above S, the highest event id that survived
-- (or the settled position, if higher), may have been handed out by the
-- history that was lost (the old primary's last commits, the commits a
-- crash lost with synchronous_commit off) and seen by clients. So the
-- sequence moves `jump` ids (2^32) past everything this server has handed
-- out or holds, to J, and the settle mark with it: no id up to J is
-- inserted from then on (a writer that drew one before the fork is
-- refused), so every event the table will ever hold is at or below S or
-- above J, and a cursor in between can only come from the history that
-- was lost. It counts the fork (events_forks) and records (S, J)
-- (events_fork_from, events_fork_to); the keeper's next tick records the
-- range in event_log_state.reissued (a cursor in it answers 410) and
-- starts a new epoch from S (every replica ends the streams past S, and
-- drops its memory of recent events). Every event that survived is at or
-- below S, so a promotion that lost nothing ends no stream. With a
-- prepared transaction on the server (which may commit an event above
-- every visible one) S is the highest id handed out: no cursor is
-- refused, and none skips.
--
-- A sequence moved back (setval, ALTER SEQUENCE ... RESTART) would hand
-- out ids that streams have passed: the first row that draws one at or
-- below the settle mark (its insert then fails with serialization_failure,
-- to be retried) or the keeper's next tick (when it is below the last
-- census) moves it forward again, above every id the keeper has seen drawn
-- and every event the table holds, and says so (the server's log; the
-- keeper's, as an error, when its tick does it). A TRUNCATE removes
-- every event: the history's floor rises to the settled position (cursors
-- below it answer 410), a new epoch from there empties every replica's
-- memory of recent events, and RESTART IDENTITY is undone (the sequence
-- goes on from where it was, read before the truncation).
--
-- The statement trigger costs a writer one PL/pgSQL call per INSERT
-- statement (its WHEN clause; a clause written out would be prepared again
-- at each statement), about 0.6 µs of the server's time. It fires for
-- inserts through events, as writers make them; one straight into a
-- partition, or with triggers off, is not fenced.
--
-- Security definer (its search_path fixed, as keeper.sql says), and not
-- executable by public but through the triggers: whoever may write events
-- may fence the ids, without rights of their own on the sequences or
-- event_log_state. events_make_ids_safe() serializes itself with the lock
-- of event_log_state's row (which the keeper's tick holds too), taken in a
-- block that is rolled back when its work is done: the lock is held only
-- while it runs, the sequences keep their new values (a sequence's change
-- is never rolled back), and no login without rights on the row can take
-- the lock first and hold it (as it could an advisory lock, and stall the
-- first insert after a failover). events_ids_safe and events_forks
-- are readable by public, as the settle mark is: writers' WHEN clause reads
-- the first, and every read of the log both (whether a fork is pending),
-- and they say nothing but that.
--
-- Not a migration: a change is made by a new migration, then copied here
-- (test/sql-definitions.test.ts fails while the two differ).

create unlogged sequence events_ids_safe as bigint minvalue 0 start 0 cache 1;
create sequence events_forks as bigint minvalue 0 start 1 cache 1;
create sequence events_fork_from as bigint minvalue 0 start 0 cache 1;
create sequence events_fork_to as bigint minvalue 0 start 0 cache 1;
grant select on sequence events_ids_safe, events_forks to public;

-- True when the ids must be made safe before a row draws one: on a server that may have lost commits.
create or replace function events_ids_unsafe() returns boolean
language plpgsql volatile as $$
begin
  return pg_sequence_last_value('events_ids_safe') is null;
end
$$;

-- 'sequence' when it moved a sequence moved back forward again; null otherwise.
create or replace function events_make_ids_safe() returns text
language plpgsql volatile security definer set search_path = public, pg_temp as $$
declare
  jump constant bigint := 4294967296;
  s event_log_state%rowtype;
  drawn bigint;
  mark bigint;
  held bigint;
  high bigint;
  moved text;
begin
  select * into s from event_log_state;
  -- Nothing to do, in the common case (every tick asks): no lock taken, no event read.
  if pg_sequence_last_value('events_ids_safe') is not null
    and (select case when q.is_called then q.last_value else q.last_value - 1 end from events_event_id_seq q)
      >= greatest(pg_sequence_last_value('events_settle_mark'), s.census_drawn) then
    return null;
  end if;
  begin
    -- One at a time: the row's lock, released when this block is rolled back below (the sequences keep their values).
    select * into s from event_log_state for update;
    select case when q.is_called then q.last_value else q.last_value - 1 end into drawn from events_event_id_seq q;
    mark := coalesce(pg_sequence_last_value('events_settle_mark'), 0);
    select max(e.event_id) into held from events e;
    high := greatest(drawn, mark, s.census_drawn, s.settled, held);
    if pg_sequence_last_value('events_ids_safe') is null then
      perform setval('events_fork_from', 1 + case when exists (select 1 from pg_prepared_xacts x where x.database = current_database()) then high
        else greatest(s.settled, held) end, true);
      perform setval('events_fork_to', high + jump, true);
      perform setval('events_event_id_seq', high + jump, true);
      perform setval('events_settle_mark', high + jump, true);
      perform nextval('events_forks');
      perform setval('events_ids_safe', 1, true);
    elsif drawn < greatest(mark, s.census_drawn) then
      perform setval('events_event_id_seq', high, true);
      moved := 'sequence';
      raise warning 'events_event_id_seq was moved back to %, below ids the event log has handed out: it goes on from % (event ids are never handed out twice)', drawn, high;
    end if;
    raise sqlstate 'OCPRL';
  exception when sqlstate 'OCPRL' then
    null;
  end;
  return moved;
end
$$;
revoke execute on function events_make_ids_safe() from public;

create or replace function events_ids_made_safe() returns trigger
language plpgsql security definer set search_path = public, pg_temp as $$
begin
  perform events_make_ids_safe();
  return null;
end
$$;

create trigger events_ids_safe
before insert on events
for each statement
when (events_ids_unsafe())
execute function events_ids_made_safe();
revoke execute on function events_ids_made_safe() from public;

-- Before a TRUNCATE: how far the sequence has drawn, which RESTART IDENTITY is about to forget.
create or replace function events_truncating() returns trigger
language plpgsql security definer set search_path = public, pg_temp as $$
begin
  perform set_config('events.drawn_before_truncate',
    (select (case when q.is_called then q.last_value else q.last_value - 1 end)::text from events_event_id_seq q), true);
  return null;
end
$$;
revoke execute on function events_truncating() from public;

create or replace function events_truncated() returns trigger
language plpgsql security definer set search_path = public, pg_temp as $$
declare
  before_truncate bigint := current_setting('events.drawn_before_truncate')::bigint;
begin
  if (select case when q.is_called then q.last_value else q.last_value - 1 end from events_event_id_seq q) < before_truncate then
    perform setval('events_event_id_seq', before_truncate, true);
  end if;
  update event_log_state set history_floor = greatest(history_floor, settled), epoch = epoch + 1, epoch_base = settled;
  return null;
end
$$;
revoke execute on function events_truncated() from public;

create trigger events_truncating
before truncate on events
for each statement
execute function events_truncating();

create trigger events_truncated
after truncate on events
for each statement
execute function events_truncated();
