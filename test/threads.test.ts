import t from 'tap'
import { build } from './helpers/app.ts'
import { assertSchema } from './helpers/contract.ts'
import { insertGraph, json, makeArtifact, makeMessage, makeRun, makeTask, makeThread } from './helpers/fixtures.ts'

// Thread detail: the thread, its messages in order, each with its artifacts.

const same = '2026-02-02T02:02:02.000Z'
const run = makeRun({ run_id: 'run-t' })
const task = makeTask({ run_id: 'run-t', task_id: 'task-t' })
const thread = makeThread({ run_id: 'run-t', task_id: 'task-t', thread_id: 'thread-full', latest_message_id: 'm-3', subject: 'Décision 🚀' })
const bare = makeThread({ run_id: 'run-t', task_id: 'task-t', thread_id: 'thread-bare' })
const messages = [
  makeMessage({ thread_id: 'thread-full', message_id: 'm-1', kind: 'claim', payload_json: json({ a: { b: [null] } }) }),
  makeMessage({ thread_id: 'thread-full', message_id: 'm-3', created_at: same, payload_json: json([]) }),
  makeMessage({ thread_id: 'thread-full', message_id: 'm-2', created_at: same, payload_json: json('text'), body: 'line 1\nline "2"\t\\' })
]
const artifacts = [
  makeArtifact({ message_id: 'm-1', artifact_id: 'x-late', created_at: '2026-09-09T00:00:00.000Z', metadata_json: json(7) }),
  makeArtifact({ message_id: 'm-1', artifact_id: 'x-b', created_at: same }),
  makeArtifact({ message_id: 'm-1', artifact_id: 'x-a', created_at: same, metadata_json: json(null) })
]

t.before(() => insertGraph({ runs: [run], tasks: [task], threads: [thread, bare], messages, artifacts }))

t.test('getThreadDetail: every field, messages and artifacts in order', async (t) => {
  const app = await build(t)
  const res = await app.inject('/api/threads/thread-full')
  t.equal(res.statusCode, 200)
  t.match(res.headers['content-type'], /^application\/json/)
  assertSchema(t, 'ThreadDetailEnvelope', res.json())
  const detail = res.json().thread
  t.same(detail.thread, {
    thread_id: 'thread-full',
    run_id: 'run-t',
    task_id: 'task-t',
    subject: 'Décision 🚀',
    created_by: 'orchestrator',
    assigned_to: 'worker-1',
    status: 'open',
    priority: 'normal',
    latest_message_id: 'm-3',
    created_at: detail.thread.created_at,
    updated_at: detail.thread.updated_at
  })
  t.equal(new Date(detail.thread.created_at).toISOString(), thread.created_at)
  t.same(detail.messages.map((message: { message_id: string }) => message.message_id), ['m-1', 'm-2', 'm-3'],
    'created_at asc, then message_id asc')
  const [first, second, third] = detail.messages
  t.same(first.payload_json, { a: { b: [null] } })
  t.equal(second.payload_json, 'text')
  t.same(third.payload_json, [])
  t.equal(second.body, 'line 1\nline "2"\t\\', 'text is escaped and round-trips')
  t.same(first.artifacts.map((artifact: { artifact_id: string }) => artifact.artifact_id), ['x-a', 'x-b', 'x-late'])
  t.equal(first.artifacts[0].metadata_json, null)
  t.ok('metadata_json' in first.artifacts[0])
  t.equal(first.artifacts[2].metadata_json, 7)
  t.same(first.artifacts[2], {
    artifact_id: 'x-late', message_id: 'm-1', path: 'out/report.txt', kind: 'file', metadata_json: 7, created_at: '2026-09-09T00:00:00.000000Z'
  })
  t.same(second.artifacts, [], 'artifacts always present, possibly empty')
  t.same(Object.keys(first).sort(), [
    'artifacts', 'body', 'created_at', 'from_agent', 'kind', 'message_id', 'payload_json', 'summary', 'thread_id', 'to_agent'
  ])
})

t.test('a thread without messages, and a NULL latest_message_id', async (t) => {
  const app = await build(t)
  const res = await app.inject('/api/threads/thread-bare')
  t.equal(res.statusCode, 200)
  const detail = res.json().thread
  t.same(detail.messages, [])
  t.notOk('latest_message_id' in detail.thread, 'omitted, not null')
})

t.test('an unknown thread answers 404 not_found', async (t) => {
  const app = await build(t)
  const res = await app.inject('/api/threads/nope')
  t.equal(res.statusCode, 404)
  t.same(res.json(), { error: { code: 'not_found', message: 'thread not found' } })
})
