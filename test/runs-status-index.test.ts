import type { LightMyRequestResponse } from 'fastify'
import pg from 'pg'
import t from 'tap'
import { listRuns, type PageKey } from '../db/queries.js'
import { build } from './helpers/app.js'
import { testDatabaseUrl } from './helpers/database.js'

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

/** The statement listRuns sends for a page, with its parameter values, taken from a pool that records instead of sending. */
async function statementOf (page: { limit: number, statuses: string[], after?: PageKey }) {
  let sent: { text: string, values: unknown[] } | undefined
  const recorder = {
    connect: async () => ({
      query: async (config: { text: string, values: unknown[] }) => {
        sent = config
        return { rows: [{ body: '{"runs": []}', next_created_at: null, next_id: null, event_cursor: '0' }] }
      },
      release () {}
    })
  }
  await listRuns(recorder as unknown as pg.Pool, page, 0)
  return sent!
}

interface PlanNode {
  'Relation Name'?: string
  'Actual Rows'?: number
  'Actual Loops'?: number
  'Rows Removed by Filter'?: number
  Plans?: PlanNode[]
}

/** Rows of runs that the plan's scans read (returned or filtered out), over all their loops. */
function runsRead (node: PlanNode): number {
  const own = node['Relation Name'] === 'runs'
    ? ((node['Actual Rows'] ?? 0) + (node['Rows Removed by Filter'] ?? 0)) * (node['Actual Loops'] ?? 1)
    : 0
  return own + (node.Plans ?? []).reduce((sum, child) => sum + runsRead(child), 0)
}

/** EXPLAIN ANALYZE of the page's statement prepared under `mode` (the service prepares it, so it may run its generic plan). */
async function rowsRead (db: pg.Client, page: { limit: number, statuses: string[], after?: PageKey }, mode: 'force_custom_plan' | 'force_generic_plan') {
  const { text, values } = await statementOf(page)
  const literal = (value: unknown): string => Array.isArray(value)
    ? `array[${value.map(literal).join(', ')}]::text[]`
    : typeof value === 'number' ? String(value) : db.escapeLiteral(String(value))
  await db.query(`set plan_cache_mode = ${mode}`)
  await db.query(`prepare page as ${text}`)
  try {
    const { rows: [plan] } = await db.query(`explain (analyze, format json) execute page(${values.map(literal).join(', ')})`)
    return runsRead(plan['QUERY PLAN'][0].Plan)
  } finally {
    await db.query('deallocate page')
  }
}

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
      const read = await rowsRead(db, page, mode)
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
