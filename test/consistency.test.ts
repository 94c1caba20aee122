import { sql } from 'kysely'
import t from 'tap'
import { build } from './helpers/app.ts'
import { insertGraph, makeRun, makeTask, uid, writer } from './helpers/fixtures.ts'

// A run detail is one snapshot: while another connection keeps moving tasks
// between statuses (and adding and removing tasks), every read agrees with
// itself: sum(task_counts) = total_tasks = tasks.length, counts match the list.

const RUN = 'run-busy'
const READS = 300
const statuses = ['ready', 'running', 'blocked', 'done', 'failed']

t.before(() => insertGraph({
  runs: [makeRun({ run_id: RUN })],
  tasks: Array.from({ length: 60 }, (_, i) => makeTask({ run_id: RUN, task_id: `t-${String(i).padStart(3, '0')}`, status: statuses[i % statuses.length] }))
}))

interface Detail { task_counts: Record<string, number>, total_tasks: number, tasks: Array<{ status: string, task_id: string }>, blocked_tasks: Array<{ task: { status: string } }> }

function countByStatus (tasks: Array<{ status: string }>) {
  const counts: Record<string, number> = {}
  for (const task of tasks) counts[task.status] = (counts[task.status] ?? 0) + 1
  return counts
}

t.test('run detail counts always agree with its task list under concurrent writes', async (t) => {
  const app = await build(t)
  const db = await writer()
  let writing = true
  let transactions = 0
  const writerLoop = (async () => {
    while (writing) { // eslint-disable-line no-unmodified-loop-condition -- cleared once the reads are done
      await db.transaction().execute(async (trx) => {
        // Several statements per transaction: a reader between them would see a torn state.
        await sql`update tasks set status = (array['ready','running','blocked','done','failed'])[1 + floor(random() * 5)::int],
                  updated_at = now() where run_id = ${RUN} and random() < 0.3`.execute(trx)
        await trx.insertInto('tasks').values(makeTask({ run_id: RUN, task_id: uid('extra'), status: 'ready' })).execute()
        await sql`delete from tasks where run_id = ${RUN} and task_id = (
                    select task_id from tasks where run_id = ${RUN} and task_id like 'extra-%' order by random() limit 1)
                  and random() < 0.5`.execute(trx)
        await sql`update tasks set status = 'done' where run_id = ${RUN} and status = 'blocked' and random() < 0.5`.execute(trx)
      })
      transactions++
    }
  })()

  let checked = 0
  const distinctTotals = new Set<number>()
  try {
    for (let batch = 0; batch < READS / 4; batch++) {
      const responses = await Promise.all([
        app.inject(`/api/runs/${RUN}`), app.inject(`/api/runs/${RUN}`), app.inject(`/api/runs/${RUN}`), app.inject('/api/runs')
      ])
      for (const res of responses.slice(0, 3)) {
        const detail: Detail = res.json().run
        const sum = Object.values(detail.task_counts).reduce((a, b) => a + b, 0)
        if (sum !== detail.total_tasks || detail.total_tasks !== detail.tasks.length) {
          t.fail('counts disagree with the list', { sum, total: detail.total_tasks, listed: detail.tasks.length })
        }
        t.same(detail.task_counts, countByStatus(detail.tasks), 'each status count matches the list', { diagnostic: false })
        const blockedInList = detail.tasks.filter((task) => task.status === 'blocked').length
        if (detail.blocked_tasks.length > blockedInList) t.fail('more blocked tasks than blocked statuses')
        distinctTotals.add(detail.total_tasks)
        checked++
      }
      const listItem = responses[3]!.json().runs.find((item: { run: { run_id: string } }) => item.run.run_id === RUN)
      const listSum = Object.values(listItem.task_counts as Record<string, number>).reduce((a, b) => a + b, 0)
      if (listSum !== listItem.total_tasks) t.fail('run list counts disagree with its total')
    }
  } finally {
    writing = false
    await writerLoop
  }
  t.equal(checked, READS - READS / 4, `${checked} run-detail reads checked`)
  t.ok(transactions > 10, `the writer committed ${transactions} transactions meanwhile`)
  t.ok(distinctTotals.size > 1, 'the reads saw the data change')
})
