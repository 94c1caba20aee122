import { sql, type Kysely } from 'kysely'

/*
 * GET /api/runs?status=a,b: each status wanted reads its own keyset page,
 * newest first, from this index (db/queries.ts, runsInStatuses), so a page
 * reads about a page of runs per status instead of walking the whole list
 * and skipping the runs in other statuses. Ascending, read backward for
 * newest first: the later pages' key, (status, created_at, run_id) < (...),
 * is then one index condition where the scan starts (with created_at and
 * run_id descending, the mixed directions would not let it be).
 *
 * A plain CREATE INDEX, inside the migrations' transaction like 0001's:
 * the runs table holds a row per run (thousands, not the event log's
 * millions), so the write lock it takes on runs is brief.
 */

export async function up (db: Kysely<any>): Promise<void> {
  await sql`create index if not exists runs_status_created_at_run_id_idx on runs (status, created_at, run_id)`.execute(db)
}

export async function down (db: Kysely<any>): Promise<void> {
  await sql`drop index if exists runs_status_created_at_run_id_idx`.execute(db)
}
