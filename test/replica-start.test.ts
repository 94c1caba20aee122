import pg from 'pg'
import t from 'tap'
import { build } from './helpers/app.js'
import { testDatabaseUrl } from './helpers/database.js'
import { openStream } from './helpers/sse.js'
import { waitUntil } from './helpers/wait.js'

// A replica that starts while an event writer is open (every deploy does):
// it reports, within one poll of answering /ready, the settled position the
// running replicas report, whatever the history's holes, and a stream it
// opens without a cursor gets only what commits after it connected (or
// above that position), never the history below it.

async function client () {
  const connection = new pg.Client({ connectionString: await testDatabaseUrl() })
  await connection.connect()
  t.teardown(() => connection.end())
  return connection
}

async function listen (app: Awaited<ReturnType<typeof build>>) {
  await app.listen({ port: 0, host: '127.0.0.1' })
  return `http://127.0.0.1:${(app.server.address() as { port: number }).port}`
}

const cursorOf = async (url: string) => Number((await fetch(`${url}/api/runs`)).headers.get('x-event-cursor'))

t.test('a replica started while a writer is open reports the running replicas\' position at once, and floods no tail stream', async (t) => {
  const config = { EVENTS_POLL_INTERVAL_MS: 50, EVENTS_CLOCK_INTERVAL_MS: 100 }
  const running = await build(t, config)
  const runningUrl = await listen(running)
  const db = await client()

  // History with holes: a rolled-back batch, then a jump of the sequence as
  // the range jump of retention makes (a million ids that never commit).
  await db.query(`insert into events (event_type) select 'history' from generate_series(1, 1000)`)
  await db.query('begin')
  await db.query(`insert into events (event_type) select 'undone' from generate_series(1, 500)`)
  await db.query('rollback')
  await db.query(`insert into events (event_type) select 'history' from generate_series(1, 1000)`)
  await db.query(`select setval('events_event_id_seq', (select last_value from events_event_id_seq) + 1000000)`)
  const top = Number((await db.query(`insert into events (event_type) select 'history' from generate_series(1, 1000) returning event_id`)).rows.at(-1).event_id)
  await waitUntil(async () => await cursorOf(runningUrl) === top, 'the running replica to settle the history')

  const writer = await client()
  await writer.query('begin')
  const held = Number((await writer.query(`insert into events (event_type) values ('held_open') returning event_id`)).rows[0].event_id)
  const above = await client()
  const committedAbove = Number((await above.query(`insert into events (event_type) values ('committed_above') returning event_id`)).rows[0].event_id)
  // Open longer than many of the keeper's ticks.
  await new Promise((resolve) => setTimeout(resolve, 500))
  t.equal(await cursorOf(runningUrl), held - 1, 'the running replica waits just below the open writer')

  const starting = await build(t, config)
  const startingUrl = await listen(starting)
  t.equal((await fetch(`${startingUrl}/ready`)).status, 200, 'the new replica is ready')
  t.equal(await cursorOf(startingUrl), held - 1, 'and reports the same position at once: the writer\'s, not the first hole of the history')
  const tail = await openStream(startingUrl, '/api/events/stream')
  t.teardown(tail.close)
  await tail.waitFor((stream) => stream.frames.length >= 1)

  await writer.query('commit')
  await tail.waitFor((stream) => stream.events().length >= 2)
  await new Promise((resolve) => setTimeout(resolve, 300))
  t.same(tail.events().map((event) => event.event_id), [held, committedAbove],
    'the tail stream gets the writer\'s event and the one above it, and nothing of the history')
})

t.test('with no replica running, a starting one still bounds the writers in flight by the census the keeper stored', async (t) => {
  const config = { EVENTS_POLL_INTERVAL_MS: 50, EVENTS_CLOCK_INTERVAL_MS: 100 }
  const first = await build(t, config)
  const firstUrl = await listen(first)
  const db = await client()
  await db.query('begin')
  await db.query(`insert into events (event_type) select 'undone' from generate_series(1, 300)`)
  await db.query('rollback')
  const top = Number((await db.query(`insert into events (event_type) values ('history') returning event_id`)).rows[0].event_id)
  await waitUntil(async () => await cursorOf(firstUrl) === top, 'the first replica to settle')

  const writer = await client()
  await writer.query('begin')
  const held = Number((await writer.query(`insert into events (event_type) values ('held_open') returning event_id`)).rows[0].event_id)
  // Two ticks ended: the second began after the writer opened, so its stored census holds it.
  const ticks = first.events.upkeep!.ticks
  await waitUntil(() => first.events.upkeep!.ticks >= ticks + 2, 'the keeper to store a census with the writer open')
  await first.close()

  const second = await build(t, config)
  const secondUrl = await listen(second)
  t.equal(await cursorOf(secondUrl), held - 1, 'the position is the open writer\'s, alone as the new replica is')
  await writer.query('commit')
  await waitUntil(async () => await cursorOf(secondUrl) === held, 'the position to move past the writer once it commits')
})
