import type { LightMyRequestResponse } from 'fastify'
import pg from 'pg'
import t from 'tap'
import { listRunsPlan, rowsRead } from './helpers/plans.ts'
import { build } from './helpers/app.ts'
import { testDatabaseUrl } from './helpers/database.ts'

// GET /api/runs?status=a,b on a table of many runs: the page is the same as
// a plain filter over the whole list would give, and its statement reads
// about a page of runs per status wanted from the index runs_status_created_at_run_id_idx,
// never the whole table (EXPLAIN ANALYZE, custom and generic plans).

const RUNS = 20_000

async function client () {
  const connection = new pg.Client({ connectionString: await testDatabaseUrl() })
  await connection.connect()
  return connection
}

t.before(async () => {
  const db = await client()
  // One run in 500 is 'rare', then half 'running' and half 'done'; three runs share each created_at (run_id breaks the tie).
  await db.query(`insert into runs (run_id, goal, summary, status, created_at, updated_at)
    select 'many-' || lpad(g::text, 5, '0'), 'goal', '',
      case when g % 500 = 0 then 'rare' when g % 2 = 0 then 'running' else 'done' end,
      timestamptz '2026-01-01' + (g / 3) * interval '1 second', now()
    from generate_series(1, ${RUNS}) g`)
  await db.query('analyze runs')
  await db.end()
})

t.test('a filtered page reads about a page of runs per status, not the table', async (t) => {
  const db = await client()
  t.teardown(() => db.end())
  const cases = [
    { label: 'a rare status', page: { limit: 20, statuses: ['rare'] } },
    { label: 'a common status', page: { limit: 20, statuses: ['running'] } },
    { label: 'a rare and a common status', page: { limit: 50, statuses: ['rare', 'running'] } },
    { label: 'a later page of two statuses', page: { limit: 50, statuses: ['done', 'rare'], after: { createdAt: '2026-01-01T01:00:00.000Z', id: 'many-10800' } } },
    { label: 'a status no run has', page: { limit: 50, statuses: ['unknown'] } }
  ]
  for (const { label, page } of cases) {
    for (const mode of ['force_custom_plan', 'force_generic_plan'] as const) {
      const read = rowsRead(await listRunsPlan(db, page, mode), 'runs')
      t.ok(read <= page.statuses.length * (page.limit + 1), `${label} (${mode}): ${read} of ${RUNS} runs read`)
    }
  }
})

t.test('paging through ?status=a,b gives every run in those statuses once, newest first, as a plain filter would', async (t) => {
  const db = await client()
  t.teardown(() => db.end())
  const app = await build(t)
  const statuses = ['rare', 'done']
  const { rows } = await db.query<{ run_id: string }>('select run_id from runs where status = any($1) order by created_at desc, run_id desc', [statuses])
  const seen: string[] = []
  let path: string | undefined = `/api/runs?status=${statuses.join(',')}&limit=997`
  while (path !== undefined) {
    const res: LightMyRequestResponse = await app.inject(path)
    t.equal(res.statusCode, 200)
    seen.push(...res.json().runs.map((item: { run: { run_id: string } }) => item.run.run_id))
    path = /<([^>]+)>; rel="next"/.exec(res.headers.link as string ?? '')?.[1]
  }
  t.equal(seen.length, rows.length, `${rows.length} runs`)
  t.same(seen, rows.map((row) => row.run_id))
})
