import { sql, type Kysely } from 'kysely'

/*
 * A settled id is never inserted again. The check on inserts refuses an id
 * at or below the settle mark (db/sql/event-ids.sql), which a tick raised
 * to the lowest id a writer in flight may still draw, before it published
 * its settled position; but the position it published also takes in the
 * run of visible ids above what its census held back, so it could pass the
 * mark (by a tick, or for as long as a transaction holds the sequence's
 * lock). An event in between, delivered by every stream, then deleted and
 * its id drawn again after the sequence was moved back, was accepted and
 * never delivered. Each tick now raises the mark to the position it
 * publishes, in the same transaction (db/sql/keeper.sql states the result
 * and why no writer in flight is refused by it).
 */

/** The security definer functions' search_path since 0017: the schema, then pg_temp, last. */
async function searchPathOf (db: Kysely<any>) {
  const { rows: [row] } = await sql<{ schema: string }>`select current_schema() as schema`.execute(db)
  return sql`set search_path = ${sql.id(row!.schema)}, pg_temp`
}

export async function up (db: Kysely<any>): Promise<void> {
  const searchPath = await searchPathOf(db)
  await sql`
    create or replace function events_keep_order(pause_ms integer default 0, keeper text default null, term bigint default null, lease_ms integer default 0,
      out settled bigint, out history_floor bigint, out epoch integer, out rewound text, out leads boolean)
    language plpgsql volatile security definer ${searchPath} as $$
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
    $$`.execute(db)
}

export async function down (db: Kysely<any>): Promise<void> {
  const searchPath = await searchPathOf(db)
  await sql`
    create or replace function events_keep_order(pause_ms integer default 0, keeper text default null, term bigint default null, lease_ms integer default 0,
      out settled bigint, out history_floor bigint, out epoch integer, out rewound text, out leads boolean)
    language plpgsql volatile security definer ${searchPath} as $$
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
}
