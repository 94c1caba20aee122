import { sql, type Kysely } from 'kysely'

/*
 * events_drawn(): the highest id the events sequence has handed out, for
 * every reader (read with the keeper's state, db/events.ts). A client's
 * cursor above it names no event the log ever had: it is answered 400 at
 * once rather than waited on forever (errors.ts, CursorBeyondError).
 *
 * Security definer, since a read-only role is granted the tables only
 * (docs/operating.md), not the sequence. A plain read of the sequence:
 * pg_sequence_last_value() would take the lock by which the keeper's census
 * counts the event writers in flight (migration 0009), and hold the settled
 * position back for every read. Null on a hot standby: its sequence is as
 * far as it has replayed, and a cursor another server handed out may be
 * above it while still to come (it waits there, as any cursor ahead does;
 * LogState.drawn is then Infinity).
 */

const SEQUENCE = 'events_event_id_seq'

export async function up (db: Kysely<any>): Promise<void> {
  await sql`
    create function events_drawn() returns bigint
    language plpgsql volatile security definer set search_path from current as $$
    begin
      if pg_is_in_recovery() then
        return null;
      end if;
      return (select case when s.is_called then s.last_value else s.last_value - 1 end from ${sql.raw(SEQUENCE)} s);
    end
    $$`.execute(db)
}

export async function down (db: Kysely<any>): Promise<void> {
  await sql`drop function events_drawn()`.execute(db)
}
