import type { LightMyRequestResponse } from 'fastify'
import pg from 'pg'
import t from 'tap'
import { createClient } from '../client/src/index.ts'
import { build, serve } from './helpers/app.ts'
import { assertSchema } from './helpers/contract.ts'
import { testDatabaseUrl } from './helpers/database.ts'
import { listRunsPlan, rowsRead } from './helpers/plans.ts'

// GET /api/runs?blocked=true: the runs waiting on an answer (at least one
// task in status blocked), newest first, paged, combinable with status; on
// a table of some thousands of runs, each found by a probe of the task
// index, never a scan of the tasks.

const RUNS = 3000

async function client () {
  const connection = new pg.Client({ connectionString: await testDatabaseUrl() })
  await connection.connect()
  return connection
}

t.before(async () => {
  const db = await client()
  // Every run has a done task; one in 7 a blocked one too; runs alternate
  // 'running' and 'done'; three runs share each created_at (run_id breaks the tie).
  await db.query(`insert into runs (run_id, goal, summary, status, created_at, updated_at)
    select 'r-' || lpad(g::text, 4, '0'), 'goal', '', case when g % 2 = 0 then 'running' else 'done' end,
      timestamptz '2026-01-01' + (g / 3) * interval '1 second', now()
    from generate_series(1, ${RUNS}) g`)
  await db.query(`insert into tasks (run_id, task_id, title, summary, status, priority, acceptance_json)
    select run_id, 'done-task', 't', '', 'done', 'normal', '{}'::jsonb from runs
    union all
    select run_id, 'blocked-' || k, 't', '', 'blocked', 'normal', '{}'::jsonb from runs, generate_series(1, 2) k
    where substr(run_id, 3)::int % 7 = 0`)
  await db.query('analyze runs')
  await db.query('analyze tasks')
  await db.end()
})

const ids = (res: LightMyRequestResponse): string[] => res.json().runs.map((item: { run: { run_id: string } }) => item.run.run_id)
const nextOf = (res: LightMyRequestResponse) => /^<([^>]+)>; rel="next"$/.exec(res.headers.link as string ?? '')?.[1]

/** The runs a plain filter over the whole list gives. */
async function expected (where: string): Promise<string[]> {
  const db = await client()
  try {
    const { rows } = await db.query<{ run_id: string }>(`select run_id from runs r where ${where} order by created_at desc, run_id desc`)
    return rows.map((row) => row.run_id)
  } finally {
    await db.end()
  }
}
const blockedWhere = 'exists (select from tasks t where t.run_id = r.run_id and t.status = \'blocked\')'

t.test('?blocked=true: only runs with a blocked task, newest first, paged by Link, which keeps the filter', async (t) => {
  const app = await build(t)
  const want = await expected(blockedWhere)
  t.equal(want.length, Math.floor(RUNS / 7))
  const seen: string[] = []
  let path: string | undefined = '/api/runs?blocked=true&limit=100'
  let pages = 0
  while (path !== undefined) {
    const res: LightMyRequestResponse = await app.inject(path)
    t.equal(res.statusCode, 200)
    const body = res.json()
    if (pages === 0) {
      assertSchema(t, 'RunList', body)
      t.ok(body.runs.every((item: { task_counts: Record<string, number> }) => item.task_counts.blocked === 2), 'each has its blocked count in task_counts')
    }
    seen.push(...ids(res))
    path = nextOf(res)
    if (path !== undefined) t.match(path, /^\/api\/runs\?blocked=true&limit=100&cursor=[A-Za-z0-9_-]+$/, 'the next page keeps blocked=true')
    pages++
  }
  t.equal(pages, Math.ceil(want.length / 100))
  t.same(seen, want, 'every such run once, as a plain filter would give')
})

t.test('?blocked=true with status, and ?blocked=false as no filter', async (t) => {
  const app = await build(t)
  const first = await app.inject('/api/runs?status=running&blocked=true&limit=50')
  const want = await expected(`status = 'running' and ${blockedWhere}`)
  t.same(ids(first), want.slice(0, 50))
  t.match(nextOf(first), /^\/api\/runs\?status=running&blocked=true&limit=50&cursor=/, 'the Link keeps both filters')
  const second = await app.inject(nextOf(first)!)
  t.same(ids(second), want.slice(50, 100))

  const both = await app.inject('/api/runs?status=done,running&blocked=true&limit=1000')
  t.same(ids(both), await expected(blockedWhere), 'several statuses, each page filtered before its limit')

  const unfiltered = await app.inject('/api/runs?blocked=false&limit=20')
  const plain = await app.inject('/api/runs?limit=20')
  t.same(ids(unfiltered), ids(plain), 'false: every run')
  t.equal(nextOf(unfiltered), nextOf(plain), 'and its Link names no filter')
})

t.test('?blocked= anything but true or false is a 400 naming the parameter', async (t) => {
  const app = await build(t)
  for (const value of ['', '1', 'yes', 'TRUE', 'true,false']) {
    const res = await app.inject(`/api/runs?blocked=${encodeURIComponent(value)}`)
    t.equal(res.statusCode, 400, `blocked=${value}`)
    t.same(res.json(), { error: { code: 'bad_request', message: 'blocked must be true or false' } })
  }
  const twice = await app.inject('/api/runs?blocked=true&blocked=true')
  t.equal(twice.statusCode, 400, 'given twice')
})

t.test('the client: runs({ blocked: true })', async (t) => {
  const { url } = await serve(t)
  const api = createClient({ url })
  const page = await api.runsRead({ blocked: true, status: 'running', limit: 5 })
  t.same(page.body.runs.map((item) => item.run.run_id), (await expected(`status = 'running' and ${blockedWhere}`)).slice(0, 5))
  t.type(page.next, 'string')
  t.equal((await api.runs({ blocked: false, limit: 7 })).runs.length, 7, 'false sends no filter')
})

t.test('the blocked filter probes tasks_run_status_idx per run passed over, and never scans tasks', async (t) => {
  const db = await client()
  t.teardown(() => db.end())
  const cases = [
    { label: 'the first page', page: { limit: 50, blocked: true } },
    { label: 'a later page', page: { limit: 50, blocked: true, after: { createdAt: '2026-01-01T00:10:00.000Z', id: 'r-1800' } } },
    { label: 'two statuses', page: { limit: 50, blocked: true, statuses: ['running', 'done'] } }
  ]
  for (const { label, page } of cases) {
    for (const mode of ['force_custom_plan', 'force_generic_plan'] as const) {
      const plan = await listRunsPlan(db, page, mode)
      const taskScans = plan.filter((node) => node['Relation Name'] === 'tasks')
      t.ok(taskScans.length > 0 && taskScans.every((node) => node['Node Type'] !== 'Seq Scan'), `${label} (${mode}): tasks read by index only`, { plan: taskScans })
      const runsRead = rowsRead(plan, 'runs')
      // One run in 7 is blocked: a page of 51 passes over about 7 times as many runs, a few pages' worth, not the table.
      t.ok(runsRead <= 8 * page.limit * (page.statuses?.length ?? 1), `${label} (${mode}): ${runsRead} of ${RUNS} runs read`)
    }
  }
})
