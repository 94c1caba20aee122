import t from 'tap'
import { build } from './helpers/app.ts'
import { assertSchema } from './helpers/contract.ts'
import { insertGraph, json, makeRun, makeTask } from './helpers/fixtures.ts'

// Runs, run detail and a run's tasks: every field, ordering, counts, paging.

const same = '2026-06-01T12:00:00.000Z'

const runA = makeRun({ run_id: 'run-a', goal: 'Alpha', status: 'running', summary: 'first' })
const runB = makeRun({ run_id: 'run-b', goal: 'Beta', status: 'done', created_at: same, updated_at: same })
const runC = makeRun({ run_id: 'run-c', goal: 'Gamma', status: 'failed', created_at: same, updated_at: same })
const empty = makeRun({ run_id: 'run-empty', goal: 'Nothing yet' })

// Tasks of run-a: raw JSON of every kind, optional fields present and NULL,
// two tasks sharing created_at (ordered by task_id then).
const tasks = [
  makeTask({ run_id: 'run-a', task_id: 't-object', status: 'done', acceptance_json: json({ nested: { list: [1, 'two', null, true] }, big: 1 }) }),
  makeTask({ run_id: 'run-a', task_id: 't-array', status: 'running', acceptance_json: json([1, 2, 3]), default_to: 'alice', latest_attempt_no: 3 }),
  makeTask({ run_id: 'run-a', task_id: 't-string', status: 'running', acceptance_json: json('just text') }),
  makeTask({ run_id: 'run-a', task_id: 't-zz-number', status: 'ready', acceptance_json: json(42.5), created_at: same, updated_at: same }),
  makeTask({ run_id: 'run-a', task_id: 't-aa-null', status: 'ready', acceptance_json: json(null), created_at: same, updated_at: same }),
  makeTask({ run_id: 'run-a', task_id: 't-bool', status: 'blocked', acceptance_json: json(false) }),
  makeTask({ run_id: 'run-b', task_id: 't-other', status: 'done' })
]

t.before(() => insertGraph({ runs: [runA, runB, runC, empty], tasks }))

const iso = (value: unknown) => new Date(value as string).toISOString()

t.test('listRuns: newest first, run_id desc on ties, with per-status counts', async (t) => {
  const app = await build(t)
  const res = await app.inject('/api/runs')
  t.equal(res.statusCode, 200)
  t.match(res.headers['content-type'], /^application\/json/)
  t.notOk(res.headers.link, 'no Link header when everything fits')
  const body = res.json()
  assertSchema(t, 'RunList', body)
  // runB and runC share created_at: run_id desc puts run-c first.
  t.same(body.runs.map((item: { run: { run_id: string } }) => item.run.run_id), ['run-c', 'run-b', 'run-empty', 'run-a'])
  const a = body.runs.find((item: { run: { run_id: string } }) => item.run.run_id === 'run-a')
  t.same(a.task_counts, { done: 1, running: 2, ready: 2, blocked: 1 })
  t.equal(a.total_tasks, 6)
  t.same(a.run, {
    run_id: 'run-a',
    goal: 'Alpha',
    summary: 'first',
    status: 'running',
    created_at: a.run.created_at,
    updated_at: a.run.updated_at
  })
  t.equal(iso(a.run.created_at), runA.created_at)
  t.match(a.run.created_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/, 'RFC 3339, UTC, microseconds')
  const none = body.runs.find((item: { run: { run_id: string } }) => item.run.run_id === 'run-empty')
  t.same(none.task_counts, {}, 'a run with no tasks has task_counts {}')
  t.equal(none.total_tasks, 0)
})

t.test('listRuns pages with limit and cursor, the next page in a Link header', async (t) => {
  const app = await build(t)
  const seen: string[] = []
  let url: string | undefined = '/api/runs?limit=3'
  let pages = 0
  while (url !== undefined) {
    const res = await app.inject(url)
    t.equal(res.statusCode, 200)
    assertSchema(t, 'RunList', res.json())
    seen.push(...res.json().runs.map((item: { run: { run_id: string } }) => item.run.run_id))
    const link = res.headers.link as string | undefined
    url = link === undefined ? undefined : /^<([^>]+)>; rel="next"$/.exec(link)?.[1]
    pages++
  }
  t.equal(pages, 2)
  t.same(seen, ['run-c', 'run-b', 'run-empty', 'run-a'], 'pages concatenate to the whole list, no gap or repeat')

  const exact = await app.inject('/api/runs?limit=4')
  t.notOk(exact.headers.link, 'no Link when the page holds the last item')
})

t.test('listRuns ?status=S and ?status=a,b: only runs in those statuses; paging keeps the filter in the Link', async (t) => {
  const app = await build(t)
  const ids = (res: { json: () => { runs: Array<{ run: { run_id: string } }> } }) => res.json().runs.map((item) => item.run.run_id)
  t.same(ids(await app.inject('/api/runs?status=done')), ['run-b'])
  t.same(ids(await app.inject('/api/runs?status=done,running')), ['run-b', 'run-empty', 'run-a'], 'any of several, newest first')
  t.same(ids(await app.inject('/api/runs?status=done,,done,')), ['run-b'], 'empty items and repeats count once')
  t.same(ids(await app.inject('/api/runs?status=no-such-status')), [])
  t.same(ids(await app.inject(`/api/runs?status=${encodeURIComponent('done; drop table runs')}`)), [], 'matched exactly, as text')

  const first = await app.inject('/api/runs?status=done,running,failed&limit=2')
  t.same(ids(first), ['run-c', 'run-b'])
  const next = /^<([^>]+)>; rel="next"$/.exec(first.headers.link as string)?.[1]
  t.match(next, /^\/api\/runs\?status=done%2Crunning%2Cfailed&limit=2&cursor=[A-Za-z0-9_-]+$/, 'the next page keeps the filter')
  const second = await app.inject(next!)
  t.same(ids(second), ['run-empty', 'run-a'])
  t.notOk(second.headers.link, 'the last page')

  for (const query of ['status=', 'status=,', 'status=%00']) {
    const res = await app.inject(`/api/runs?${query}`)
    t.equal(res.statusCode, 400, query)
    t.equal(res.json().error.code, 'bad_request')
  }
})

t.test('listRuns default page bound comes from RUN_LIST_DEFAULT_LIMIT', async (t) => {
  const app = await build(t, { RUN_LIST_DEFAULT_LIMIT: 2 })
  const res = await app.inject('/api/runs')
  t.equal(res.json().runs.length, 2)
  t.match(res.headers.link, /^<\/api\/runs\?limit=2&cursor=[A-Za-z0-9_-]+>; rel="next"$/)
})

t.test('getRunDetail: run, counts, tasks in order, from one snapshot', async (t) => {
  const app = await build(t)
  const res = await app.inject('/api/runs/run-a')
  t.equal(res.statusCode, 200)
  const { run } = res.json()
  assertSchema(t, 'RunDetailEnvelope', res.json())
  t.equal(run.run.run_id, 'run-a')
  t.same(run.task_counts, { done: 1, running: 2, ready: 2, blocked: 1 })
  t.equal(run.total_tasks, 6)
  t.same(run.tasks.map((task: { task_id: string }) => task.task_id),
    ['t-object', 't-array', 't-string', 't-bool', 't-aa-null', 't-zz-number'],
    'created_at asc, then task_id asc on ties')
  t.same(run.blocked_tasks, [], 'a blocked task without attempt is left out')

  const byId = Object.fromEntries(run.tasks.map((task: { task_id: string }) => [task.task_id, task]))
  t.same(byId['t-object'].acceptance_json, { nested: { list: [1, 'two', null, true] }, big: 1 })
  t.same(byId['t-array'].acceptance_json, [1, 2, 3])
  t.equal(byId['t-string'].acceptance_json, 'just text')
  t.equal(byId['t-zz-number'].acceptance_json, 42.5)
  t.equal(byId['t-aa-null'].acceptance_json, null, 'JSON null passes through as null, and the key is present')
  t.ok('acceptance_json' in byId['t-aa-null'])
  t.equal(byId['t-bool'].acceptance_json, false)

  // Optional fields: present when set, omitted (not null, not "") when NULL.
  t.equal(byId['t-array'].default_to, 'alice')
  t.equal(byId['t-array'].latest_attempt_no, 3)
  t.notOk('default_to' in byId['t-object'])
  t.notOk('latest_attempt_no' in byId['t-object'])
  t.same(Object.keys(byId['t-object']).sort(), [
    'acceptance_json', 'created_at', 'priority', 'run_id', 'status', 'summary', 'task_id', 'title', 'updated_at'
  ])
})

t.test('getRunDetail of a run with no tasks', async (t) => {
  const app = await build(t)
  const res = await app.inject('/api/runs/run-empty')
  t.equal(res.statusCode, 200)
  t.same(res.json().run, { run: res.json().run.run, task_counts: {}, total_tasks: 0, tasks: [], blocked_tasks: [] })
})

t.test('raw JSON passes through exactly, big numbers included', async (t) => {
  await insertGraph({
    runs: [makeRun({ run_id: 'run-raw' })],
    tasks: [makeTask({ run_id: 'run-raw', task_id: 'precise', acceptance_json: '{"big": 12345678901234567890, "exact": 0.1000000000000000055511151231257827, "s": "\\u00e9\\ud83d\\ude00"}' })]
  })
  const app = await build(t)
  const res = await app.inject('/api/runs/run-raw/tasks')
  t.match(res.body, /"big": 12345678901234567890[,}]/, 'a 20-digit integer is not rounded through a double')
  t.match(res.body, /"exact": 0\.1000000000000000055511151231257827[,}]/)
  t.equal(res.json().tasks[0].acceptance_json.s, 'é😀')
})

t.test('listRunTasks: all tasks, same shape as in run detail', async (t) => {
  const app = await build(t)
  const list = await app.inject('/api/runs/run-a/tasks')
  t.equal(list.statusCode, 200)
  assertSchema(t, 'TaskList', list.json())
  const detail = await app.inject('/api/runs/run-a')
  t.same(list.json().tasks, detail.json().run.tasks)

  const none = await app.inject('/api/runs/run-empty/tasks')
  t.same(none.json(), { tasks: [] })
})

t.test('listRunTasks pages with limit and cursor', async (t) => {
  const app = await build(t)
  const first = await app.inject('/api/runs/run-a/tasks?limit=4')
  t.same(first.json().tasks.map((task: { task_id: string }) => task.task_id), ['t-object', 't-array', 't-string', 't-bool'])
  const next = /^<([^>]+)>; rel="next"$/.exec(first.headers.link as string)?.[1]
  t.match(next, /^\/api\/runs\/run-a\/tasks\?limit=4&cursor=/)
  const second = await app.inject(next!)
  t.same(second.json().tasks.map((task: { task_id: string }) => task.task_id), ['t-aa-null', 't-zz-number'])
  t.notOk(second.headers.link)
})

t.test('unknown runs answer 404 not_found on every run route', async (t) => {
  const app = await build(t)
  for (const path of ['/api/runs/nope', '/api/runs/nope/tasks', '/api/runs/nope/blocked', '/api/runs/nope/tasks?limit=1']) {
    const res = await app.inject(path)
    t.equal(res.statusCode, 404, path)
    t.same(res.json(), { error: { code: 'not_found', message: 'run not found' } }, path)
    assertSchema(t, 'ErrorEnvelope', res.json())
  }
})

t.test('bad paging parameters answer 400 bad_request', async (t) => {
  const app = await build(t)
  const bad = [
    'limit=0', 'limit=1001', 'limit=9999', 'limit=abc', 'limit=1.5', 'limit=-1', 'limit=1&limit=2', 'limit=99999999999999999999',
    'limit=1e309', 'limit=1e3', 'limit=Infinity', 'limit=%2B5', 'limit=05',
    'cursor=', 'cursor=%00', 'cursor=not*base64', 'cursor=zzzz', 'cursor=e30', // {} is not a cursor
    `cursor=${Buffer.from('["yesterday","x"]').toString('base64url')}`,
    `cursor=${Buffer.from('["2026-13-45T99:99:99.000000Z","x"]').toString('base64url')}`,
    `cursor=${Buffer.from('["2026-01-01T00:00:00.000000Z",7]').toString('base64url')}`,
    `cursor=${Buffer.from('["2026-01-01T00:00:00.000000Z","a\\u0000b"]').toString('base64url')}`,
    `cursor=${'A'.repeat(600)}`
  ]
  for (const query of bad) {
    for (const path of ['/api/runs', '/api/runs/run-a/tasks']) {
      const res = await app.inject(`${path}?${query}`)
      const name = `${path}?${query}`.slice(0, 80)
      t.equal(res.statusCode, 400, name)
      t.equal(res.json().error.code, 'bad_request', name)
    }
  }
})

t.test('unknown query parameters are refused, a cache-buster too (revalidation is what ETag is for)', async (t) => {
  const app = await build(t)
  const res = await app.inject('/api/runs?_=1700000000&foo=bar')
  t.equal(res.statusCode, 400)
  t.same(res.json(), { error: { code: 'bad_request', message: 'unknown query parameter "_": this route accepts limit, cursor, status, blocked' } })
})
