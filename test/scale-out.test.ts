import { EventSource } from 'eventsource'
import t from 'tap'
import { testDatabaseUrl, testPool } from './helpers/database.ts'
import { answers, startNginx } from './helpers/nginx.ts'
import { startReplicas } from './helpers/replicas.ts'
import { insertEvents } from './helpers/sse.ts'
import { sleep, waitUntil } from './helpers/wait.ts'

// Three replicas behind Debian's nginx, with the config shipped in
// deploy/nginx: one replica is killed while clients stream through the
// proxy; their EventSources reconnect to the others, resume from
// Last-Event-ID, and receive every event exactly once, while writers commit
// out of order, some roll back, and some stay open for a second.

const REPLICAS = 3
const CLIENTS = 6

t.test('a replica dies under streaming clients: every event arrives once, in order', async (t) => {
  const databaseUrl = await testDatabaseUrl()

  const replicas = await startReplicas(t, databaseUrl, REPLICAS)
  const lb = await startNginx(t, replicas.map((replica) => replica.port))

  // Clients stream through the proxy: half unfiltered, half for one run.
  const [base] = await insertEvents({ event_type: 'base' })
  const clients = Array.from({ length: CLIENTS }, (_, i) => {
    const filtered = i % 2 === 1
    const source = new EventSource(`${lb}/api/events/stream?after_event_id=${base}${filtered ? '&run_id=so-run' : ''}`)
    const client = { filtered, source, received: [] as number[], opens: 0 }
    source.onopen = () => { client.opens++ }
    source.onmessage = (message) => { client.received.push(JSON.parse(message.data).event_id) }
    return client
  })
  t.teardown(() => { for (const client of clients) client.source.close() })
  await waitUntil(() => clients.every((client) => client.opens === 1), 'the clients to connect', 60_000)

  // Writers commit events out of order (four at a time, sleeping at random
  // around the insert), some roll back, some hold their transaction open
  // for a second; one replica is killed in the middle.
  const written: Array<{ id: number, run: string }> = []
  const pool = testPool(databaseUrl, 4)
  t.teardown(() => pool.end())
  const writeOne = async (i: number) => {
    const connection = await pool.connect()
    try {
      const run = i % 3 === 0 ? 'other-run' : 'so-run'
      await connection.query('begin')
      await connection.query('select pg_sleep($1)', [Math.random() * 0.02])
      const { rows: [row] } = await connection.query(
        'insert into events (event_type, run_id, summary) values ($1, $2, $3) returning event_id', ['task_added', run, `event ${i}`])
      await connection.query('select pg_sleep($1)', [i % 20 === 5 ? 1 : Math.random() * 0.02])
      if (i % 9 === 4) {
        await connection.query('rollback')
        return
      }
      await connection.query('commit')
      written.push({ id: Number(row.event_id), run })
    } finally {
      connection.release()
    }
  }
  const writing = (async () => {
    for (let i = 0; i < 80; i += 4) await Promise.all([i, i + 1, i + 2, i + 3].map(writeOne))
  })()
  await sleep(500)
  replicas[0]!.process.kill('SIGKILL')
  await writing
  written.sort((a, b) => a.id - b.id)

  const all = written.map((event) => event.id)
  const forRun = written.filter((event) => event.run === 'so-run').map((event) => event.id)
  await waitUntil(() => clients.every((client) => client.received.length >= (client.filtered ? forRun : all).length), 'every event at every client', 60_000)
  for (const [i, client] of clients.entries()) {
    t.same(client.received, client.filtered ? forRun : all, `client ${i} (${client.filtered ? 'run filter' : 'unfiltered'}): every event once, in order`)
  }
  const reconnected = clients.filter((client) => client.opens > 1).length
  t.ok(reconnected >= 1, `${reconnected} of ${CLIENTS} clients were on the killed replica and reconnected to another`)
  t.ok(await answers(`${lb}/api/runs`), 'the proxy still serves reads through the surviving replicas')
})
