import { sql, type Kysely } from 'kysely'

/*
 * Least privilege for the functions of the event log and the stream-token
 * key. What a database login without grants could do, and what this
 * migration does instead (db/sql/ states the result; docs/database.md,
 * "Roles and privileges"):
 *
 * - stream_token_key() is security definer and PUBLIC kept EXECUTE, which
 *   Postgres grants on every new function: any login read the key that
 *   signs stream tokens, and forged one that opened every stream. It is
 *   now executable by its owner only (and by whom the owner grants it: the
 *   service's reading role).
 * - events_make_ids_safe() serialized itself with a session advisory lock,
 *   which any login may take first and hold: the first insert after a
 *   failover, and the keeper's tick, then waited on it. It now locks
 *   event_log_state's row, which only the owner may lock, in a block that
 *   is rolled back at its end: the lock is released then, and the
 *   sequences' changes stay (they are never rolled back).
 * - The trigger functions, the keeper's timeline and the functions kept
 *   for older replicas were executable by PUBLIC; a trigger fires
 *   whatever its caller's rights (EXECUTE is checked when the trigger is
 *   made), so none of them needs it.
 * - Every security definer function searched pg_temp first (Postgres does
 *   unless it is named): a caller's temporary table or function could
 *   stand in for ours. Each now searches the migrating schema, then
 *   pg_temp, last.
 */

/** The security definer functions, each of which gets a search_path of the schema and pg_temp last. */
const SECURITY_DEFINER = [
  'events_explicit_id()',
  'events_ids_made_safe()',
  'events_truncating()',
  'events_truncated()',
  'events_census(bigint, bigint, text[], bigint[], bigint[], bigint)',
  'events_keep_order(integer, text, bigint, integer)',
  'events_take_lease(text, integer)',
  'events_release_lease(text, bigint)',
  'events_settle_bound(bigint, text[], bigint[])',
  'events_drawn()',
  'stream_token_key()'
]

/** Functions no longer executable by PUBLIC (besides the keeper's, since 0015). */
const NOT_PUBLIC = [
  'stream_token_key()',
  'events_explicit_id()',
  'events_id_unchanged()',
  'events_ids_made_safe()',
  'events_truncating()',
  'events_truncated()',
  'events_timeline()',
  'events_settle_bound(bigint, text[], bigint[])',
  'events_drawn()'
]

export async function up (db: Kysely<any>): Promise<void> {
  const { rows: [row] } = await sql<{ schema: string }>`select current_schema() as schema`.execute(db)
  const searchPath = sql`set search_path = ${sql.id(row!.schema)}, pg_temp`
  for (const fn of SECURITY_DEFINER) {
    await sql`alter function ${sql.raw(fn)} ${searchPath}`.execute(db)
  }
  for (const fn of NOT_PUBLIC) {
    await sql`revoke execute on function ${sql.raw(fn)} from public`.execute(db)
  }
  await sql`
    create or replace function events_make_ids_safe() returns text
    language plpgsql volatile security definer ${searchPath} as $$
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
    $$`.execute(db)
}

export async function down (db: Kysely<any>): Promise<void> {
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
  for (const fn of NOT_PUBLIC) {
    await sql`grant execute on function ${sql.raw(fn)} to public`.execute(db)
  }
  for (const fn of SECURITY_DEFINER) {
    await sql`alter function ${sql.raw(fn)} set search_path from current`.execute(db)
  }
}
