import t from 'tap'
import { buildApp } from '../app.ts'
import { loadConfig } from '../config.ts'
import { migrateToLatest } from '../db/migrate.ts'
import { testPool, withDatabase } from './helpers/database.ts'
import { openStream } from './helpers/sse.ts'
import { startReplicatedPostgres, standbySkipReason } from './helpers/standby.ts'
import { waitUntil } from './helpers/wait.ts'

// The event order settled on a hot standby (docs/reference.md, "Read replicas"): writers
// commit out of order on the primary, some roll back, some stay open; the
// service reads only from the standby (as a role the primary refuses) and
// every stream still gets every committed event once, ascending, and a
// fetch-then-subscribe from X-Event-Cursor misses nothing.

const WRITERS = 32
const ROUNDS = 3

t.test('exactly-once, ascending, gap-free fetch-then-subscribe, through a hot standby', { skip: standbySkipReason() }, async (t) => {
  const pg15 = await startReplicatedPostgres(t)
  await pg15.createDatabase('ocp_order')
  const primary = withDatabase(pg15.primaryUrl, 'ocp_order')
  const reader = withDatabase(pg15.readerUrl, 'ocp_order')
  await migrateToLatest(primary)
  await pg15.waitForReplay()

  const config = loadConfig({ DATABASE_URL: primary, DATABASE_READ_URL: reader, LOG_LEVEL: 'info', MAX_EVENT_LOOP_DELAY_MS: '0' })
  const lines: Array<{ time: number, msg: string, waitingPid?: number }> = []
  const logStream = { write: (line: string) => { lines.push(JSON.parse(line)) } }
  const app = await buildApp({ ...config, EVENTS_POLL_INTERVAL_MS: 20, EVENTS_KEEPER_INTERVAL_MS: 50 }, { logger: { level: 'info', stream: logStream } })
  t.teardown(() => app.close())
  await app.listen({ port: 0, host: '127.0.0.1' })
  const url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`
  const primaryLogBefore = pg15.log('primary').length

  const pool = testPool(primary, WRITERS)
  t.teardown(() => pool.end())
  const base = Number((await pool.query("insert into events (event_type) values ('base') returning event_id")).rows[0].event_id)
  await pg15.waitForReplay()

  const runs = ['st-a', 'st-b']
  const streams = {
    all: await openStream(url, `/api/events/stream?after_event_id=${base}`),
    tail: await openStream(url, '/api/events/stream'),
    runA: await openStream(url, `/api/events/stream?after_event_id=${base}&run_id=st-a`)
  }
  for (const stream of Object.values(streams)) t.teardown(stream.close)
  await streams.tail.waitFor((s) => s.frames.length >= 1)

  const committed: Array<{ id: number, run: string }> = []
  let rolledBack = 0
  let fetched: { cursor: number, stream: Awaited<ReturnType<typeof openStream>> } | undefined
  for (let round = 0; round < ROUNDS; round++) {
    await Promise.all(Array.from({ length: WRITERS }, async (_, writer) => {
      const connection = await pool.connect()
      try {
        await connection.query('begin')
        await connection.query('select pg_sleep($1)', [Math.random() * 0.02])
        const run = runs[(writer + round) % runs.length]!
        const inserted = await connection.query(
          'insert into events (event_type, run_id, payload) values ($1, $2, $3) returning event_id', ['task_running', run, JSON.stringify({ writer, round })])
        // Some writers stay open half a second after their insert.
        await connection.query('select pg_sleep($1)', [writer % 16 === 0 ? 0.5 : Math.random() * 0.02])
        if (writer % 7 === 3) {
          await connection.query('rollback')
          rolledBack++
          return
        }
        await connection.query('commit')
        committed.push({ id: Number(inserted.rows[0].event_id), run })
      } finally {
        connection.release()
      }
    }).concat(round === 1
      // Mid-storm, the README's recipe: fetch, then subscribe from the fetch's X-Event-Cursor.
      ? [(async () => {
          await new Promise((resolve) => setTimeout(resolve, 100))
          const read = await fetch(`${url}/api/runs`)
          const cursor = Number(read.headers.get('x-event-cursor'))
          fetched = { cursor, stream: await openStream(url, `/api/events/stream?after_event_id=${cursor}`) }
          t.teardown(fetched.stream.close)
        })()]
      : []))
  }
  await pg15.waitForReplay()

  const ids = (events: typeof committed) => events.map((event) => event.id).sort((a, b) => a - b)
  const check = async (name: string, stream: Awaited<ReturnType<typeof openStream>>, want: number[]) => {
    await stream.waitFor((s) => s.events().length >= want.length)
    t.same(stream.events().map((event) => event.event_id), want, `${name}: ${want.length} events, each once, ascending`)
  }
  await check('unfiltered', streams.all, ids(committed))
  await check('from the tail', streams.tail, ids(committed))
  await check('run filter', streams.runA, ids(committed.filter((event) => event.run === 'st-a')))
  await check(`fetch-then-subscribe from X-Event-Cursor ${fetched!.cursor}`, fetched!.stream, ids(committed.filter((event) => event.id > fetched!.cursor)))
  const late = await openStream(url, `/api/events/stream?after_event_id=${base}`)
  t.teardown(late.close)
  await check('late catch-up', late, ids(committed))
  const page = await (await fetch(`${url}/api/events?after_event_id=${base}&limit=1000`)).json() as { events: Array<{ event_id: number }> }
  t.same(page.events.map((event) => event.event_id), ids(committed), 'GET /api/events lists the same')
  t.ok(rolledBack > 0, `${rolledBack} transactions rolled back, their ids holes the keeper settled`)

  // A writer left open on the primary: on the standby, the hole below the
  // next event waits for it, and after five seconds the log says so, naming
  // the writer (the keeper's census on the primary found it).
  // The snapshot fact: the older transaction (it holds an id first) commits
  // the higher event id while the newer one holds the lower id open.
  const older = await pool.connect()
  await older.query('begin')
  await older.query("insert into runs (run_id, goal, summary, status) values ('fact-1', 'g', 's', 'running')")
  const held = await pool.connect()
  await held.query('begin')
  await held.query("insert into events (event_type) values ('held')")
  const [after] = (await older.query("insert into events (event_type) values ('after_held') returning event_id")).rows
  // Delivery can start waiting no earlier than this commit above the open id.
  const waitCouldBegin = Date.now()
  await older.query('commit')
  older.release()
  await waitUntil(() => lines.some((line) => line.msg.startsWith('event delivery waits past id')), 'the wait to be logged')
  const waiting = lines.find((line) => line.msg.startsWith('event delivery waits past id'))!
  const heldPid = (await held.query('select pg_backend_pid() as pid')).rows[0].pid
  t.match(waiting, { msg: /a transaction that drew an event id \(or used the events sequence\) is still open, backend \d+/, waitingPid: heldPid }, 'on a standby, the wait is logged naming the writer on the primary')
  t.ok(waiting.time - waitCouldBegin >= 5000, `not before five seconds (after ${waiting.time - waitCouldBegin} ms)`)
  t.notOk(streams.all.events().some((event) => event.event_id === Number(after.event_id)), 'and the event above the hole has not been sent')
  await held.query('commit')
  held.release()
  await streams.all.waitFor((s) => s.events().some((event) => event.event_id === Number(after.event_id)))

  const primaryLog = pg15.log('primary').slice(primaryLogBefore)
  t.notMatch(primaryLog, /application_name=ocp-api$/m, 'no connection of the request pool reached the primary')
  t.notMatch(primaryLog, /ocp_reader/, 'nor anything of the reading role')
})
