import { sql } from 'kysely'
import pg from 'pg'
import t from 'tap'
import { writeClock } from '../db/event-log.js'
import { build } from './helpers/app.js'
import { testDatabaseUrl } from './helpers/database.js'
import { insertEvents, openStream } from './helpers/sse.js'

// Writers draw ids and commit in any order, and none waits for another
// (migration 0003); the reader settles the order: the stream never skips an
// event whose transaction drew its id early and committed late, and never
// passes an id still in flight.

const WRITERS = 48
const ROUNDS = 3

async function client () {
  const connection = new pg.Client({ connectionString: await testDatabaseUrl() })
  await connection.connect()
  return connection
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

t.test('a second event writer does not wait for the first: no lock is held to commit', async (t) => {
  for (const isolation of ['read committed', 'repeatable read']) {
    const first = await client()
    const second = await client()
    await first.query(`begin isolation level ${isolation}`)
    const early = await first.query(`insert into events (event_type) values ('early') returning event_id`)
    await second.query(`begin isolation level ${isolation}`)
    const late = await second.query(`insert into events (event_type) values ('late') returning event_id`)
    await second.query('commit')
    t.ok(Number(late.rows[0].event_id) > Number(early.rows[0].event_id), `${isolation}: the later insert has the higher id, and committed while the first is open`)
    await first.query('commit')
    await first.end()
    await second.end()
  }
})

t.test('control: with a plain identity-style default, a naive event_id > cursor reader skips a late commit', async (t) => {
  const admin = await client()
  // What a plain identity column does: draw the id, registering nothing.
  await admin.query('alter table events disable trigger events_explicit_id')
  await admin.query(`alter table events alter column event_id set default nextval('events_event_id_seq')`)
  try {
    const first = await client()
    const second = await client()
    await first.query('begin')
    const early = Number((await first.query(`insert into events (event_type) values ('early') returning event_id`)).rows[0].event_id)
    const late = Number((await second.query(`insert into events (event_type) values ('late') returning event_id`)).rows[0].event_id)
    // A reader polls now: it sees `late`, and moves its cursor past `early`.
    const cursor = Number((await admin.query('select max(event_id) as id from events')).rows[0].id)
    t.equal(cursor, late)
    await first.query('commit')
    const missed = await admin.query('select event_id from events where event_id > $1', [cursor])
    t.same(missed.rows, [], 'the next poll after the cursor finds nothing...')
    t.ok(early < cursor, '...though `early` committed after the reader passed it: lost forever')
    await first.end()
    await second.end()
  } finally {
    await admin.query('alter table events alter column event_id set default events_next_id()')
    await admin.query('alter table events enable trigger events_explicit_id')
    await admin.end()
  }
})

t.test('explicit ids (fixtures) are kept as given; later drawn ids stay above them', async (t) => {
  const db = await client()
  const top = Number((await db.query('select coalesce(max(event_id), 0) as id from events')).rows[0].id)
  const explicit = top + 1000
  const kept = await db.query('insert into events (event_id, event_type) values ($1, $2) returning event_id', [explicit, 'fixture'])
  t.equal(Number(kept.rows[0].event_id), explicit)
  const next = await db.query(`insert into events (event_type) values ('after') returning event_id`)
  t.ok(Number(next.rows[0].event_id) > explicit, 'a drawn id continues above it')
  const low = await db.query('insert into events (event_id, event_type) values ($1, $2) returning event_id', [top + 1, 'below'])
  t.equal(Number(low.rows[0].event_id), top + 1, 'an explicit id below the sequence is kept too')
  await t.rejects(db.query('insert into events (event_id, event_type) values ($1, $2)', [explicit, 'again']), { code: '23505' }, 'a duplicate is a primary-key violation, as ever')
  const idempotent = await db.query('insert into events (event_id, event_type) values ($1, $2) on conflict (event_id) do nothing returning event_id', [explicit, 'again'])
  t.equal(idempotent.rowCount, 0, 'so ON CONFLICT DO NOTHING makes fixture loading idempotent')
  await db.end()
})

interface Census { bound: number, waitingPid: number | null, drawn: string, writers: string[], bounds: string[] }

t.test('the census (migration 0008): the writers in flight are the transactions that drew, each bounded by the census before it', async (t) => {
  const db = await client()
  t.teardown(() => db.end())
  const census = async (prior?: Census): Promise<Census> => {
    const { rows: [row] } = await db.query(`select bound::text, waiting_pid, drawn::text, writers, writer_bounds
      from events_settle_bound($1::bigint, $2::text[], $3::bigint[])`, [prior?.drawn ?? null, prior?.writers ?? [], prior?.bounds ?? []])
    return { bound: Number(row.bound), waitingPid: row.waiting_pid, drawn: row.drawn, writers: row.writers, bounds: row.writer_bounds }
  }
  const session = async () => {
    const connection = await client()
    t.teardown(() => connection.end())
    const pid = Number((await connection.query('select pg_backend_pid() as pid')).rows[0].pid)
    const insert = async () => Number((await connection.query(`insert into events (event_type) values ('census') returning event_id`)).rows[0].event_id)
    return { connection, pid, insert }
  }

  const quiet = await census()
  t.same({ writers: quiet.writers, bound: quiet.bound }, { writers: [], bound: Number(quiet.drawn) }, 'no writer in flight: settled up to the last id drawn')

  const other = await session()
  await other.connection.query('begin')
  await other.connection.query('select pg_current_xact_id()')
  await other.connection.query('update runs set status = status where false')
  const c0 = await census()
  t.same(c0.writers, [], 'an open transaction that drew no event id is no writer')

  const a = await session()
  await a.connection.query('begin')
  const idA = await a.insert()
  const c1 = await census(c0)
  t.same({ bounds: c1.bounds, bound: c1.bound, waitingPid: c1.waitingPid }, { bounds: [c0.drawn], bound: Number(c0.drawn), waitingPid: a.pid },
    'a new writer drew after the census before: bounded by its sequence value, and the bound waits for it')
  t.ok(c1.bound < idA)

  const b = await session()
  const idB = await b.insert()
  const c2 = await census(c1)
  t.same({ writers: c2.writers, bounds: c2.bounds, bound: c2.bound }, { writers: c1.writers, bounds: c1.bounds, bound: Number(c0.drawn) },
    `a writer seen before keeps its bound; ${idB}, committed above it, waits`)
  t.equal(c2.drawn, String(idB))

  await a.connection.query('savepoint s')
  await a.insert()
  await a.connection.query('rollback to savepoint s')
  const c = await session()
  await c.connection.query('begin')
  await c.insert()
  const c3 = await census(c2)
  t.same(c3.bounds, [c0.drawn, c2.drawn], 'a savepoint rolled back leaves the writer in flight; the next writer is bounded by the census before it')
  await a.connection.query('commit')
  const c4 = await census(c3)
  t.same({ bounds: c4.bounds, bound: c4.bound, waitingPid: c4.waitingPid }, { bounds: [c2.drawn], bound: Number(c2.drawn), waitingPid: c.pid }, 'the first writer ended: the bound moves up to the next')
  await c.connection.query('commit')
  const c5 = await census(c4)
  t.same({ writers: c5.writers, bound: c5.bound, waitingPid: c5.waitingPid }, { writers: [], bound: Number(c5.drawn), waitingPid: null }, 'no writer left: settled up to the last id drawn')

  // With no census before (a poller's first): the clock bounds a writer younger than it; an older one, only the floor.
  const old = await session()
  await old.connection.query('begin')
  await old.connection.query('select pg_current_xact_id()')
  const keeper = await client()
  t.teardown(() => keeper.end())
  await writeClock(keeper)
  const clock = String((await db.query('select clock_value from event_log_state')).rows[0].clock_value)
  const young = await session()
  await young.connection.query('begin')
  await young.insert()
  t.same((await census()).bounds, [clock], 'a writer younger than the clock: above the clock\'s value')
  const noXid = await session()
  await noXid.connection.query('begin')
  await noXid.connection.query(`select pg_sequence_last_value('events_event_id_seq')`) // holds the sequence's lock, and no transaction id yet
  t.same((await census()).bounds, [clock, clock], 'a holder with no transaction id yet takes one younger than the clock')
  await old.insert()
  const floor = String((await db.query('select history_floor from event_log_state')).rows[0].history_floor)
  const first = await census()
  t.same({ bounds: first.bounds, waitingPid: first.waitingPid }, { bounds: [floor, clock, clock], waitingPid: old.pid }, 'a writer older than the clock: above the history\'s floor only')
  await noXid.insert()
  const later = await census(first)
  t.same(later.bounds, first.bounds, 'a writer that took its transaction id since the census before is still recognized, and keeps its bound')
  t.not(later.writers.join(), first.writers.join(), 'its record now names its transaction id')
  for (const { connection } of [old, young, noXid, other]) await connection.query('commit')
})

t.test('events_settled reads the ids above its position by index, not the log below it (migration 0006)', async (t) => {
  const db = await client()
  t.teardown(() => db.end())
  await db.query(`insert into events (event_type) select 'bulk' from generate_series(1, 3000)`)
  const top = Number((await db.query('select max(event_id) as id from events')).rows[0].id)
  await db.query('begin')
  t.equal(Number((await db.query('select events_settled($1) as p', [top - 10])).rows[0].p), top, 'settled to the top: every id above the position is visible')
  // This transaction's own index statistics, published at once.
  const { rows: [read] } = await db.query(`select coalesce(sum(pg_stat_get_xact_tuples_returned(i.indexrelid)), 0)::int as n
    from pg_index i where i.indrelid in (select inhrelid from pg_inherits where inhparent = 'events'::regclass)`)
  t.ok(read.n <= 64 * 4, `index entries read: ${read.n} (the 3,000 below the position are not)`)
  await db.query('commit')
})

t.test('concurrent writers committing in random order: every subscriber gets every committed event once, ascending', async (t) => {
  const app = await build(t, { EVENTS_POLL_INTERVAL_MS: 10 })
  await app.listen({ port: 0, host: '127.0.0.1' })
  const { port } = app.server.address() as { port: number }
  const url = `http://127.0.0.1:${port}`
  const [base] = await insertEvents({ event_type: 'base' })

  const runs = ['ord-a', 'ord-b', 'ord-c']
  const streams = {
    all: await openStream(url, `/api/events/stream?after_event_id=${base}`),
    allTail: await openStream(url, '/api/events/stream'),
    runA: await openStream(url, `/api/events/stream?after_event_id=${base}&run_id=ord-a`),
    threadB: await openStream(url, `/api/events/stream?after_event_id=${base}&thread_id=thread-ord-b`),
    runCThreadC: await openStream(url, `/api/events/stream?after_event_id=${base}&run_id=ord-c&thread_id=thread-ord-c`)
  }
  for (const stream of Object.values(streams)) t.teardown(stream.close)
  await streams.allTail.waitFor((s) => s.frames.length >= 1)

  const committed: Array<{ id: number, run: string }> = []
  let rolledBack = 0
  // A subscriber that drops after the first round and resumes with Last-Event-ID.
  const firstLeg = await openStream(url, `/api/events/stream?after_event_id=${base}`)
  t.teardown(firstLeg.close)
  let resumed: Awaited<ReturnType<typeof openStream>> | undefined
  const pool = new pg.Pool({ connectionString: await testDatabaseUrl(), max: WRITERS })
  pool.on('error', () => {}) // idle connections cut when the file's database is dropped
  t.teardown(() => pool.end())
  for (let round = 0; round < ROUNDS; round++) {
    await Promise.all(Array.from({ length: WRITERS }, async (_, writer) => {
      const connection = await pool.connect()
      try {
        await connection.query('begin')
        // Work before the event, sleeping at random: the order in which
        // transactions reach the insert, and commit, is scrambled.
        await connection.query('select pg_sleep($1)', [Math.random() * 0.02])
        const run = runs[(writer + round) % runs.length]!
        const inserted = await connection.query(
          'insert into events (event_type, run_id, thread_id, payload) values ($1, $2, $3, $4) returning event_id',
          ['task_running', run, `thread-${run}`, JSON.stringify({ writer, round })]
        )
        // Some writers hold their transaction open for half a second after the insert.
        await connection.query('select pg_sleep($1)', [writer % 16 === 0 ? 0.5 : Math.random() * 0.02])
        if (writer % 7 === 3) {
          await connection.query('rollback')
          rolledBack++
        } else {
          await connection.query('commit')
          committed.push({ id: Number(inserted.rows[0].event_id), run })
        }
      } finally {
        connection.release()
      }
    }))
    if (round === 0) {
      await firstLeg.waitFor((s) => s.events().length >= 1, 10_000)
      firstLeg.close()
      const lastId = firstLeg.events().at(-1)!.event_id
      resumed = await openStream(url, `/api/events/stream?after_event_id=${base}`, { 'last-event-id': String(lastId) })
      t.teardown(resumed.close)
    }
  }

  const expected = {
    all: committed.map((event) => event.id).sort((a, b) => a - b),
    runA: committed.filter((event) => event.run === 'ord-a').map((event) => event.id).sort((a, b) => a - b),
    threadB: committed.filter((event) => event.run === 'ord-b').map((event) => event.id).sort((a, b) => a - b),
    runCThreadC: committed.filter((event) => event.run === 'ord-c').map((event) => event.id).sort((a, b) => a - b)
  }
  const check = async (name: string, stream: Awaited<ReturnType<typeof openStream>>, want: number[]) => {
    await stream.waitFor((s) => s.events().length >= want.length, 10_000)
    t.same(stream.events().map((event) => event.event_id), want, `${name}: ${want.length} events, each once, ascending`)
  }
  await check('unfiltered', streams.all, expected.all)
  await check('unfiltered, from the tail', streams.allTail, expected.all)
  await check('run filter', streams.runA, expected.runA)
  await check('thread filter', streams.threadB, expected.threadB)
  await check('run and thread', streams.runCThreadC, expected.runCThreadC)
  await resumed!.waitFor((s) => firstLeg.events().length + s.events().length >= expected.all.length, 10_000)
  t.same([...firstLeg.events(), ...resumed!.events()].map((event) => event.event_id), expected.all, 'dropped and resumed with Last-Event-ID: every event once, ascending, across both legs')
  t.ok(rolledBack > 0, `${rolledBack} transactions rolled back, their events never seen`)

  // The same holds for a late subscriber catching up from the table.
  const late = await openStream(url, `/api/events/stream?after_event_id=${base}`)
  t.teardown(late.close)
  await check('late catch-up', late, expected.all)

  const gaps = await sql<{ n: number }>`select count(*)::int as n from events where event_id > ${base}`.execute(app.db)
  t.equal(gaps.rows[0]?.n, expected.all.length, 'the table holds exactly the committed events')
})
