import { sql, type Kysely } from 'kysely'

/*
 * The key that signs stream tokens (GET /api/stream-token), drawn at random
 * once, here, so that every replica over this database signs and verifies
 * with the same key without any setting (STREAM_TOKEN_SECRET, when set,
 * is used instead). 256 bits from gen_random_uuid(), which draws from the
 * server's strong random source (pg_strong_random), four of them for 122
 * random bits each.
 *
 * Read through stream_token_key(), a security definer function, since a
 * read-only role is granted the control plane's tables only
 * (docs/operating.md). Whoever can read the database could forge a stream
 * token, which opens no more than that reader can already read. To change
 * the key: update the row, then restart the replicas (tokens already handed
 * out stop opening streams).
 */

export async function up (db: Kysely<any>): Promise<void> {
  await sql`
    create table stream_token_key (
      only_row boolean primary key default true check (only_row),
      secret text not null default replace(gen_random_uuid()::text || gen_random_uuid()::text || gen_random_uuid()::text || gen_random_uuid()::text, '-', ''),
      created_at timestamptz not null default now()
    )`.execute(db)
  await sql`insert into stream_token_key default values`.execute(db)
  await sql`revoke all on stream_token_key from public`.execute(db)
  await sql`
    create function stream_token_key() returns text
    language sql stable security definer set search_path from current
    as $$ select secret from stream_token_key $$`.execute(db)
}

export async function down (db: Kysely<any>): Promise<void> {
  await sql`drop function stream_token_key()`.execute(db)
  await sql`drop table stream_token_key`.execute(db)
}
