-- The key that signs stream tokens (GET /api/stream-token), the same for
-- every replica over this database without any setting (STREAM_TOKEN_SECRET,
-- when set, is used instead). It is drawn at random once, 256 bits from the
-- server's strong random source, into the one row of the table
-- stream_token_key, which public cannot read.
--
-- stream_token_key() reads it. Security definer (its search_path fixed, as
-- keeper.sql says), so that the service's reading role needs no right on
-- the table; executable by its owner only, and by the role the service
-- reads with when that is another (granted by the operator:
-- docs/database.md, "Roles and privileges"). Whoever reads the key can
-- forge a stream token that opens every stream until the service's
-- maximum age for one (STREAM_TOKEN_TTL_S from its iat), so no other
-- login may. To change the key: update the row, then restart the replicas
-- (tokens already handed out stop opening streams).
--
-- Not a migration: a change is made by a new migration, then copied here
-- (test/sql-definitions.test.ts fails while the two differ).

create or replace function stream_token_key() returns text
language sql stable security definer set search_path = public, pg_temp
as $$ select secret from stream_token_key $$;
revoke execute on function stream_token_key() from public;
