import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import type { FastifyInstance } from 'fastify'
import type { BlockedTask, BlockedTaskList, Event, EventList, RunDetail, RunDetailEnvelope, RunList, Task, ThreadDetail, ThreadDetailEnvelope } from '../client/src/index.ts'
import t, { type Test } from 'tap'
import { build } from './helpers/app.ts'
import { assertSchema } from './helpers/contract.ts'
import { testDatabaseUrl, withAdmin } from './helpers/database.ts'
import { root } from './helpers/run.ts'

// docs/orchestrators.md, "A run, step by step": its SQL, taken from the
// page itself so that the two cannot drift, runs block by block on this
// file's migrated database, and after each step the API says what a reader
// must see: statuses, counts, the blocked task and its question, the
// answer, the thread, and the run's events in order.

const guide = readFileSync(join(root, 'docs/orchestrators.md'), 'utf8')
const SECTION = '## A run, step by step'

interface Step { title: string, sql: string }

/** The walk-through's steps: each `### ` heading of the section, with its one SQL block. */
function walkThrough (): Step[] {
  const start = guide.indexOf(`\n${SECTION}\n`)
  if (start < 0) throw new Error(`docs/orchestrators.md has no section "${SECTION}"`)
  const end = guide.indexOf('\n## ', start + 1)
  const section = guide.slice(start, end < 0 ? undefined : end)
  return section.split('\n### ').slice(1).map((part) => {
    const blocks = [...part.matchAll(/^```sql\n([\s\S]*?)^```$/gm)].map((match) => match[1]!)
    const title = part.slice(0, part.indexOf('\n'))
    if (blocks.length !== 1) throw new Error(`docs/orchestrators.md, "${title}": ${blocks.length} SQL blocks, where a step has one`)
    return { title, sql: blocks[0]! }
  })
}

const RUN = 'run-42'

/** An event of the run, as a subset of its fields (ids left out are ''). */
type ExpectedEvent = { event_type: string, task_id?: string, thread_id?: string, summary?: string, payload?: unknown }

interface Expectation {
  /** The events the step adds to the run's log, in order. */
  events: ExpectedEvent[]
  /** What the API answers after it. */
  check: (t: Test, api: Api) => Promise<void>
}

/** The reads a reader makes, each checked against its schema. */
interface Api {
  run: () => Promise<RunDetail>
  blocked: () => Promise<BlockedTask[]>
  thread: (id: string) => Promise<ThreadDetail>
  runsIn: (status: string) => Promise<string[]>
  events: (filter: string) => Promise<Event[]>
}

/** A GET that must answer 200 with a body of its schema. */
async function read<Body> (t: Test, app: FastifyInstance, url: string, schema: string): Promise<Body> {
  const res = await app.inject(url)
  t.equal(res.statusCode, 200, `GET ${url}`)
  const body = res.json<Body>()
  assertSchema(t, schema, body, `GET ${url}: ${schema}`)
  return body
}

const byId = (tasks: Task[], id: string) => tasks.find((task) => task.task_id === id)

/** The steps of docs/orchestrators.md, in its order, with what each must leave behind. */
const expectations: Record<string, Expectation> = {
  'Create a run': {
    events: [{ event_type: 'run_created', summary: 'Migrate billing to the new ledger', payload: {} }],
    async check (t, api) {
      const detail = await api.run()
      t.has(detail.run, { run_id: RUN, goal: 'Migrate billing to the new ledger', status: 'running', summary: '' }, 'summary left out: \'\'')
      t.equal(detail.run.created_at, detail.run.updated_at, 'both stamped by their default')
      t.same([detail.task_counts, detail.total_tasks, detail.tasks, detail.blocked_tasks], [{}, 0, [], []])
      t.same(await api.runsIn('running'), [RUN], 'listed under its status')
    }
  },
  'Add its tasks': {
    events: [
      { event_type: 'task_added', task_id: 'task-1', summary: 'Write the design note', payload: {} },
      { event_type: 'task_added', task_id: 'task-2', summary: 'Port the API handlers', payload: {} }
    ],
    async check (t, api) {
      const detail = await api.run()
      t.same(detail.task_counts, { added: 2 })
      t.equal(detail.total_tasks, 2)
      t.same(detail.tasks.map((task) => task.task_id), ['task-1', 'task-2'], 'one created_at: ordered by task_id')
      t.has(detail.tasks[0], { title: 'Write the design note', summary: '', priority: 'high', default_to: 'worker-ada', acceptance_json: { criteria: ['reviewed'] } })
      t.notOk('default_to' in detail.tasks[1]!, 'a NULL default_to is omitted')
      t.notOk('latest_attempt_no' in detail.tasks[1]!, 'no attempt yet')
    }
  },
  'Mark them ready': {
    events: ['task-1', 'task-2'].map((task) => ({ event_type: 'task_ready', task_id: task, payload: { status: 'ready' } })),
    async check (t, api) {
      const detail = await api.run()
      t.same(detail.task_counts, { ready: 2 })
      for (const task of detail.tasks) {
        t.has(task, { status: 'ready', summary: 'Ready to dispatch' })
        t.ok(task.updated_at > task.created_at, `${task.task_id}: updated_at set by the update`)
      }
    }
  },
  Dispatch: {
    events: [
      { event_type: 'task_dispatched', task_id: 'task-1', thread_id: 'thread-1', payload: {} },
      { event_type: 'task_dispatched', task_id: 'task-2', thread_id: 'thread-2', payload: {} }
    ],
    async check (t, api) {
      const detail = await api.run()
      t.same(detail.task_counts, { dispatched: 2 })
      t.same(detail.tasks.map((task) => task.latest_attempt_no), [1, 1])
      for (const [thread, task, worker] of [['thread-1', 'task-1', 'worker-ada'], ['thread-2', 'task-2', 'worker-grace']]) {
        const found = await api.thread(thread!)
        t.has(found.thread, { run_id: RUN, task_id: task, assigned_to: worker, created_by: 'orchestrator', status: 'open' })
        t.same(found.messages, [], `${thread}: no message yet`)
      }
    }
  },
  Claim: {
    events: [{ event_type: 'thread_claim', task_id: 'task-1', thread_id: 'thread-1', payload: {} }],
    async check (t, api) {
      t.equal((await api.thread('thread-1')).thread.status, 'claimed')
      t.equal((await api.thread('thread-2')).thread.status, 'open', 'the other thread is unclaimed')
    }
  },
  Running: {
    events: [{ event_type: 'task_running', task_id: 'task-1', payload: { status: 'running' } }],
    async check (t, api) {
      const detail = await api.run()
      t.same(detail.task_counts, { dispatched: 1, running: 1 })
      t.has(byId(detail.tasks, 'task-1'), { status: 'running', summary: 'Work started' })
    }
  },
  'Block with a question': {
    events: [
      { event_type: 'thread_update', task_id: 'task-1', thread_id: 'thread-1', summary: 'Which time zone should reports use?', payload: { kind: 'question', message_id: 'msg-1' } },
      { event_type: 'task_blocked', task_id: 'task-1', payload: { status: 'blocked' } }
    ],
    async check (t, api) {
      const detail = await api.run()
      t.same(detail.task_counts, { blocked: 1, dispatched: 1 })
      const blocked = await api.blocked()
      t.equal(blocked.length, 1, 'the task is in the blocked list')
      t.has(blocked[0], {
        task: { task_id: 'task-1', status: 'blocked', latest_attempt_no: 1 },
        attempt: { attempt_no: 1, assigned_to: 'worker-ada', thread_id: 'thread-1', status: 'running', base_ref: 'main', branch_name: 'task/task-1-1' },
        question: {
          message_id: 'msg-1',
          thread_id: 'thread-1',
          kind: 'question',
          from_agent: 'worker-ada',
          to_agent: 'orchestrator',
          summary: 'Which time zone should reports use?',
          payload_json: { options: ['read time', 'write time'] },
          artifacts: []
        }
      })
      t.match(blocked[0]!.question.body, /^The legacy jobs use server-local time/)
      t.same(detail.blocked_tasks, blocked, 'the run detail holds the same blocked task')
      const thread = await api.thread('thread-1')
      t.equal(thread.thread.latest_message_id, 'msg-1')
      t.same(thread.messages.map((message) => message.message_id), ['msg-1'])
    }
  },
  Answer: {
    events: [
      { event_type: 'thread_reply', task_id: 'task-1', thread_id: 'thread-1', payload: { kind: 'answer', message_id: 'msg-2' } },
      { event_type: 'task_answered', task_id: 'task-1', thread_id: 'thread-1', summary: 'Convert at read time', payload: {} }
    ],
    async check (t, api) {
      const detail = await api.run()
      t.same(detail.task_counts, { dispatched: 1, running: 1 })
      t.same(await api.blocked(), [], 'no longer blocked')
      const thread = await api.thread('thread-1')
      t.equal(thread.thread.latest_message_id, 'msg-2')
      t.same(thread.messages.map((message) => [message.kind, message.from_agent]), [['question', 'worker-ada'], ['answer', 'orchestrator']], 'the question, then its answer')
      t.has(thread.messages[1], { summary: 'Convert at read time', payload_json: { decision: 'read time' } })
    }
  },
  Finish: {
    events: [
      { event_type: 'thread_result', task_id: 'task-1', thread_id: 'thread-1', payload: { kind: 'result', message_id: 'msg-3' } },
      { event_type: 'task_done', task_id: 'task-1', summary: 'Accepted', payload: { status: 'done' } }
    ],
    async check (t, api) {
      const detail = await api.run()
      t.same(detail.task_counts, { dispatched: 1, done: 1 })
      t.has(byId(detail.tasks, 'task-1'), { status: 'done', summary: 'Accepted' })
      const thread = await api.thread('thread-1')
      t.equal(thread.thread.latest_message_id, 'msg-3')
      t.same(thread.messages.map((message) => message.kind), ['question', 'answer', 'result'])
      t.has(thread.messages[2]!.artifacts, [{ artifact_id: 'artifact-1', path: 'design/ledger.md', kind: 'report', metadata_json: { lines: 120 } }])
    }
  },
  Fail: {
    events: [{ event_type: 'task_failed', task_id: 'task-2', summary: 'Not claimed within 10 minutes', payload: { status: 'failed' } }],
    async check (t, api) {
      const detail = await api.run()
      t.same(detail.task_counts, { done: 1, failed: 1 })
      t.has(byId(detail.tasks, 'task-2'), { status: 'failed', summary: 'Not claimed within 10 minutes' })
      t.equal(detail.run.status, 'running', 'the run goes on until the orchestrator ends it')
    }
  },
  'The council': {
    events: [
      { event_type: 'council_tallied', summary: '1 of 2 tasks accepted', payload: { approve: 1, reject: 1 } },
      { event_type: 'council_report_persisted', payload: { path: 'reports/run-42.md' } }
    ],
    async check (t, api) {
      t.equal((await api.run()).run.status, 'running', 'no table changed')
    }
  },
  'End the run': {
    events: [{ event_type: 'run_status', summary: 'Finished: 1 of 2 tasks done', payload: { status: 'failed' } }],
    async check (t, api) {
      const { run } = await api.run()
      t.has(run, { status: 'failed', summary: 'Finished: 1 of 2 tasks done' })
      t.ok(run.updated_at > run.created_at, 'updated_at set by the update')
      t.same(await api.runsIn('failed'), [RUN])
      t.same(await api.runsIn('running'), [], 'no longer running')
    }
  }
}

t.test('every SQL block of docs/orchestrators.md is a step of the walk-through, and every step is checked here', async (t) => {
  const steps = walkThrough()
  t.equal(steps.length, [...guide.matchAll(/^```sql$/gm)].length, 'no SQL outside the walk-through')
  t.same(steps.map((step) => step.title), Object.keys(expectations), 'the steps, in order')
})

t.test('the walk-through, step by step, as the API reads it', async (t) => {
  const app = await build(t)
  const url = await testDatabaseUrl()
  const api = (t: Test): Api => ({
    run: async () => (await read<RunDetailEnvelope>(t, app, `/api/runs/${RUN}`, 'RunDetailEnvelope')).run,
    blocked: async () => (await read<BlockedTaskList>(t, app, `/api/runs/${RUN}/blocked`, 'BlockedTaskList')).blocked,
    thread: async (id) => (await read<ThreadDetailEnvelope>(t, app, `/api/threads/${id}`, 'ThreadDetailEnvelope')).thread,
    runsIn: async (status) => (await read<RunList>(t, app, `/api/runs?status=${status}`, 'RunList')).runs.map((item) => item.run.run_id),
    events: async (filter) => (await read<EventList>(t, app, `/api/events?${filter}`, 'EventList')).events
  })
  const logged: ExpectedEvent[] = []
  for (const step of walkThrough()) {
    const expected = expectations[step.title]!
    await t.test(step.title, async (t) => {
      await withAdmin(url, (client) => client.query(step.sql))
      logged.push(...expected.events)
      const events = await api(t).events(`run_id=${RUN}`)
      t.same(events.map((event) => event.event_type), logged.map((event) => event.event_type), 'the run\'s events, in order')
      events.forEach((event, i) => t.has(event, { run_id: RUN, task_id: '', thread_id: '', ...logged[i] }, `event ${i + 1}: ${event.event_type}`))
      t.ok(events.every((event, i) => i === 0 || event.event_id > events[i - 1]!.event_id), 'ascending ids')
      await expected.check(t, api(t))
    })
  }
  const threadEvents = await api(t).events('thread_id=thread-1')
  t.same(threadEvents.map((event) => event.event_type),
    ['task_dispatched', 'thread_claim', 'thread_update', 'thread_reply', 'task_answered', 'thread_result'], 'a thread\'s stream: the events carrying its id')
})
