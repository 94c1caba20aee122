import { sql } from 'kysely'
import t from 'tap'
import { build } from './helpers/app.ts'

// The service's own sessions cannot write orchestration state, even by mistake.

t.test('the request pool refuses writes and carries its limits', async (t) => {
  const app = await build(t, { DB_STATEMENT_TIMEOUT_MS: 1234 })
  await t.rejects(
    app.db.insertInto('runs').values({ run_id: 'r', goal: 'g', summary: 's', status: 'x' }).execute(),
    { code: '25006' }, // read_only_sql_transaction
    'an INSERT is refused'
  )
  await t.rejects(sql`create table intruder (x int)`.execute(app.db), { code: '25006' }, 'DDL is refused')
  await t.rejects(app.db.deleteFrom('runs').execute(), { code: '25006' }, 'a DELETE is refused')
  const settings = await sql<{ read_only: string, timeout: string, zone: string }>`
    select current_setting('default_transaction_read_only') as read_only,
           current_setting('statement_timeout') as timeout,
           current_setting('TimeZone') as zone`.execute(app.db)
  t.same(settings.rows[0], { read_only: 'on', timeout: '1234ms', zone: 'UTC' })
})
