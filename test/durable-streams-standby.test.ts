import { stream, type JsonBatch } from '@durable-streams/client'
import { Kysely, PostgresDialect } from 'kysely'
import t from 'tap'
import { buildApp } from '../app.ts'
import { loadConfig } from '../config.ts'
import { migrateToLatest } from '../db/migrate.ts'
import type { Database } from '../db/schema.ts'
import { createRun } from '../db/writer.ts'
import { testPool, withDatabase } from './helpers/database.ts'
import { makeRun } from './helpers/fixtures.ts'
import { startReplicatedPostgres, standbySkipReason } from './helpers/standby.ts'
import { waitUntil } from './helpers/wait.ts'

// The Durable Streams read path on a hot standby (docs/reference.md, "Read replicas" and
// docs/reference.md, "Durable Streams"): the service reads only the standby; writers commit out of order on
// the primary; long-poll and SSE readers get every event of the run once,
// ascending.

const WRITERS = 8

t.test('Durable Streams through a hot standby: every event once, ascending', { skip: standbySkipReason() }, async (t) => {
  const pg15 = await startReplicatedPostgres(t)
  await pg15.createDatabase('ocp_ds')
  const primary = withDatabase(pg15.primaryUrl, 'ocp_ds')
  const reader = withDatabase(pg15.readerUrl, 'ocp_ds')
  await migrateToLatest(primary)
  const pool = testPool(primary, WRITERS)
  t.teardown(() => pool.end())
  const writer = new Kysely<Database>({ dialect: new PostgresDialect({ pool: testPool(primary, 1) }) })
  t.teardown(() => writer.destroy())
  await createRun(writer, makeRun({ run_id: 'ds-standby' }))
  await pg15.waitForReplay()

  const config = loadConfig({ DATABASE_URL: primary, DATABASE_READ_URL: reader, LOG_LEVEL: 'silent', MAX_EVENT_LOOP_DELAY_MS: '0' })
  const app = await buildApp({ ...config, EVENTS_POLL_INTERVAL_MS: 20, EVENTS_KEEPER_INTERVAL_MS: 50 })
  t.teardown(() => app.close())
  await app.listen({ port: 0, host: '127.0.0.1' })
  const url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}/api/streams/runs/ds-standby`

  const readers = await Promise.all((['long-poll', 'sse'] as const).map(async (live) => {
    const response = await stream<{ event_id: number }>({ url, offset: 'now', live, warnOnHttp: false })
    const got: number[] = []
    const stop = response.subscribeJson((batch: JsonBatch<{ event_id: number }>) => { got.push(...batch.items.map((item) => item.event_id)) })
    t.teardown(stop)
    return { live, got }
  }))

  await Promise.all(Array.from({ length: WRITERS }, async (_, writer) => {
    for (let i = 0; i < 3; i++) {
      const client = await pool.connect()
      try {
        await client.query('begin')
        await client.query("insert into events (event_type, run_id) values ('written', 'ds-standby')")
        // Held open a while: later ids commit first.
        await new Promise((resolve) => setTimeout(resolve, (writer * 7 + i * 13) % 60))
        await client.query('commit')
      } finally {
        client.release()
      }
    }
  }))
  const committed = (await pool.query("select event_id from events where run_id = 'ds-standby' and event_type = 'written' order by event_id")).rows.map((row) => Number(row.event_id))
  t.equal(committed.length, WRITERS * 3)
  for (const reader of readers) {
    await waitUntil(() => reader.got.length >= committed.length, `${reader.live}: every event`, 60_000)
    t.same(reader.got, committed, `${reader.live}: every event once, ascending`)
  }
})
