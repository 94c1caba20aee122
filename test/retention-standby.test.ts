import t from 'tap'
import { buildApp } from '../app.ts'
import { loadConfig } from '../config.ts'
import { migrateToLatest } from '../db/migrate.ts'
import { withDatabase } from './helpers/database.ts'
import { openStream } from './helpers/sse.ts'
import { queryOn as query, startReplicatedPostgres, standbySkipReason } from './helpers/standby.ts'
import { waitUntil } from './helpers/wait.ts'

// EVENTS_RETENTION with the reads on a hot standby (docs/reference.md, "Event history" and
// docs/reference.md, "Read replicas"): the keeper works on the primary, the drops and the floor replicate in
// one transaction, and the standby's reads answer 410 below the floor.

t.test('retention with the reads on a hot standby', { skip: standbySkipReason() }, async (t) => {
  const pg15 = await startReplicatedPostgres(t)
  const database = 'ocp_retention'
  await pg15.createDatabase(database)
  const primary = withDatabase(pg15.primaryUrl, database)
  const reader = withDatabase(pg15.readerUrl, database)
  await migrateToLatest(primary)
  const config = loadConfig({
    DATABASE_URL: primary,
    DATABASE_READ_URL: reader,
    EVENTS_RETENTION: '10s',
    EVENTS_KEEPER_INTERVAL_MS: '200',
    EVENTS_POLL_INTERVAL_MS: '50',
    LOG_LEVEL: 'silent',
    MAX_EVENT_LOOP_DELAY_MS: '0'
  })
  const app = await buildApp(config)
  t.teardown(() => app.close())
  await app.listen({ port: 0, host: '127.0.0.1' })
  const base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`

  const old = await query(primary, "insert into events (event_type, created_at) select 'old', now() - interval '9 seconds' from generate_series(1, 3) returning event_id")
  await waitUntil(async () => Number((await query(reader, 'select history_floor from event_log_state'))[0]!.history_floor) >= 3,
    'the standby to replay the drop', 20_000)
  t.same(await query(reader, 'select event_id from events where event_id <= 3'), [], 'the standby has replayed the drop with the floor')
  t.equal(old.length, 3)

  const page = await fetch(`${base}/api/events?after_event_id=0`)
  t.equal(page.status, 410)
  t.equal((await page.json() as { error: { code: string } }).error.code, 'cursor_expired')
  const stream = await openStream(base, '/api/events/stream', { 'last-event-id': '2' })
  t.equal(stream.status, 410, 'the stream too, before any byte')
  const floor = Number((await query(reader, 'select history_floor from event_log_state'))[0]!.history_floor)
  const current = await fetch(`${base}/api/events?after_event_id=${floor}`)
  t.equal(current.status, 200, 'a cursor at the floor works')
  t.ok(Number(current.headers.get('x-event-cursor')) >= floor, 'and the standby\'s X-Event-Cursor is never below it')
  t.match(pg15.log('primary'), /application_name=ocp-api-keeper-partitions$/m, 'the keeper works on the primary')
})
