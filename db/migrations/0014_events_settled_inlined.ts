import { sql, type Kysely } from 'kysely'

/*
 * Every read of the API reports the settled position of its own snapshot
 * (X-Event-Cursor), by calling events_settled(known) in its statement. On a
 * quiet log that call was most of what the position cost, and the position
 * cost a run detail's statement about 80 µs of the database's time (0.57 ms
 * against 0.50 for the same body without it, measured here):
 *
 * - events_drawn(), the sequence read behind a security definer function,
 *   pays for its fixed search_path at every call: the setting is made and
 *   undone around it, and the schema search path worked out again on both
 *   sides (about 25 µs on its own);
 * - a PL/pgSQL function call runs each of its queries through its own
 *   executor start and end.
 *
 * Now:
 *
 * - events_id_drawn, a view, reads the sequence. A view reads its relations
 *   with its owner's rights, so a read-only role granted the tables (which
 *   grants views too) reads it without a right on the sequence, and without
 *   a security definer function. Null on a hot standby, as events_drawn().
 * - events_settled_row(known), a SQL function of one row, which Postgres
 *   inlines into the calling statement (a set-returning SQL function, stable,
 *   neither strict nor security definer, with no settings: its query joins
 *   the caller's plan). On a quiet log (nothing drawn above the position, no
 *   range reissued) it answers the position from event_log_state and the
 *   view; otherwise it calls events_settled(known), which answers the same in
 *   that case, so the two never differ.
 * - events_settled(known) reads the view in place of events_drawn().
 *
 * events_drawn() stays, unchanged, for replicas of the previous version
 * during a rolling deploy (db/sql/older-replicas.sql).
 */

export async function up (db: Kysely<any>): Promise<void> {
  await sql`
    create view events_id_drawn as
      select case when pg_is_in_recovery() then null when s.is_called then s.last_value else s.last_value - 1 end as drawn
      from events_event_id_seq s`.execute(db)
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
  await sql`
    create function events_settled_row(known bigint) returns table (settled bigint)
    language sql stable as $$
      select case when s.reissued = '{}' and d.drawn <= greatest(known, s.settled, s.history_floor)
        then greatest(known, s.settled, s.history_floor)
        else events_settled(known) end
      from event_log_state s, events_id_drawn d
    $$`.execute(db)
}

export async function down (db: Kysely<any>): Promise<void> {
  await sql`drop function events_settled_row(bigint)`.execute(db)
  // 0013's.
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
  await sql`drop view events_id_drawn`.execute(db)
}
