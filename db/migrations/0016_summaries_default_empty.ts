import { sql, type Kysely } from 'kysely'

/*
 * runs.summary and tasks.summary default to '': the contract calls them
 * never NULL, '' when there is nothing to say yet, but 0001 gave them no
 * default, so an orchestrator that left the column out of its INSERT met a
 * not-null violation. A new default is a catalog change only: no row is
 * rewritten, and rows already there keep their summary.
 */

export async function up (db: Kysely<any>): Promise<void> {
  await sql`alter table runs alter column summary set default ''`.execute(db)
  await sql`alter table tasks alter column summary set default ''`.execute(db)
}

export async function down (db: Kysely<any>): Promise<void> {
  await sql`alter table tasks alter column summary drop default`.execute(db)
  await sql`alter table runs alter column summary drop default`.execute(db)
}
