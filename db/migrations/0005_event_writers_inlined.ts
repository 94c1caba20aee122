import { sql, type Kysely } from 'kysely'
import { createWriterRegistration, REGISTRATION_NAMESPACE } from './0003_event_order_without_lock.ts'

/*
 * The same writer registration as migration 0003 (docs/stream.md, "How the event
 * order is settled"), at a fraction of its cost on the orchestrator's write
 * path. Measured with callgrind on Postgres 15 (instructions per
 * transaction of bench/writers.ts's "update a task, insert its event"),
 * this path costs less than half of what 0003's added to the bare schema
 * (the figures: BENCHMARKS.md, "Results after migration 0005"). Where the
 * cost went:
 *
 * - The column default was a plpgsql function. It is now a SQL function
 *   that Postgres inlines into the INSERT's plan: no function call per row.
 *   A CASE evaluates its conditions in order, so the registration still
 *   happens before the id is drawn: the transaction id first, then the
 *   shared advisory lock keyed by the sequence's value (lb), then nextval.
 * - 0003 remembered "this transaction is registered" in a transaction-local
 *   setting, set at every registration. On Postgres 15, any setting changed
 *   in a transaction makes its commit walk every setting (about 14,000
 *   instructions). So the marker is now set at one registration in
 *   MARKER_ONE_IN, at random: a one-event transaction almost never pays it,
 *   and a transaction of many events takes a few more (shared, never
 *   conflicting) locks before its marker is set, a few dozen at worst in
 *   practice rather than one per event. A registration taken twice is
 *   harmless: the census uses the lowest lb a transaction holds.
 * - The trigger for explicit ids ahead of the sequence (fixtures) was a
 *   BEFORE trigger with a WHEN clause. Postgres parses and prepares a WHEN
 *   clause at every INSERT statement, fired or not, and a BEFORE row
 *   trigger on a partition also makes every row re-check its partition's
 *   bounds. It is now an AFTER trigger with the shortest WHEN clause that
 *   says "ahead of the sequence". Registering after the row is inserted
 *   (but before the sequence moves past it, and before commit) is as sound:
 *   a reader that sees the moved sequence sees the registration too, and
 *   the row stays invisible until commit. The insert already gave the
 *   transaction its id, which the clock's argument needs.
 *
 * The WHEN clause compares with pg_sequence_last_value(), which is null
 * until the sequence's first nextval. A sequence never drawn from is set
 * here to "called, at the value before its next", so that the first id is
 * still the one it would have been (1 on a new database); inserts wait for
 * this statement so that none draws in between.
 */

const SEQUENCE = 'events_event_id_seq'
/** One registration in MARKER_ONE_IN also sets the transaction's marker (see above). */
const MARKER_ONE_IN = 16

/** The test of the transaction's marker: it has registered. */
const MARKED = "current_setting('ocp.events_writer', true) = 'on'"
/**
 * The CASE branches that register the calling transaction: none of them is
 * ever chosen (each tests a result that is never null), so the CASE goes on
 * to its ELSE, after the transaction id, the lock and maybe the marker.
 */
const REGISTRATION_BRANCHES = `
      when pg_current_xact_id() is null then null
      when pg_advisory_xact_lock_shared((${REGISTRATION_NAMESPACE}::bigint << 52) + coalesce(pg_sequence_last_value('${SEQUENCE}'), 0)) is null then null
      when random() < ${1 / MARKER_ONE_IN} and set_config('ocp.events_writer', 'on', true) is null then null`

export async function up (db: Kysely<any>): Promise<void> {
  await sql`lock table events in share row exclusive mode`.execute(db)
  await sql`alter sequence ${sql.table(SEQUENCE)} minvalue 0`.execute(db)
  await sql`select setval(${SEQUENCE}, last_value - 1, true) from ${sql.table(SEQUENCE)} where not is_called`.execute(db)

  await sql`
    create or replace function events_register_writer() returns void
    language sql volatile as $$
      select case when ${sql.raw(MARKED)} then null ${sql.raw(REGISTRATION_BRANCHES)} else null end
    $$`.execute(db)

  await sql`
    create or replace function events_next_id() returns bigint
    language sql volatile as $$
      select case
        when ${sql.raw(MARKED)} then nextval('${sql.raw(SEQUENCE)}')
        ${sql.raw(REGISTRATION_BRANCHES)}
        else nextval('${sql.raw(SEQUENCE)}')
      end
    $$`.execute(db)

  await sql`
    create or replace function events_explicit_id() returns trigger
    language plpgsql as $$
    begin
      perform events_register_writer();
      if new.event_id > coalesce(pg_sequence_last_value('${sql.raw(SEQUENCE)}'), 0) then
        perform setval('${sql.raw(SEQUENCE)}', new.event_id);
      end if;
      return null;
    end
    $$`.execute(db)
  await sql`drop trigger if exists events_assign_ordered_id on events`.execute(db)
  await sql`drop function if exists events_assign_ordered_id()`.execute(db)
  await sql`
    create trigger events_explicit_id
    after insert on events
    for each row
    when (new.event_id > pg_sequence_last_value('${sql.raw(SEQUENCE)}'::regclass))
    execute function events_explicit_id()`.execute(db)
}

export async function down (db: Kysely<any>): Promise<void> {
  await sql`drop trigger events_explicit_id on events`.execute(db)
  await sql`drop function events_explicit_id()`.execute(db)
  await createWriterRegistration(db)
}
