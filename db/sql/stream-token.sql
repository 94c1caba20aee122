-- The key that signs stream tokens (GET /api/stream-token), the same for
-- every replica over this database without any setting (STREAM_TOKEN_SECRET,
-- when set, is used instead). It is drawn at random once, 256 bits from the
-- server's strong random source, into the one row of the table
-- stream_token_key, which public cannot read.
--
-- stream_token_key() reads it. Security definer (its search_path fixed, as
-- keeper.sql says), since a read-only role is granted the control plane's
-- tables only (docs/operating.md). Whoever can
-- read the database could forge a stream token, which opens no more than
-- that reader can already read. To change the key: update the row, then
-- restart the replicas (tokens already handed out stop opening streams).
--
-- Not a migration: a change is made by a new migration, then copied here
-- (test/sql-definitions.test.ts fails while the two differ).

create or replace function stream_token_key() returns text
language sql stable security definer set search_path from current
as $$ select secret from stream_token_key $$;
