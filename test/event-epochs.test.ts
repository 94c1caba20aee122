import pg from 'pg'
import t from 'tap'
import type { LogState } from '../events/log.js'
import { reportable } from '../events/reader.js'
import { build } from './helpers/app.js'
import { testDatabaseUrl } from './helpers/database.js'
import { insertEvents, openStream } from './helpers/sse.js'
import { waitUntil } from './helpers/wait.js'

// The event sequence moved back while the service runs (TRUNCATE ...
// RESTART IDENTITY, a setval): ids will be handed out again. The keeper
// starts a new epoch from 0; every stream past it ends (its client
// reconnects), the log says so, and the new events reach the streams that
// start over. (A failover's epoch: failover.test.ts.)

t.test('a sequence moved back starts a new epoch: streams end, the log says so, and the new ids reach new streams', async (t) => {
  const lines: Array<{ level: number, msg: string }> = []
  const app = await build(t, { EVENTS_POLL_INTERVAL_MS: 50, EVENTS_CLOCK_INTERVAL_MS: 100, LOG_LEVEL: 'warn' },
    { logger: { level: 'warn', stream: { write: (line: string) => { lines.push(JSON.parse(line)) } } } })
  await app.listen({ port: 0, host: '127.0.0.1' })
  const url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`

  const before = await insertEvents({ event_type: 'before' }, { event_type: 'before' }, { event_type: 'before' })
  const stream = await openStream(url, '/api/events/stream?after_event_id=0')
  t.teardown(stream.close)
  await stream.waitFor((s) => s.events().length >= 3, 15_000)
  const waiter = fetch(`${url}/api/streams/events?offset=${before.at(-1)!.toString(36).padStart(11, '0')}&live=long-poll`)

  const admin = new pg.Client({ connectionString: await testDatabaseUrl() })
  await admin.connect()
  t.teardown(() => admin.end())
  await admin.query('truncate events restart identity')
  const after = await insertEvents({ event_type: 'after' }, { event_type: 'after' })
  t.same(after, [1, 2], 'the ids start over, and the inserts are accepted')

  let ended = false
  void stream.ended.then(() => { ended = true })
  await waitUntil(() => ended, 'the stream past the new epoch\'s base to end')
  t.pass('the stream past the new epoch\'s base ended (its client reconnects)')
  t.equal((await waiter).status, 204, 'a long-poll past it answers as it stands')
  t.match(lines.find((line) => line.level === 50), { msg: /events_event_id_seq moved backwards/ }, 'the keeper logs an error saying what happened')
  t.match(lines.find((line) => /new epoch/.test(line.msg)), { level: 40 }, 'and every replica that it started a new epoch')

  const again = await openStream(url, '/api/events/stream?after_event_id=0')
  t.teardown(again.close)
  await again.waitFor((s) => s.events().length >= 2, 15_000)
  t.same(again.events().map((event) => event.event_id), after, 'a stream that starts over gets the new events')
  const tail = await openStream(url, '/api/events/stream')
  t.teardown(tail.close)
  await tail.waitFor((s) => s.frames.length >= 1)
  const [next] = await insertEvents({ event_type: 'next' })
  await tail.waitFor((s) => s.events().length >= 1, 15_000)
  t.same(tail.events().map((event) => event.event_id), [next], 'and so does a stream from the tail')
  await waitUntil(async () => (await fetch(`${url}/api/runs`)).headers.get('x-event-cursor') === String(next), 'X-Event-Cursor to follow the new ids')
})

t.test('a position inside a range of ids reissued after a failover is reported as the start of the range', async (t) => {
  const state = { reissued: [[3, 103]] } as unknown as LogState
  t.equal(reportable(state, 50), 3, 'inside: the range\'s start, at which every client may resume')
  t.equal(reportable(state, 103), 3, 'its last id too')
  t.equal(reportable(state, 3), 3, 'the start itself')
  t.equal(reportable(state, 104), 104, 'past it: as it is')
})
