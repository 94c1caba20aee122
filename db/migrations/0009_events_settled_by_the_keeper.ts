import { sql, type Kysely } from 'kysely'

/*
 * The settled position is worked out in one place, by the replica that
 * keeps the event log, and published in event_log_state, where every
 * reader (on the primary or on a hot standby, starting or running) finds
 * it in the snapshot it reads with. Until now each poller took a census of
 * its own, a hot standby used the clock and a starting replica neither, and
 * the edges of production broke each of them (a replica starting while a
 * writer is open, overlapping transactions on a standby, writers that draw
 * their own ids, a crash, a failover). What a reader may now rely on:
 *
 * - `settled` in event_log_state: every event id at or below it is visible
 *   to any snapshot that sees the row, or will never commit. Readers extend
 *   it over the visible ids just above it (no hole, nothing to wait for).
 *
 * The keeper's tick, events_keep_order(), one statement on the primary:
 *
 * - A census of the writers in flight (events_census): the transactions
 *   holding the sequence's ROW EXCLUSIVE lock, which nextval (and every
 *   other sequence function) takes before it draws and the transaction
 *   holds to its end, savepoints or not. The census is given the one before
 *   it, stored in the row: a holder seen before keeps its bounds; a new one
 *   took the lock after that census read pg_locks, so it draws above that
 *   census's `drawn` and can insert nothing at or below that census's mark
 *   (below). A transaction that drew with nextval before it took a
 *   transaction id is counted like any other: nothing depends on xids any
 *   more, so the default is plain nextval.
 * - The settle mark (the sequence events_settle_mark): an insert may use an
 *   id at or below it only if the inserting transaction drew that id itself.
 *   The AFTER INSERT trigger's WHEN clause compares every row with it, after
 *   the insert holds the sequence's lock, and the insert fails, naming
 *   event_id, when an id was drawn by another transaction or is a hole
 *   reused. So an id the census counts as a hole is never filled later.
 *   The mark is raised to the lowest id a writer in flight may still draw
 *   (D), which is always below any id a writer in flight drew itself.
 * - Then `settled` = the lowest of: the mark in effect when the census read
 *   pg_locks, the sequence, and every holder's bounds. Written in the same
 *   transaction, committed synchronously: a hole is settled only once the
 *   sequence's record of it is on disk, so a crash never hands it out again.
 *
 * A tick runs censuses before and after the raise of the mark, so that the
 * holders they find new are bounded by fresh values. A hole (an id rolled
 * back) is settled by the first tick after its writer ended when no other
 * writer is in flight, else by the second; or by the first when the tick
 * pauses (`pause_ms`) before each of its later censuses, long enough for
 * the short writers of the census before to end (the keeper pauses when a
 * reader waits on a hole).
 *
 * Failover and rewinds. The tick records the WAL timeline. On a new one (a
 * standby promoted; it may have lost the old primary's last commits, and
 * with them ids that clients saw), every id above the last settled position
 * it has may be handed out again: the tick moves the sequence far past it
 * (by `jump`), records the range in between in `reissued` (a cursor in it
 * answers 410 cursor_expired) and starts a new `epoch`, on which every
 * replica ends its streams above `epoch_base` and reads on from there. A
 * sequence moved backwards (TRUNCATE ... RESTART IDENTITY, setval) starts a
 * new epoch from 0 without a jump (the operator chose the ids).
 *
 * The clock columns (clock_value, clock_xid, clock_at) are still written, for
 * replicas of an older version during a rolling deploy; nothing here reads
 * them. events_settle_bound() stays for the same reason.
 */

const SEQUENCE = 'events_event_id_seq'
const MARK = 'events_settle_mark'

/** The distance the sequence jumps after a failover: past any ids an old primary could have handed out that the new one lost. */
export const FAILOVER_JUMP = 2 ** 32

export async function up (db: Kysely<any>): Promise<void> {
  // Inserts wait for this: no id is drawn or checked while the rules change.
  await sql`lock table events in share row exclusive mode`.execute(db)

  await sql`create sequence ${sql.raw(MARK)} minvalue 0 start 0`.execute(db)
  await sql`grant select on sequence ${sql.raw(MARK)} to public`.execute(db)

  await sql`
    alter table event_log_state
      add column settled bigint not null default 0,
      add column settled_at timestamptz not null default now(),
      add column census_drawn bigint,
      add column census_mark bigint not null default 0,
      add column census_writers text[] not null default '{}',
      add column census_draw_bounds bigint[] not null default '{}',
      add column census_late_bounds bigint[] not null default '{}',
      add column waiting_pid integer,
      add column waiting_transaction text,
      add column prepared_writers integer not null default 0,
      add column timeline bigint,
      add column epoch integer not null default 0,
      add column epoch_base bigint not null default 0,
      add column reissued int8multirange not null default '{}',
      add column rewind_pending boolean not null default false,
      add column sequence_file oid`.execute(db)
  // The position readers had (0008's rule, for the writers it knew), as the first settled one and the first mark.
  await sql`update event_log_state set settled = events_settled(0)`.execute(db)
  await sql`select setval(${MARK}, settled, true) from event_log_state`.execute(db)

  await sql`
    create or replace function events_next_id() returns bigint
    language sql volatile as $$ select nextval('${sql.raw(SEQUENCE)}') $$`.execute(db)

  await sql`
    create or replace function events_explicit_id() returns trigger
    language plpgsql as $$
    declare
      mark bigint := pg_sequence_last_value('${sql.raw(MARK)}');
      drawn bigint := coalesce(pg_sequence_last_value('${sql.raw(SEQUENCE)}'), 0);
    begin
      if new.event_id > drawn then
        perform setval('${sql.raw(SEQUENCE)}', new.event_id);
      elsif new.event_id <= mark and mark <= drawn then
        raise exception using
          errcode = 'check_violation',
          table = 'events', column = 'event_id', constraint = 'events_event_id_drawn_by_its_writer',
          message = format('event_id %s cannot be inserted: the event log has settled every id up to %s, and streams have moved past it', new.event_id, mark),
          hint = 'An event''s id must be drawn by the transaction that inserts it: leave event_id out (its default draws one), or use nextval(''${sql.raw(SEQUENCE)}'') in the same transaction. An id drawn by another transaction, or one a rolled-back transaction left unused, would never reach the streams.';
      end if;
      return null;
    end
    $$`.execute(db)
  // Evaluated for every row, so the cheapest form: one plpgsql call costs a
  // writer less than a WHEN clause with both comparisons, which Postgres
  // prepares again at every INSERT statement (BENCHMARKS.md). The sequence
  // first (its lock, before the mark is read), then the mark.
  await sql`
    create function events_id_needs_check(event_id bigint) returns boolean
    language plpgsql volatile as $$
    begin
      return event_id > pg_sequence_last_value('${sql.raw(SEQUENCE)}') or event_id <= pg_sequence_last_value('${sql.raw(MARK)}');
    end
    $$`.execute(db)
  await sql`drop trigger events_explicit_id on events`.execute(db)
  await sql`
    create trigger events_explicit_id
    after insert on events
    for each row
    when (events_id_needs_check(new.event_id))
    execute function events_explicit_id()`.execute(db)

  // TRUNCATE ... RESTART IDENTITY moves the sequence back (to not called): the
  // ids it hands out again must not be refused as late, and the keeper starts a
  // new epoch at its next tick, told so in the same transaction (a tick may
  // not see the sequence's value before the restart). Security definer:
  // whoever may truncate, may do this.
  await sql`
    create function events_truncated() returns trigger
    language plpgsql security definer set search_path from current as $$
    begin
      if not (select s.is_called from ${sql.raw(SEQUENCE)} s) then
        perform setval('${sql.raw(MARK)}', 0, true);
        update event_log_state set rewind_pending = true;
      end if;
      return null;
    end
    $$`.execute(db)
  await sql`
    create trigger events_truncated
    after truncate on events
    for each statement
    execute function events_truncated()`.execute(db)

  await sql`
    create function events_id_unchanged() returns trigger
    language plpgsql as $$
    begin
      raise exception using
        errcode = 'check_violation',
        table = 'events', column = 'event_id', constraint = 'events_event_id_unchanged',
        message = format('event_id %s cannot be changed to %s: streams deliver an event once, under the id it was committed with', old.event_id, new.event_id),
        hint = 'Insert a new event instead.';
    end
    $$`.execute(db)
  await sql`
    create trigger events_id_unchanged
    before update of event_id on events
    for each row
    when (old.event_id is distinct from new.event_id)
    execute function events_id_unchanged()`.execute(db)

  // The primary's WAL timeline (a standby promoted starts a new one); null on a
  // standby, and where the server does not say (a managed service may refuse
  // the WAL functions): failovers then go unnoticed, as before this migration.
  await sql`
    create function events_timeline() returns bigint
    language plpgsql volatile as $$
    begin
      if pg_is_in_recovery() then
        return null;
      end if;
      return ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint;
    exception when others then
      return null;
    end
    $$`.execute(db)

  await sql`
    create function events_census(
      prior_drawn bigint, prior_mark bigint,
      prior_writers text[] default '{}', prior_draw_bounds bigint[] default '{}', prior_late_bounds bigint[] default '{}',
      out drawn bigint, out mark bigint, out writers text[], out draw_bounds bigint[], out late_bounds bigint[],
      out waiting_pid integer, out waiting_transaction text, out prepared integer)
    language plpgsql volatile security definer set search_path from current as $$
    begin
      -- The mark, the sequence, then pg_locks: the order is what makes it sound.
      select m.last_value into mark from ${sql.raw(MARK)} m;
      select case when s.is_called then s.last_value else s.last_value - 1 end into drawn from ${sql.raw(SEQUENCE)} s;
      with locks as (
        select l.virtualtransaction as vxid, l.pid, l.locktype, l.transactionid
        from pg_locks l
        where l.granted and (
          (l.locktype = 'relation' and l.mode = 'RowExclusiveLock' and l.relation = '${sql.raw(SEQUENCE)}'::regclass
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
    create function events_keep_order(jump bigint default ${sql.lit(FAILOVER_JUMP)}, pause_ms integer default 0,
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
      select case when q.is_called then q.last_value else q.last_value - 1 end into drawn_before_xid from ${sql.raw(SEQUENCE)} q;
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
        perform setval('${sql.raw(SEQUENCE)}', upper(s.reissued) - 1)
          where (select case when q.is_called then q.last_value else q.last_value - 1 end from ${sql.raw(SEQUENCE)} q) < upper(s.reissued) - 1;
        s.census_drawn := null;
      elsif s.rewind_pending
        or s.sequence_file <> (select c.relfilenode from pg_class c where c.oid = '${sql.raw(SEQUENCE)}'::regclass)
        or (s.census_drawn is not null and drawn_before_xid < s.census_drawn) then
        -- The sequence was moved back (TRUNCATE ... RESTART IDENTITY and ALTER SEQUENCE ... RESTART
        -- give it a new file; setval is seen by its value): its ids will be handed out again.
        rewound := 'sequence';
        s.epoch := s.epoch + 1;
        s.epoch_base := 0;
        s.settled := 0;
        s.history_floor := 0;
        s.census_drawn := null;
        perform setval('${sql.raw(MARK)}', 0, true);
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
      perform setval('${sql.raw(MARK)}', greatest(a.mark, least(a.drawn, (select min(d) from unnest(a.draw_bounds) d))), true);
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
        sequence_file = (select c.relfilenode from pg_class c where c.oid = '${sql.raw(SEQUENCE)}'::regclass),
        history_floor = s.history_floor,
        clock_value = drawn_before_xid, clock_xid = pg_current_xact_id(), clock_at = clock_timestamp()
      returning event_log_state.history_floor, event_log_state.epoch into history_floor, epoch;
    end
    $$`.execute(db)

  // The settled position of the CALLING statement's snapshot (a stable function
  // runs in it): `known` (a position settled before the statement began), the
  // keeper's, or the history's floor, extended over the ids just above it that
  // are all visible. Inside a range of ids reissued after a failover, the
  // position the range starts at: a cursor inside it answers 410.
  await sql`
    create or replace function events_settled(known bigint) returns bigint
    language sql stable as $$
      with start as (
        select greatest(known, s.settled, s.history_floor) as p, s.reissued from event_log_state s
      ), ahead as (
        select a.event_id, row_number() over (order by a.event_id) as n
        from (select e.event_id from events e where e.event_id > (select p from start) order by e.event_id limit 64) a
      ), reached as (
        select greatest(start.p, coalesce(max(ahead.event_id) filter (where ahead.event_id = start.p + ahead.n), 0)) as p, start.reissued
        from start left join ahead on true
        group by start.p, start.reissued
      )
      select coalesce((select lower(r) - 1 from unnest(reached.reissued) r where reached.p <@ r), reached.p) from reached
    $$`.execute(db)
}

export async function down (db: Kysely<any>): Promise<void> {
  await sql`lock table events in share row exclusive mode`.execute(db)
  // 0006's events_settled, 0008's default and trigger.
  await sql`
    create or replace function events_settled(known bigint) returns bigint
    language sql stable as $$
      with start as (
        select greatest(known,
          coalesce((select s.clock_value from event_log_state s
            where s.clock_xid <= pg_snapshot_xmin(pg_current_snapshot())), 0),
          coalesce((select s.history_floor from event_log_state s), 0)) as p
      ), ahead as (
        select a.event_id, row_number() over (order by a.event_id) as n
        from (select e.event_id from events e where e.event_id > (select p from start) order by e.event_id limit 64) a
      )
      select greatest(start.p, coalesce(max(ahead.event_id) filter (where ahead.event_id = start.p + ahead.n), 0))
      from start left join ahead on true
      group by start.p
    $$`.execute(db)
  await sql`drop function events_keep_order(bigint, integer)`.execute(db)
  await sql`drop function events_timeline()`.execute(db)
  await sql`drop function events_census(bigint, bigint, text[], bigint[], bigint[])`.execute(db)
  await sql`drop trigger events_id_unchanged on events`.execute(db)
  await sql`drop function events_id_unchanged()`.execute(db)
  await sql`drop trigger events_truncated on events`.execute(db)
  await sql`drop function events_truncated()`.execute(db)
  await sql`drop trigger events_explicit_id on events`.execute(db)
  await sql`drop function events_id_needs_check(bigint)`.execute(db)
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
  await sql`
    create trigger events_explicit_id
    after insert on events
    for each row
    when (new.event_id > pg_sequence_last_value('${sql.raw(SEQUENCE)}'::regclass))
    execute function events_explicit_id()`.execute(db)
  await sql`
    create or replace function events_next_id() returns bigint
    language sql volatile as $$
      select case when pg_current_xact_id() is null then null else nextval('${sql.raw(SEQUENCE)}') end
    $$`.execute(db)
  await sql`
    alter table event_log_state
      drop column settled, drop column settled_at, drop column census_drawn, drop column census_mark,
      drop column census_writers, drop column census_draw_bounds, drop column census_late_bounds,
      drop column waiting_pid, drop column waiting_transaction, drop column prepared_writers,
      drop column timeline, drop column epoch, drop column epoch_base, drop column reissued,
      drop column rewind_pending, drop column sequence_file`.execute(db)
  await sql`drop sequence ${sql.raw(MARK)}`.execute(db)
}
