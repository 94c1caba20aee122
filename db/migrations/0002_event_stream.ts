import { sql, type Kysely } from 'kysely'

/*
 * Makes `event_id` order equal commit order, so that a reader that has seen
 * event N committed can never later see an event below N commit: the event
 * stream's guarantee (CONTRACT section 5) rests on it.
 *
 * Sequence values are drawn before commit, so without this a transaction
 * holding id 41 could commit after the one holding 42, and a reader that
 * had moved its cursor past 42 would skip 41 forever. The BEFORE INSERT
 * trigger takes a transaction-level advisory lock (held to commit or
 * rollback), then keeps the id the column default drew (or the one given
 * explicitly) only if it is above every id committed so far, and otherwise
 * draws a fresh one. Writers of events therefore commit one at a time, in
 * id order: insert events last in a transaction so the lock is held briefly.
 * (Column defaults are evaluated before BEFORE triggers run, which is why
 * the default's value cannot simply be trusted.)
 *
 * The lock key is a constant of this migration: every writer must use the
 * same one, and they do, since the trigger takes it.
 */

export const EVENTS_WRITE_LOCK = 7_061_737_470_931_417_001n

export async function up (db: Kysely<any>): Promise<void> {
  await sql`
    create function events_assign_ordered_id() returns trigger
    language plpgsql as $$
    declare
      id_sequence regclass := pg_get_serial_sequence('events', 'event_id')::regclass;
      committed_max bigint;
    begin
      perform pg_advisory_xact_lock(${sql.lit(EVENTS_WRITE_LOCK.toString())}::bigint);
      if current_setting('transaction_isolation') = 'read committed' then
        -- Every earlier holder of the lock has committed or rolled back, and
        -- this statement's fresh snapshot sees all their ids.
        select coalesce(max(event_id), 0) into committed_max from events;
      end if;
      -- committed_max stays NULL under REPEATABLE READ or SERIALIZABLE, whose
      -- snapshot may predate the last holder's commit: then only a value
      -- drawn now, under the lock, is known to be above every committed id.
      if committed_max is null or new.event_id <= committed_max then
        new.event_id := greatest(nextval(id_sequence), coalesce(committed_max, 0) + 1);
      end if;
      -- An explicit id (a fixture) above the sequence: keep later defaults above it.
      if new.event_id > coalesce(pg_sequence_last_value(id_sequence), 0) then
        perform setval(id_sequence, new.event_id);
      end if;
      return new;
    end
    $$`.execute(db)
  await sql`
    create trigger events_assign_ordered_id
    before insert on events
    for each row execute function events_assign_ordered_id()`.execute(db)

  // The stream's filtered catch-up reads: a run's or a thread's events after a cursor.
  await db.schema.createIndex('events_run_id_event_id_idx').on('events').columns(['run_id', 'event_id']).execute()
  await db.schema.createIndex('events_thread_id_event_id_idx').on('events').columns(['thread_id', 'event_id']).execute()
}

export async function down (db: Kysely<any>): Promise<void> {
  await db.schema.dropIndex('events_thread_id_event_id_idx').execute()
  await db.schema.dropIndex('events_run_id_event_id_idx').execute()
  await sql`drop trigger events_assign_ordered_id on events`.execute(db)
  await sql`drop function events_assign_ordered_id()`.execute(db)
}
