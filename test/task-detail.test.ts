import t from 'tap'
import { ApiError, createClient } from '../client/src/index.ts'
import { build, serve } from './helpers/app.ts'
import { assertSchema } from './helpers/contract.ts'
import { insertGraph, makeAttempt, makeMessage, makeRun, makeTask, makeThread } from './helpers/fixtures.ts'

// A task's whole story: the task, every attempt, every thread, from one snapshot.

const same = '2026-07-07T07:07:07.000Z'
const run = makeRun({ run_id: 'run-story' })
const task = makeTask({ run_id: 'run-story', task_id: 'task-story', status: 'blocked', latest_attempt_no: 2, default_to: 'alice', acceptance_json: '{"big": 12345678901234567890}' })
const lonely = makeTask({ run_id: 'run-story', task_id: 'task-lonely' })
// The same task_id in another run: never mixed in.
const namesake = makeTask({ run_id: 'run-other', task_id: 'task-story' })
const threads = [
  makeThread({ run_id: 'run-story', task_id: 'task-story', thread_id: 'th-old', created_at: '2026-01-01T00:00:00.000Z' }),
  makeThread({ run_id: 'run-story', task_id: 'task-story', thread_id: 'th-tie-a', created_at: same, latest_message_id: 'msg-story' }),
  makeThread({ run_id: 'run-story', task_id: 'task-story', thread_id: 'th-tie-b', created_at: same }),
  makeThread({ run_id: 'run-other', task_id: 'task-story', thread_id: 'th-namesake' })
]
const attempts = [
  makeAttempt({ run_id: 'run-story', task_id: 'task-story', attempt_no: 1, thread_id: 'th-old', status: 'failed' }),
  makeAttempt({ run_id: 'run-story', task_id: 'task-story', attempt_no: 3, thread_id: 'th-tie-b' }),
  makeAttempt({
    run_id: 'run-story',
    task_id: 'task-story',
    attempt_no: 2,
    thread_id: 'th-tie-a',
    status: 'blocked',
    base_ref: 'main',
    base_commit: 'abc',
    branch_name: 'task/story',
    worktree_path: '/w/story',
    workspace_status: 'clean',
    result_commit: 'def'
  }),
  makeAttempt({ run_id: 'run-other', task_id: 'task-story', attempt_no: 9, thread_id: 'th-namesake' })
]

t.before(() => insertGraph({
  runs: [run, makeRun({ run_id: 'run-other' })],
  tasks: [task, lonely, namesake],
  task_attempts: attempts,
  threads,
  messages: [makeMessage({ thread_id: 'th-tie-a', message_id: 'msg-story', kind: 'question' })]
}))

t.test('getTaskDetail: every field of the task, its attempts newest first, its threads newest first', async (t) => {
  const app = await build(t)
  const res = await app.inject('/api/runs/run-story/tasks/task-story')
  t.equal(res.statusCode, 200)
  t.match(res.headers['content-type'], /^application\/json/)
  t.match(res.headers['x-event-cursor'], /^\d+$/)
  t.match(res.headers.etag, /^"[A-Za-z0-9_-]+"$/)
  assertSchema(t, 'TaskDetailEnvelope', res.json())
  const detail = res.json().task
  const listed = (await app.inject('/api/runs/run-story')).json().run.tasks.find((each: { task_id: string }) => each.task_id === 'task-story')
  const { attempts: taskAttempts, threads: taskThreads, ...fields } = detail
  t.same(fields, listed, 'the task\'s fields are the Task the run detail lists')
  t.match(res.body, /"acceptance_json": \{"big": 12345678901234567890\}/, 'raw JSON passes through unrounded')
  t.same(taskAttempts.map((attempt: { attempt_no: number }) => attempt.attempt_no), [3, 2, 1], 'attempt_no desc')
  t.same(taskAttempts[1], {
    run_id: 'run-story',
    task_id: 'task-story',
    attempt_no: 2,
    assigned_to: 'worker-1',
    thread_id: 'th-tie-a',
    base_ref: 'main',
    base_commit: 'abc',
    branch_name: 'task/story',
    worktree_path: '/w/story',
    workspace_status: 'clean',
    result_commit: 'def',
    status: 'blocked',
    created_at: taskAttempts[1].created_at,
    updated_at: taskAttempts[1].updated_at
  })
  t.notOk('base_ref' in taskAttempts[0], 'optional fields omitted when NULL')
  t.same(taskThreads.map((thread: { thread_id: string }) => thread.thread_id), ['th-tie-b', 'th-tie-a', 'th-old'],
    'created_at desc, then thread_id desc on ties')
  const threadDetail = (await app.inject('/api/threads/th-tie-a')).json().thread
  t.same(taskThreads[1], threadDetail.thread, 'each thread as its thread detail gives it, without messages')
})

t.test('a task with no attempt and no thread', async (t) => {
  const app = await build(t)
  const res = await app.inject('/api/runs/run-story/tasks/task-lonely')
  t.equal(res.statusCode, 200)
  assertSchema(t, 'TaskDetailEnvelope', res.json())
  t.same(res.json().task.attempts, [])
  t.same(res.json().task.threads, [])
  t.notOk('latest_attempt_no' in res.json().task, 'omitted, not null')
})

t.test('404 says whether the run or its task is unknown', async (t) => {
  const app = await build(t)
  const noRun = await app.inject('/api/runs/no-such-run/tasks/task-story')
  t.equal(noRun.statusCode, 404)
  t.same(noRun.json(), { error: { code: 'not_found', message: 'run not found' } })
  const noTask = await app.inject('/api/runs/run-story/tasks/no-such-task')
  t.equal(noTask.statusCode, 404)
  t.same(noTask.json(), { error: { code: 'not_found', message: 'task not found' } })
  const elsewhere = await app.inject('/api/runs/run-other/tasks/task-lonely')
  t.equal(elsewhere.statusCode, 404, 'a task of another run is not this run\'s')
  t.equal(elsewhere.json().error.message, 'task not found')
})

t.test('If-None-Match with the ETag answers 304 with the cursor', async (t) => {
  const app = await build(t)
  const first = await app.inject('/api/runs/run-story/tasks/task-story')
  const again = await app.inject({ url: '/api/runs/run-story/tasks/task-story', headers: { 'if-none-match': first.headers.etag as string } })
  t.equal(again.statusCode, 304)
  t.equal(again.body, '')
  t.equal(again.headers.etag, first.headers.etag)
  t.match(again.headers['x-event-cursor'], /^\d+$/)
})

t.test('the client: task() and taskRead()', async (t) => {
  const { url } = await serve(t)
  const client = createClient({ url })
  const detail = await client.task('run-story', 'task-story')
  t.equal(detail.task.task_id, 'task-story')
  t.same(detail.task.attempts.map((attempt) => attempt.attempt_no), [3, 2, 1])
  t.same(detail.task.threads.map((thread) => thread.thread_id), ['th-tie-b', 'th-tie-a', 'th-old'])
  const read = await client.taskRead('run-story', 'task-story')
  t.type(read.eventCursor, 'number')
  const reread = await client.taskRead('run-story', 'task-story')
  t.ok(reread.unchanged, 'revalidated with If-None-Match')
  const refused = await client.task('run-story', 'no/such task').catch((error: unknown) => error)
  t.ok(refused instanceof ApiError)
  t.equal((refused as ApiError).status, 404)
  t.equal((refused as ApiError).code, 'not_found')
})
