import t from 'tap'
import { createClient, type Event, type RunDetail } from '../client/src/index.ts'
import { testDatabaseUrl } from './helpers/database.ts'
import { insertGraph, makeRun, makeTask, writer } from './helpers/fixtures.ts'
import { startNginx } from './helpers/nginx.ts'
import { startReplicas } from './helpers/replicas.ts'
import { sleep, waitUntil } from './helpers/wait.ts'

// ocp-api-client through nginx in front of three replicas, one of which is
// killed while it watches: watch resumes on another and loses nothing;
// liveRun hands out only whole reads, and after a quiet period its last
// snapshot equals a fresh read.

const TASKS = ['t-1', 't-2', 't-3', 't-4']

t.before(() => insertGraph({
  runs: [makeRun({ run_id: 'run-lb', status: 'running' })],
  tasks: TASKS.map((taskId) => makeTask({ run_id: 'run-lb', task_id: taskId, status: 'ready' }))
}))

t.test('a replica dies under liveRun and watch: nothing lost, the last snapshot is a fresh read', async (t) => {
  const replicas = await startReplicas(t, await testDatabaseUrl(), 3)
  const lb = await startNginx(t, replicas.map((replica) => replica.port))
  const client = createClient({ url: lb })

  const snapshots: RunDetail[] = []
  const lives = Array.from({ length: 3 }, () => client.liveRun('run-lb', (body) => snapshots.push(body.run), { maxDelayMs: 500 }))
  t.teardown(() => { for (const live of lives) live.close() })
  const { eventCursor: start } = await client.runRead('run-lb')
  const received: Event[] = []
  const controller = new AbortController()
  t.teardown(() => controller.abort())
  const watching = (async () => { for await (const event of client.watch({ run_id: 'run-lb' }, { after: start!, signal: controller.signal, maxDelayMs: 500 })) received.push(event) })()
  await waitUntil(() => snapshots.length >= 3, 'the first snapshots', 60_000)

  const db = await writer()
  const written: number[] = []
  const statuses = ['running', 'blocked', 'done', 'failed']
  for (let i = 0; i < 60; i++) {
    if (i === 20) replicas[0]!.process.kill('SIGKILL')
    if (i === 40) replicas[1]!.process.kill('SIGKILL')
    const row = await db.transaction().execute(async (trx) => {
      await trx.updateTable('tasks').set({ status: statuses[i % statuses.length]!, updated_at: new Date() }).where('run_id', '=', 'run-lb').where('task_id', '=', TASKS[i % TASKS.length]!).execute()
      return await trx.insertInto('events').values({ event_type: 'task_update', run_id: 'run-lb', task_id: TASKS[i % TASKS.length]! }).returning('event_id').executeTakeFirstOrThrow()
    })
    written.push(Number(row.event_id))
    await sleep(20)
  }
  await waitUntil(() => received.length >= written.length, 'every event through the proxy', 60_000)
  t.same(received.map((event) => event.event_id), written, 'watch: every event once, in order, across two replicas killed')

  let count = -1
  await waitUntil(async () => { const now = snapshots.length; if (now === count) return true; count = now; await sleep(1000); return false }, 'a quiet period', 60_000)
  const fresh = (await client.run('run-lb')).run
  for (const snapshot of snapshots) {
    const counted = Object.values(snapshot.task_counts).reduce((sum, n) => sum + n, 0)
    if (counted !== snapshot.tasks.length || snapshot.total_tasks !== snapshot.tasks.length) t.fail('a snapshot that is not a whole read')
  }
  t.pass(`${snapshots.length} snapshots for 3 live runs and 60 writes, each a whole read`)
  // Each live run's last snapshot: the last three handed out are one per live run only if they ended together; check the final state instead.
  t.same(snapshots.at(-1), fresh, 'the last snapshot equals a fresh read')
  controller.abort()
  await watching
})
