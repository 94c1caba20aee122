import t from 'tap'
import { buildApp } from '../app.ts'
import { loadConfig } from '../config.ts'
import { migrateToLatest } from '../db/migrate.ts'
import { testPool, withDatabase } from './helpers/database.ts'
import { openStream } from './helpers/sse.ts'
import { startReplicatedPostgres, standbySkipReason } from './helpers/standby.ts'
import { LONG_WAIT_MS, sleep } from './helpers/wait.ts'

// A hot standby under steady load: transactions overlap on the primary so
// that one is always open (none longer than 1.5 s), and a rolled-back
// writer leaves a hole. The standby delivers the event above the hole
// while the load goes on, which it does until the event arrives:
// transactions that drew no event id hold nothing. How soon (about the
// longest transaction plus the keeper's interval and a poll) is printed,
// not asserted: a loaded machine stretches it.

const KEEPER_INTERVAL_MS = 100
const LONGEST_MS = 1500

t.test('a standby under overlapping transactions delivers past a hole within the longest transaction, the interval and a poll', { skip: standbySkipReason() }, async (t) => {
  const pg15 = await startReplicatedPostgres(t)
  await pg15.createDatabase('ocp_overlap')
  const primary = withDatabase(pg15.primaryUrl, 'ocp_overlap')
  const reader = withDatabase(pg15.readerUrl, 'ocp_overlap')
  await migrateToLatest(primary)
  await pg15.waitForReplay()

  const config = loadConfig({ DATABASE_URL: primary, DATABASE_READ_URL: reader, LOG_LEVEL: 'silent', MAX_EVENT_LOOP_DELAY_MS: '0' })
  const app = await buildApp({ ...config, EVENTS_POLL_INTERVAL_MS: 50, EVENTS_KEEPER_INTERVAL_MS: KEEPER_INTERVAL_MS })
  t.teardown(() => app.close())
  await app.listen({ port: 0, host: '127.0.0.1' })
  const url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`

  const pool = testPool(primary, 6)
  t.teardown(() => pool.end())
  const base = Number((await pool.query("insert into events (event_type) values ('base') returning event_id")).rows[0].event_id)
  const stream = await openStream(url, `/api/events/stream?after_event_id=${base}`)
  t.teardown(stream.close)

  // Two sessions, each looping over 1.5 s transactions that hold a transaction id, 0.75 s apart: one is always open.
  let loading = true
  const loop = async (delayMs: number) => {
    await sleep(delayMs)
    const client = await pool.connect()
    try {
      while (loading) { // eslint-disable-line no-unmodified-loop-condition -- cleared once the event above the hole has arrived
        await client.query('begin')
        await client.query('select pg_current_xact_id()')
        await client.query('select pg_sleep($1)', [LONGEST_MS / 1000])
        await client.query('commit')
      }
    } finally {
      client.release()
    }
  }
  const loops = [loop(0), loop(LONGEST_MS / 2)]
  await sleep(LONGEST_MS)

  const writer = await pool.connect()
  await writer.query('begin')
  await writer.query("insert into events (event_type) values ('rolled_back')")
  await writer.query('rollback')
  writer.release()
  const committedAt = Date.now()
  const above = Number((await pool.query("insert into events (event_type) values ('above_the_hole') returning event_id")).rows[0].event_id)
  await stream.waitFor((s) => s.events().length >= 1, LONG_WAIT_MS)
  const delay = Date.now() - committedAt
  loading = false
  await Promise.all(loops)
  t.same(stream.events().map((event) => event.event_id), [above], 'delivered, once, while the overlapping load went on')
  t.comment(`delivered ${delay} ms after its commit (the longest transaction, the interval, a poll and replay: about ${LONGEST_MS + KEEPER_INTERVAL_MS + 50 + 500} ms)`)
})
