import { sql, type Kysely } from 'kysely'
import { settledFromFloor } from './0004_events_partitioned_by_id.ts'

/*
 * events_settled() read the ids just above its starting position with the
 * position joined in from a CTE: Postgres planned that as a walk of the
 * whole primary key in order, filtering out every id at or below the
 * position (a cost growing with the log), on every read that sends
 * X-Event-Cursor. Here the position is a scalar subquery, evaluated once
 * before the scan, so each partition's index scan starts at it: 64 ids at
 * most, whatever the size of the log (the figures: BENCHMARKS.md,
 * "events_settled bounded by its index").
 *
 * The function is stated whole, a copy of 0004's but for that one line: a
 * migration fixes what it installs, and 0004's text stays as it was for the
 * way down.
 */

export async function up (db: Kysely<any>): Promise<void> {
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
}

export async function down (db: Kysely<any>): Promise<void> {
  await settledFromFloor.execute(db)
}
