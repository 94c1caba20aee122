import { sql, type Kysely } from 'kysely'

/*
 * events_settled() extended the settled position over at most 64 visible
 * ids above it, so a read right after a burst of more (one transaction of
 * 100 events, say) reported a position inside the burst: a Durable Streams
 * catch-up said "up to date" with a third of the events missing, and
 * X-Event-Cursor stopped far below the highest visible id that CONTRACT
 * section 5 promises with ordered commits. Now it walks the contiguous run
 * to its end: the first visible id above the position whose successor is
 * not visible, found by index (one probe per id of the run). The run is
 * what committed since the poller's head or the keeper's last tick, so it
 * is short; a walk is bounded all the same (WALK_LIMIT ids a statement), so
 * that no statement grows with a history that nothing settled, as on a log
 * bulk-loaded while no service ran.
 *
 * It is PL/pgSQL now: a SQL function of several statements is planned
 * again at every call (about 1 ms of the database each, measured here),
 * where PL/pgSQL keeps its plans for the session (0.05 ms). STABLE, so its
 * queries read the calling statement's snapshot: the position is that
 * snapshot's.
 */

/** The most ids one statement walks past its starting position. */
export const WALK_LIMIT = 1_000_000

export async function up (db: Kysely<any>): Promise<void> {
  await sql`
    create or replace function events_settled(known bigint) returns bigint
    language plpgsql stable as $$
    declare
      p bigint;
      ranges int8multirange;
      reached bigint;
    begin
      select greatest(known, s.settled, s.history_floor), s.reissued into p, ranges from event_log_state s;
      if exists (select 1 from events e where e.event_id = p + 1) then
        select e.event_id into reached from events e
          where e.event_id > p and e.event_id <= p + ${sql.lit(WALK_LIMIT)}
            and not exists (select 1 from events n where n.event_id = e.event_id + 1)
          order by e.event_id limit 1;
        p := coalesce(reached, p + ${sql.lit(WALK_LIMIT)});
      end if;
      return coalesce((select lower(r) - 1 from unnest(ranges) r where p <@ r), p);
    end
    $$`.execute(db)
}

export async function down (db: Kysely<any>): Promise<void> {
  // 0009's.
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
