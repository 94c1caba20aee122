import { createServer } from 'node:net'
import t from 'tap'
import { DemoOrchestrator, seededRandom } from '../demo.ts'
import { postMessage, recordChange } from '../db/writer.ts'
import { build } from './helpers/app.ts'
import { assertSchema } from './helpers/contract.ts'
import { testDatabaseUrl } from './helpers/database.ts'
import { runAsUser } from './helpers/docs.ts'
import { writer } from './helpers/fixtures.ts'
import { root, runScript } from './helpers/run.ts'
import { openStream } from './helpers/sse.ts'

// The demo's simulated orchestrator, written through db/writer.ts: every
// event type of docs/reference.md, "Event types" reaches a subscriber, and the API reads
// consistent state all along.

const EVENT_TYPES = [
  'task_added', 'task_ready', 'task_dispatched', 'task_running', 'task_blocked', 'task_answered', 'task_done', 'task_failed',
  'thread_claim', 'thread_update', 'thread_reply', 'thread_result', 'council_tallied', 'council_report_persisted'
]

t.test('the demo produces every event type, which a subscriber sees', async (t) => {
  const app = await build(t, { EVENTS_POLL_INTERVAL_MS: 20 })
  await app.listen({ port: 0, host: '127.0.0.1' })
  const { port } = app.server.address() as { port: number }
  const stream = await openStream(`http://127.0.0.1:${port}`, '/api/events/stream')
  t.teardown(stream.close)
  await stream.waitFor((s) => s.frames.length >= 1)

  const orchestrator = new DemoOrchestrator(await writer(), seededRandom(42), 'test')
  const seen = () => new Set(stream.events().map((event) => event.event_type as string))
  let steps = 0
  while (steps < 600 && !EVENT_TYPES.every((type) => seen().has(type))) {
    await orchestrator.step()
    steps++
    if (steps % 25 === 0) await new Promise((resolve) => setTimeout(resolve, 60)) // let the poller deliver
  }
  await stream.waitFor((s) => EVENT_TYPES.every((type) => new Set(s.events().map((event) => event.event_type as string)).has(type)))
  t.same(EVENT_TYPES.filter((type) => !seen().has(type)), [], `every event type of the contract within ${steps} steps`)
  const ids = stream.events().map((event) => event.event_id)
  t.same(ids, [...ids].sort((a, b) => a - b), 'ascending')

  // Runs end both ways: every task accepted, or some failed.
  const statuses = async () => new Set(((await app.inject('/api/runs')).json().runs as Array<{ run: { status: string } }>).map((item) => item.run.status))
  while (steps < 1500 && !((await statuses()).has('done') && (await statuses()).has('failed'))) {
    await orchestrator.step()
    steps++
  }
  t.ok((await statuses()).has('done') && (await statuses()).has('failed'), `runs finished done and failed within ${steps} steps`)

  // The state it wrote reads back through the API, consistently.
  const runs = (await app.inject('/api/runs')).json().runs as Array<{ run: { run_id: string } }>
  t.ok(runs.length >= 2)
  for (const { run } of runs) {
    const detail = await app.inject(`/api/runs/${run.run_id}`)
    assertSchema(t, 'RunDetailEnvelope', detail.json())
    const { tasks, blocked_tasks: blocked, total_tasks: total } = detail.json().run
    t.equal(tasks.length, total)
    for (const item of blocked) t.equal(item.question.kind, 'question', `${run.run_id}: a blocked task shows its question`)
  }
})

t.test('a message of a kind with no event of its own is announced as thread_update', async (t) => {
  const db = await writer()
  await db.insertInto('runs').values({ run_id: 'run-note', goal: 'g', summary: '', status: 'running' }).execute()
  await db.insertInto('threads').values({ thread_id: 'thread-note', run_id: 'run-note', task_id: 't', subject: 's', created_by: 'a', assigned_to: 'b', status: 'open', priority: 'low' }).execute()
  const id = await postMessage(db, { run_id: 'run-note', task_id: 't' }, { message_id: 'msg-note', thread_id: 'thread-note', from_agent: 'a', to_agent: 'b', kind: 'note', summary: 'a note', body: '', payload_json: '{}' })
  const event = await db.selectFrom('events').selectAll().where('event_id', '=', String(id)).executeTakeFirstOrThrow()
  t.match(event, { event_type: 'thread_update', run_id: 'run-note', task_id: 't', thread_id: 'thread-note', summary: 'a note' })
  const thread = await db.selectFrom('threads').select('latest_message_id').where('thread_id', '=', 'thread-note').executeTakeFirstOrThrow()
  t.equal(thread.latest_message_id, 'msg-note', 'and becomes the thread\'s latest message')
})

t.test('recordChange commits the change and its event together, or neither', async (t) => {
  const db = await writer()
  const before = Number((await db.selectFrom('events').select(db.fn.countAll<string>().as('n')).executeTakeFirstOrThrow()).n)
  await t.rejects(recordChange(db, { event_type: 'task_added', run_id: 'nowhere' }, async (trx) => {
    await trx.insertInto('tasks').values({ run_id: 'no-such-run', task_id: 't', title: 't', summary: '', status: 'ready', priority: 'low', acceptance_json: '{}' }).execute()
  }), 'a change that fails')
  const after = Number((await db.selectFrom('events').select(db.fn.countAll<string>().as('n')).executeTakeFirstOrThrow()).n)
  t.equal(after, before, 'leaves no event behind')
})

t.test('npm run demo checks its settings before it builds; a port in use is named by PORT', async (t) => {
  /** npm's lines of a script it ran: the build's would be there had it started. */
  const built = (stdout: string) => /> ocp-api@\S+ build\n/.test(stdout)
  const badPort = await runAsUser(['npm', 'run', 'demo'], root, { PORT: '99999' })
  t.equal(badPort.code, 1)
  t.match(badPort.stderr, /^invalid configuration: env\/PORT must be <= 65535\n/)
  t.notOk(built(badPort.stdout), 'said before the build')
  const badInterval = await runAsUser(['npm', 'run', 'demo'], root, { DEMO_INTERVAL_MS: 'soon' })
  t.equal(badInterval.code, 1)
  t.match(badInterval.stderr, /^invalid configuration: env\/DEMO_INTERVAL_MS must be integer\n/, 'the demo\'s own setting too')
  t.notOk(built(badInterval.stdout))

  const taken = createServer()
  await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve))
  t.teardown(() => taken.close())
  const { port } = taken.address() as { port: number }
  const inUse = `port ${port} is in use: set PORT to another port\n`
  const busy = await runAsUser(['npm', 'run', 'demo'], root, { HOST: '127.0.0.1', PORT: String(port) })
  t.equal(busy.code, 1)
  t.match(busy.stderr, new RegExp(`^${inUse}`))
  t.notOk(built(busy.stdout), 'said before the build')
  // The demo itself (built, or run without npm), when the port was taken after the check: the same words.
  const demo = await runScript('demo.ts', { DATABASE_URL: await testDatabaseUrl(), HOST: '127.0.0.1', PORT: String(port), LOG_LEVEL: 'silent' })
  t.equal(demo.code, 1)
  t.equal(demo.stderr, inUse)
  // The check npm runs, run here as it is (with this process's coverage).
  const free = await runScript(['scripts/check-settings.ts', '--demo'], { HOST: '127.0.0.1', PORT: '0' })
  t.equal(free.code, 0, 'good settings pass, silently')
  t.equal(free.stderr, '')
  const refused = await runScript(['scripts/check-settings.ts', '--demo'], { HOST: '127.0.0.1', PORT: String(port) })
  t.equal(refused.code, 1)
  t.equal(refused.stderr, inUse)
})
