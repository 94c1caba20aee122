import { EventSource } from 'eventsource'
import pg from 'pg'
import t from 'tap'
import { migrateToLatest } from '../db/migrate.ts'
import { build } from './helpers/app.ts'
import { ownCluster } from './helpers/cluster.ts'
import { waitUntil } from './helpers/wait.ts'

// The database goes away under load, and comes back: reads answer 503
// within the timeout, /ready says 503, /health stays 200, nothing crashes;
// the service recovers by itself, and subscribers miss and repeat nothing.

const CONNECT_TIMEOUT_MS = 1000
const STATEMENT_TIMEOUT_MS = 1500

t.test('a database outage under load, and the recovery', async (t) => {
  const cluster = await ownCluster(t)
  await migrateToLatest(cluster.url)
  const seed = new pg.Client({ connectionString: cluster.url })
  await seed.connect()
  await seed.query("insert into runs (run_id, goal, summary, status) values ('run-x', 'g', 's', 'running')")
  await seed.end()

  const app = await build(t, {
    DATABASE_URL: cluster.url,
    DB_CONNECT_TIMEOUT_MS: CONNECT_TIMEOUT_MS,
    DB_STATEMENT_TIMEOUT_MS: STATEMENT_TIMEOUT_MS,
    EVENTS_POLL_INTERVAL_MS: 50,
    SSE_RETRY_MS: 200
  })
  await app.listen({ port: 0, host: '127.0.0.1' })
  const { port } = app.server.address() as { port: number }
  const base = `http://127.0.0.1:${port}`

  const writeEvents = async (count: number, runId: string) => {
    const writer = new pg.Client({ connectionString: cluster.url })
    await writer.connect()
    const ids: number[] = []
    for (let i = 0; i < count; i++) {
      const result = await writer.query("insert into events (event_type, run_id) values ('task_running', $1) returning event_id", [runId])
      ids.push(Number(result.rows[0].event_id))
    }
    await writer.end()
    return ids
  }

  // Subscribers (real EventSource clients): one for everything, one for run-x.
  const received = { all: [] as number[], run: [] as number[] }
  const all = new EventSource(`${base}/api/events/stream?after_event_id=0`)
  const run = new EventSource(`${base}/api/events/stream?run_id=run-x&after_event_id=0`)
  t.teardown(() => { all.close(); run.close() })
  all.onmessage = (message) => { received.all.push(JSON.parse(message.data).event_id) }
  run.onmessage = (message) => { received.run.push(JSON.parse(message.data).event_id) }
  const before = [...await writeEvents(5, 'run-x'), ...await writeEvents(3, 'other')]
  await waitUntil(() => received.all.length === before.length, 'the first events', 60_000)

  // Load: a steady stream of reads, before, during and after the outage.
  const statuses = new Map<number, number>()
  let slowest = 0
  let loading = true
  const load = (async () => {
    while (loading) { // eslint-disable-line no-unmodified-loop-condition -- cleared once every event has arrived
      const started = Date.now()
      let status = 0 // a connection refused or cut: must never happen
      try {
        const res = await fetch(`${base}/api/runs/run-x`)
        await res.arrayBuffer()
        status = res.status
      } catch {}
      statuses.set(status, (statuses.get(status) ?? 0) + 1)
      if (status !== 200) slowest = Math.max(slowest, Date.now() - started)
    }
  })()
  await new Promise((resolve) => setTimeout(resolve, 300))

  const lastBefore = await writeEvents(2, 'run-x') // committed, perhaps not yet polled, as the database dies
  cluster.stop()
  // How soon the service notices depends on its timeouts and a loaded machine: wait for it to.
  const pollerLag = async () => Number(/^event_poller_lag_seconds (\S+)$/m.exec(await (await fetch(`${base}/metrics`)).text())?.[1])
  await waitUntil(async () => (await fetch(`${base}/ready`)).status === 503, '/ready to say 503')
  await waitUntil(async () => await pollerLag() > 1, 'the poller lag to show the outage')

  const read = await fetch(`${base}/api/runs/run-x`)
  t.equal(read.status, 503, 'reads answer 503 during the outage')
  t.same(await read.json(), { error: { code: 'unavailable', message: 'the database is unavailable, try again shortly' } })
  t.equal((await fetch(`${base}/ready`)).status, 503, '/ready says 503')
  t.equal((await fetch(`${base}/health`)).status, 200, '/health stays 200')
  const lag = await pollerLag()
  t.ok(lag > 1, `the poller lag shows the outage (${lag} s)`)

  cluster.start()
  await waitUntil(() => statuses.get(200)! > 0 && received.all.length >= before.length + lastBefore.length, 'the recovery', 60_000)
  const after = await writeEvents(4, 'run-x')
  const expectedAll = [...before, ...lastBefore, ...after]
  const expectedRun = expectedAll.filter((id) => !before.slice(5).includes(id))
  await waitUntil(() => received.all.length >= expectedAll.length && received.run.length >= expectedRun.length, 'every event at both subscribers', 60_000)
  loading = false
  await load

  t.equal((await fetch(`${base}/ready`)).status, 200, 'ready again, by itself')
  t.equal((await fetch(`${base}/api/runs/run-x`)).status, 200)
  t.same(received.all, expectedAll, `unfiltered subscriber: all ${expectedAll.length} events once, in order, across the outage`)
  t.same(received.run, expectedRun, 'filtered subscriber: likewise')
  t.same([...statuses.keys()].filter((status) => status !== 200 && status !== 503), [], `only 200 and 503 under load (${[...statuses].map(([s, n]) => `${n} x ${s}`).join(', ')})`)
  t.ok(slowest <= CONNECT_TIMEOUT_MS + STATEMENT_TIMEOUT_MS + 1000, `a failing read answered within ${slowest} ms: never hangs`)
  t.equal(app.events.streams.size, 2, 'the two streams stayed open (paused), nothing leaked')
})
