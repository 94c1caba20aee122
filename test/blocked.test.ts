import t from 'tap'
import { build } from './helpers/app.ts'
import { assertSchema } from './helpers/contract.ts'
import { insertGraph, json, makeArtifact, makeAttempt, makeMessage, makeRun, makeTask, makeThread } from './helpers/fixtures.ts'

// The blocked-task rule of docs/reference.md, "Conventions" and its edge cases.

const run = makeRun({ run_id: 'run-blocked' })
const rid = run.run_id

// 1. Blocked, latest_attempt_no = 2: attempt 2 (not the higher 3), and of
//    its thread's several questions the newest; ties broken by message_id.
const chosen = makeTask({ run_id: rid, task_id: 'a-chosen', status: 'blocked', latest_attempt_no: 2 })
const chosenThread = makeThread({ run_id: rid, task_id: 'a-chosen', thread_id: 'thread-chosen' })
const otherThread = makeThread({ run_id: rid, task_id: 'a-chosen', thread_id: 'thread-other' })
const tie = '2026-03-03T03:03:03.000Z'
const chosenMessages = [
  makeMessage({ thread_id: 'thread-chosen', message_id: 'q-old', kind: 'question', summary: 'old question' }),
  makeMessage({ thread_id: 'thread-chosen', message_id: 'q-tie-a', kind: 'question', created_at: tie }),
  makeMessage({ thread_id: 'thread-chosen', message_id: 'q-tie-b', kind: 'question', created_at: tie, summary: 'newest question', payload_json: json({ options: ['yes', 'no'] }) }),
  makeMessage({ thread_id: 'thread-chosen', message_id: 'answer-later', kind: 'answer', created_at: '2026-04-04T00:00:00.000Z' }),
  makeMessage({ thread_id: 'thread-other', message_id: 'q-other-thread', kind: 'question', created_at: '2026-05-05T00:00:00.000Z' })
]
const chosenAttempts = [
  makeAttempt({ run_id: rid, task_id: 'a-chosen', attempt_no: 1, thread_id: 'thread-other' }),
  makeAttempt({
    run_id: rid,
    task_id: 'a-chosen',
    attempt_no: 2,
    thread_id: 'thread-chosen',
    status: 'blocked',
    base_ref: 'main',
    base_commit: 'abc123',
    branch_name: 'task/a',
    worktree_path: '/w/a',
    workspace_status: 'dirty',
    result_commit: 'def456'
  }),
  makeAttempt({ run_id: rid, task_id: 'a-chosen', attempt_no: 3, thread_id: 'thread-other' })
]
const artifacts = [
  makeArtifact({ message_id: 'q-tie-b', artifact_id: 'art-2', created_at: '2026-03-03T03:03:05.000Z' }),
  makeArtifact({ message_id: 'q-tie-b', artifact_id: 'art-1b', created_at: '2026-03-03T03:03:04.000Z' }),
  makeArtifact({ message_id: 'q-tie-b', artifact_id: 'art-1a', created_at: '2026-03-03T03:03:04.000Z', metadata_json: json(['a', 1]) })
]

// 2. Blocked, latest_attempt_no NULL: the highest attempt_no is used.
const highest = makeTask({ run_id: rid, task_id: 'b-highest', status: 'blocked' })
const highestThreads = [makeThread({ run_id: rid, task_id: 'b-highest', thread_id: 'thread-h1' }), makeThread({ run_id: rid, task_id: 'b-highest', thread_id: 'thread-h2' })]
const highestAttempts = [
  makeAttempt({ run_id: rid, task_id: 'b-highest', attempt_no: 1, thread_id: 'thread-h1' }),
  makeAttempt({ run_id: rid, task_id: 'b-highest', attempt_no: 2, thread_id: 'thread-h2' })
]
const highestMessages = [
  makeMessage({ thread_id: 'thread-h1', message_id: 'q-h1', kind: 'question' }),
  makeMessage({ thread_id: 'thread-h2', message_id: 'q-h2', kind: 'question' })
]

// 3. Left out: no attempt at all; an attempt whose thread has no question;
//    latest_attempt_no naming an attempt that does not exist.
const noAttempt = makeTask({ run_id: rid, task_id: 'c-no-attempt', status: 'blocked' })
const noQuestion = makeTask({ run_id: rid, task_id: 'd-no-question', status: 'blocked', latest_attempt_no: 1 })
const noQuestionThread = makeThread({ run_id: rid, task_id: 'd-no-question', thread_id: 'thread-quiet' })
const noQuestionAttempt = makeAttempt({ run_id: rid, task_id: 'd-no-question', attempt_no: 1, thread_id: 'thread-quiet' })
const noQuestionMessage = makeMessage({ thread_id: 'thread-quiet', kind: 'update' })
const danglingLatest = makeTask({ run_id: rid, task_id: 'e-dangling', status: 'blocked', latest_attempt_no: 9 })
const danglingAttempt = makeAttempt({ run_id: rid, task_id: 'e-dangling', attempt_no: 1, thread_id: 'thread-h1' })

// 4. Not blocked, though it has an attempt and a question.
const running = makeTask({ run_id: rid, task_id: 'f-running', status: 'running', latest_attempt_no: 1 })
const runningAttempt = makeAttempt({ run_id: rid, task_id: 'f-running', attempt_no: 1, thread_id: 'thread-h1' })

t.before(() => insertGraph({
  runs: [run, makeRun({ run_id: 'run-calm' })],
  tasks: [chosen, highest, noAttempt, noQuestion, danglingLatest, running],
  threads: [chosenThread, otherThread, ...highestThreads, noQuestionThread],
  task_attempts: [...chosenAttempts, ...highestAttempts, noQuestionAttempt, danglingAttempt, runningAttempt],
  messages: [...chosenMessages, ...highestMessages, noQuestionMessage],
  artifacts
}))

t.test('listBlockedTasks applies the rule', async (t) => {
  const app = await build(t)
  const res = await app.inject(`/api/runs/${rid}/blocked`)
  t.equal(res.statusCode, 200)
  const { blocked } = res.json()
  assertSchema(t, 'BlockedTaskList', res.json())
  t.same(blocked.map((item: { task: { task_id: string } }) => item.task.task_id), ['a-chosen', 'b-highest'],
    'only complete blocked tasks, in created_at then task_id order')

  const [first, second] = blocked
  t.equal(first.attempt.attempt_no, 2, 'the attempt numbered latest_attempt_no, not the highest')
  t.same(first.attempt, {
    run_id: rid,
    task_id: 'a-chosen',
    attempt_no: 2,
    assigned_to: 'worker-1',
    thread_id: 'thread-chosen',
    base_ref: 'main',
    base_commit: 'abc123',
    branch_name: 'task/a',
    worktree_path: '/w/a',
    workspace_status: 'dirty',
    result_commit: 'def456',
    status: 'blocked',
    created_at: first.attempt.created_at,
    updated_at: first.attempt.updated_at
  }, 'every TaskAttempt field, optional ones present when set')
  t.equal(first.question.message_id, 'q-tie-b', 'the newest question; message_id breaks a created_at tie')
  t.equal(first.question.summary, 'newest question')
  t.same(first.question.payload_json, { options: ['yes', 'no'] })
  t.same(first.question.artifacts.map((artifact: { artifact_id: string }) => artifact.artifact_id), ['art-1a', 'art-1b', 'art-2'],
    'the question\'s artifacts by created_at, then artifact_id')
  t.same(first.question.artifacts[0].metadata_json, ['a', 1])

  t.equal(second.attempt.attempt_no, 2, 'latest_attempt_no NULL: the highest attempt')
  t.equal(second.question.message_id, 'q-h2', 'the question of that attempt\'s thread')
  t.same(second.question.artifacts, [], 'artifacts always present, possibly empty')
  t.same(Object.keys(second.attempt).sort(), ['assigned_to', 'attempt_no', 'created_at', 'run_id', 'status', 'task_id', 'thread_id', 'updated_at'],
    'NULL optional attempt fields are omitted')
})

t.test('run detail carries the same blocked tasks, and counts all blocked tasks', async (t) => {
  const app = await build(t)
  const detail = (await app.inject(`/api/runs/${rid}`)).json().run
  const list = (await app.inject(`/api/runs/${rid}/blocked`)).json().blocked
  t.same(detail.blocked_tasks, list)
  t.equal(detail.task_counts.blocked, 5, 'task_counts counts tasks left out of the blocked list too')
  t.same(detail.tasks.find((task: { task_id: string }) => task.task_id === 'a-chosen'), list[0].task, 'the same Task shape')
})

t.test('a run with no blocked task has an empty list', async (t) => {
  const app = await build(t)
  const res = await app.inject('/api/runs/run-calm/blocked')
  t.same(res.json(), { blocked: [] })
})

t.test('left-out blocked tasks are logged once, at debug', async (t) => {
  const lines: Array<{ msg: string, level: number, taskId?: string }> = []
  const stream = { write: (line: string) => { lines.push(JSON.parse(line)) } }
  const app = await build(t, {}, { logger: { level: 'debug', stream } })
  await app.inject(`/api/runs/${rid}/blocked`)
  await app.inject(`/api/runs/${rid}`)
  const leftOut = lines.filter((line) => line.msg.includes('left out of the blocked list'))
  t.same(leftOut.map((line) => line.taskId).sort(), ['c-no-attempt', 'd-no-question', 'e-dangling'], 'each left-out task once')
  t.ok(leftOut.every((line) => line.level === 20), 'at debug')
})
