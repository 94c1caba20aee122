import { sql, type Kysely } from 'kysely'

/*
 * events_settled() looked for a visible id just above its position in the
 * partitioned events table at every call. Its plans are generic (PL/pgSQL
 * keeps them), and on Postgres 15 a generic plan locks every partition of
 * the table, and their indexes, before it prunes them: a read's transaction
 * took about four relation locks a partition (809 with 203 partitions, one
 * a day of a log kept without a retention), past the 16 a backend holds on
 * its fast path, and the call's cost grew with the history (8,500 calls a
 * second with 203 partitions against 25,800 with 3, measured here).
 *
 * Now it first reads how far the id sequence has drawn (events_drawn(),
 * migration 0011: the sequence read as a relation, one lock, no census).
 * An id visible to the statement's snapshot was drawn (or set, for an
 * explicit id) before its transaction committed, so before that snapshot,
 * so before this later read: with nothing drawn above the position there is
 * nothing visible above it, and the events table is not touched. Past that
 * (ids drawn above the position: writers at work), it looks and walks as
 * before. The answer can only be lower than the walk's, never higher, so
 * a case the reasoning misses (a sequence moved back) costs freshness, not
 * an event. On a hot standby events_drawn() is null, and it looks as before.
 */

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
      if events_drawn() <= p then
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

export async function down (db: Kysely<any>): Promise<void> {
  // 0010's.
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
          where e.event_id > p and e.event_id <= p + 1000000
            and not exists (select 1 from events n where n.event_id = e.event_id + 1)
          order by e.event_id limit 1;
        p := coalesce(reached, p + 1000000);
      end if;
      return coalesce((select lower(r) - 1 from unnest(ranges) r where p <@ r), p);
    end
    $$`.execute(db)
}
