import { sql, type Kysely } from 'kysely'

/*
 * The event log's promise through everyday operations: a failover, a
 * restart, a sequence moved back, a truncation, a keeper that stops. What
 * broke, and what this migration does instead (db/sql/forks.sql and
 * keeper.sql state the result):
 *
 * - A tick read the sequence before it locked event_log_state: two ticks at
 *   once (the partition pass ticked beside the keeper) took the other's
 *   stored census for a sequence moved back, ended every stream and reset
 *   the history's floor to 0, after which expired cursors were served.
 *   Ticks now lock the row first and read the sequence after it. A rewind
 *   is seen by value only (ALTER SEQUENCE ... CACHE 1 gives the sequence a
 *   new file without moving it: no rewind), and the sequence is moved
 *   forward again rather than the log starting over: ids are never handed
 *   out twice, and the floor never goes down. A TRUNCATE raises the floor,
 *   and undoes RESTART IDENTITY.
 * - A failover started an epoch from the last position the new primary had
 *   published, so the events it held above that position were never
 *   delivered, and the events written on it before the keeper reached it
 *   reused ids clients had seen. Now the first INSERT statement on a new
 *   server (or the keeper's first tick there) makes the ids safe before any
 *   row draws: a server on a new timeline, or one that went through
 *   recovery, moves the sequence 2^32 past everything it had handed out,
 *   and the epoch starts there. A crash that lost commits
 *   (synchronous_commit off) is met the same way.
 * - The keeper was whoever held a session advisory lock, which any login
 *   could take, and which a frozen process kept until TCP gave up on it.
 *   It is now a lease in event_log_state, renewed by every tick and taken
 *   over once expired; a tick of a keeper that lost it publishes nothing.
 *   The keeper's functions are no longer executable by public.
 * - A prepared transaction the census does not recognize was given the
 *   lowest bounds of the whole census before; now those of the holders it
 *   can be.
 * - A tick extends the published position over the run of visible ids
 *   above it, so that a replica that starts reads the position the running
 *   ones have; events_settled() takes the most ids it walks.
 *
 * rewind_pending and sequence_file (how a TRUNCATE and an ALTER SEQUENCE
 * were seen) go.
 */

export async function up (db: Kysely<any>): Promise<void> {
  await sql`
    lock table events in share row exclusive mode`.execute(db)
  await sql`
    alter table event_log_state
      add column forks bigint not null default 0,
      add column keeper text,
      add column keeper_term bigint not null default 0,
      add column keeper_until timestamptz,
      drop column rewind_pending,
      drop column sequence_file`.execute(db)
  await sql`
    create unlogged sequence events_ids_safe as bigint minvalue 0 start 0 cache 1`.execute(db)
  await sql`
    create sequence events_forks as bigint minvalue 0 start 1 cache 1`.execute(db)
  await sql`
    create sequence events_fork_from as bigint minvalue 0 start 0 cache 1`.execute(db)
  await sql`
    create sequence events_fork_to as bigint minvalue 0 start 0 cache 1`.execute(db)
  await sql`
    grant select on sequence events_ids_safe, events_forks to public`.execute(db)
  await sql`
    create or replace function events_ids_unsafe() returns boolean
    language plpgsql volatile as $$
    begin
      return pg_sequence_last_value('events_ids_safe') is null;
    end
    $$`.execute(db)
  await sql`
    create or replace function events_make_ids_safe() returns text
    language plpgsql volatile security definer set search_path from current as $$
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
      perform pg_advisory_lock(7061737470931417003);
      begin
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
        perform pg_advisory_unlock(7061737470931417003);
      exception when others then
        perform pg_advisory_unlock(7061737470931417003);
        raise;
      end;
      return moved;
    end
    $$`.execute(db)
  await sql`
    revoke execute on function events_make_ids_safe() from public`.execute(db)
  await sql`
    create or replace function events_ids_made_safe() returns trigger
    language plpgsql security definer set search_path from current as $$
    begin
      perform events_make_ids_safe();
      return null;
    end
    $$`.execute(db)
  await sql`
    create trigger events_ids_safe
    before insert on events
    for each statement
    when (events_ids_unsafe())
    execute function events_ids_made_safe()`.execute(db)
  await sql`
    create or replace function events_truncating() returns trigger
    language plpgsql security definer set search_path from current as $$
    begin
      perform set_config('events.drawn_before_truncate',
        (select (case when q.is_called then q.last_value else q.last_value - 1 end)::text from events_event_id_seq q), true);
      return null;
    end
    $$`.execute(db)
  await sql`
    create or replace function events_truncated() returns trigger
    language plpgsql security definer set search_path from current as $$
    declare
      before_truncate bigint := current_setting('events.drawn_before_truncate')::bigint;
    begin
      if (select case when q.is_called then q.last_value else q.last_value - 1 end from events_event_id_seq q) < before_truncate then
        perform setval('events_event_id_seq', before_truncate, true);
      end if;
      update event_log_state set history_floor = greatest(history_floor, settled), epoch = epoch + 1, epoch_base = settled;
      return null;
    end
    $$`.execute(db)
  await sql`
    create trigger events_truncating
    before truncate on events
    for each statement
    execute function events_truncating()`.execute(db)
  await sql`
    drop trigger events_truncated on events`.execute(db)
  await sql`
    create trigger events_truncated
    after truncate on events
    for each statement
    execute function events_truncated()`.execute(db)
  await sql`
    select setval('events_ids_safe', 1, true)`.execute(db)
  await sql`
    update event_log_state set timeline = coalesce(timeline, events_timeline())`.execute(db)
  await sql`
    create or replace function events_explicit_id() returns trigger
    language plpgsql security definer set search_path from current as $$
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
    $$`.execute(db)
  await sql`
    drop function events_census(bigint, bigint, text[], bigint[], bigint[])`.execute(db)
  await sql`
    create or replace function events_census(
      prior_drawn bigint, prior_mark bigint,
      prior_writers text[] default '{}', prior_draw_bounds bigint[] default '{}', prior_late_bounds bigint[] default '{}',
      prepared_bound bigint default null,
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
    $$`.execute(db)
  await sql`
    revoke execute on function events_census(bigint, bigint, text[], bigint[], bigint[], bigint) from public`.execute(db)
  await sql`
    drop function events_keep_order(bigint, integer)`.execute(db)
  await sql`
    create or replace function events_keep_order(pause_ms integer default 0, keeper text default null, term bigint default null, lease_ms integer default 0,
      out settled bigint, out history_floor bigint, out epoch integer, out rewound text, out leads boolean)
    language plpgsql volatile security definer set search_path from current as $$
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
    $$`.execute(db)
  await sql`
    revoke execute on function events_keep_order(integer, text, bigint, integer) from public`.execute(db)
  await sql`
    create or replace function events_take_lease(keeper text, lease_ms integer, out term bigint)
    language plpgsql volatile security definer set search_path from current as $$
    begin
      update event_log_state s set keeper = events_take_lease.keeper, keeper_term = s.keeper_term + 1,
        keeper_until = clock_timestamp() + lease_ms * interval '1 millisecond'
      where s.keeper is null or s.keeper_until < clock_timestamp() or s.keeper = events_take_lease.keeper
      returning s.keeper_term into term;
    end
    $$`.execute(db)
  await sql`
    revoke execute on function events_take_lease(text, integer) from public`.execute(db)
  await sql`
    create or replace function events_release_lease(keeper text, term bigint) returns void
    language plpgsql volatile security definer set search_path from current as $$
    begin
      update event_log_state s set keeper_until = clock_timestamp() - interval '1 millisecond'
      where s.keeper = events_release_lease.keeper and s.keeper_term = events_release_lease.term;
    end
    $$`.execute(db)
  await sql`
    revoke execute on function events_release_lease(text, bigint) from public`.execute(db)
  await sql`
    drop function events_settled(bigint)`.execute(db)
  await sql`
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
    $$`.execute(db)
}

export async function down (db: Kysely<any>): Promise<void> {
  await sql`
    lock table events in share row exclusive mode`.execute(db)
  await sql`
    drop trigger events_ids_safe on events`.execute(db)
  await sql`
    drop trigger events_truncating on events`.execute(db)
  await sql`
    drop function events_ids_made_safe()`.execute(db)
  await sql`
    drop function events_truncating()`.execute(db)
  await sql`
    drop function events_make_ids_safe()`.execute(db)
  await sql`
    drop function events_ids_unsafe()`.execute(db)
  await sql`
    drop sequence events_ids_safe`.execute(db)
  await sql`
    drop sequence events_forks`.execute(db)
  await sql`
    drop sequence events_fork_from`.execute(db)
  await sql`
    drop sequence events_fork_to`.execute(db)
  await sql`
    drop function events_take_lease(text, integer)`.execute(db)
  await sql`
    drop function events_release_lease(text, bigint)`.execute(db)
  await sql`
    drop function events_keep_order(integer, text, bigint, integer)`.execute(db)
  await sql`
    drop function events_census(bigint, bigint, text[], bigint[], bigint[], bigint)`.execute(db)
  await sql`
    drop function events_settled(bigint, integer)`.execute(db)
  await sql`
    alter table event_log_state
      drop column forks,
      drop column keeper,
      drop column keeper_term,
      drop column keeper_until,
      add column rewind_pending boolean not null default false,
      add column sequence_file oid`.execute(db)
  await sql`
    update event_log_state set sequence_file = (select c.relfilenode from pg_class c where c.oid = 'events_event_id_seq'::regclass)`.execute(db)
  await sql`
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
    $$`.execute(db)
  await sql`
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
    $$`.execute(db)
  await sql`
    create or replace function events_explicit_id() returns trigger
    language plpgsql as $$
    declare
      mark bigint := pg_sequence_last_value('events_settle_mark');
      drawn bigint := coalesce(pg_sequence_last_value('events_event_id_seq'), 0);
    begin
      if new.event_id > drawn then
        perform setval('events_event_id_seq', new.event_id);
      elsif new.event_id <= mark and mark <= drawn then
        raise exception using
          errcode = 'check_violation',
          table = 'events', column = 'event_id', constraint = 'events_event_id_drawn_by_its_writer',
          message = format('event_id %s cannot be inserted: the event log has settled every id up to %s, and streams have moved past it', new.event_id, mark),
          hint = 'An event''s id must be drawn by the transaction that inserts it: leave event_id out (its default draws one), or use nextval(''events_event_id_seq'') in the same transaction. An id drawn by another transaction, or one a rolled-back transaction left unused, would never reach the streams.';
      end if;
      return null;
    end
    $$`.execute(db)
  await sql`
    create or replace function events_truncated() returns trigger
    language plpgsql security definer set search_path from current as $$
    begin
      if not (select s.is_called from events_event_id_seq s) then
        perform setval('events_settle_mark', 0, true);
        update event_log_state set rewind_pending = true;
      end if;
      return null;
    end
    $$`.execute(db)
  await sql`
    create or replace function events_settled(known bigint) returns bigint
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
          where e.event_id > p and e.event_id <= p + 1000000
            and not exists (select 1 from events n where n.event_id = e.event_id + 1)
          order by e.event_id limit 1;
        p := coalesce(reached, p + 1000000);
      end if;
      return coalesce((select lower(r) - 1 from unnest(ranges) r where p <@ r), p);
    end
    $$`.execute(db)
}
