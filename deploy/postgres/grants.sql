-- What the reader and the writer roles may do, granted by the owner (the
-- role that migrates) once the migrations have run, and again after a
-- migration that adds a table; safe to run again:
-- psql "$DATABASE_URL" -f deploy/postgres/grants.sql, after renaming the
-- roles to yours. docs/database.md, "Roles and privileges",
-- says why each grant is there; test/privileges.test.ts fails on any other.

-- ocp_reader: the service's reads (DATABASE_READ_URL), on the primary or a
-- hot standby. Every table and view (kysely_migration too: the check at
-- start), and the stream-token key.
grant select on all tables in schema public to ocp_reader;
grant execute on function stream_token_key() to ocp_reader;

-- ocp_writer: the orchestrator. Its tables, and the events it appends
-- (docs/orchestrators.md), with the id sequence they draw from; nothing
-- of the event log's keeper, nor the key.
grant select, insert, update, delete on runs, tasks, task_attempts, threads, messages, artifacts to ocp_writer;
grant select, insert on events to ocp_writer;
grant usage on sequence events_event_id_seq to ocp_writer;
