import { sql } from 'kysely'
import pg from 'pg'
import t from 'tap'
import { build } from './helpers/app.ts'
import { testDatabaseUrl, testPool } from './helpers/database.ts'
import { insertEvents, openStream } from './helpers/sse.ts'

// Writers draw ids and commit in any order, and none waits for another;
// the reader settles the order (the keeper's census, db/sql/keeper.sql): the
// stream never skips an event whose transaction drew its id early and
// committed late, and never passes an id still in flight.

const WRITERS = 48
const ROUNDS = 3

async function client () {
  const connection = new pg.Client({ connectionString: await testDatabaseUrl() })
  await connection.connect()
  return connection
}

t.test('a second event writer does not wait for the first: no lock is held to commit', async (t) => {
  for (const isolation of ['read committed', 'repeatable read']) {
    const first = await client()
    const second = await client()
    await first.query(`begin isolation level ${isolation}`)
    const early = await first.query("insert into events (event_type) values ('early') returning event_id")
    await second.query(`begin isolation level ${isolation}`)
    const late = await second.query("insert into events (event_type) values ('late') returning event_id")
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
  await admin.query("alter table events alter column event_id set default nextval('events_event_id_seq')")
  try {
    const first = await client()
    const second = await client()
    await first.query('begin')
    const early = Number((await first.query("insert into events (event_type) values ('early') returning event_id")).rows[0].event_id)
    const late = Number((await second.query("insert into events (event_type) values ('late') returning event_id")).rows[0].event_id)
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
  const next = await db.query("insert into events (event_type) values ('after') returning event_id")
  t.ok(Number(next.rows[0].event_id) > explicit, 'a drawn id continues above it')
  const low = await db.query('insert into events (event_id, event_type) values ($1, $2) returning event_id', [top + 1, 'below'])
  t.equal(Number(low.rows[0].event_id), top + 1, 'an explicit id below the sequence, not yet settled, is kept too (once settled, refused: writer-forms.test.ts)')
  await t.rejects(db.query('insert into events (event_id, event_type) values ($1, $2)', [explicit, 'again']), { code: '23505' }, 'a duplicate is a primary-key violation, as ever')
  const idempotent = await db.query('insert into events (event_id, event_type) values ($1, $2) on conflict (event_id) do nothing returning event_id', [explicit, 'again'])
  t.equal(idempotent.rowCount, 0, 'so ON CONFLICT DO NOTHING makes fixture loading idempotent')
  await db.end()
})

interface Census { drawn: string, mark: string, writers: string[], drawBounds: string[], lateBounds: string[], waitingPid: number | null }

t.test('the census: the writers in flight are the holders of the sequence\'s lock, each bounded by the census before it', async (t) => {
  const db = await client()
  t.teardown(() => db.end())
  const census = async (prior: Census): Promise<Census> => {
    const { rows: [row] } = await db.query(`select drawn::text, mark::text, writers, draw_bounds::text[], late_bounds::text[], waiting_pid
      from events_census($1::bigint, $2::bigint, $3::text[], $4::bigint[], $5::bigint[])`, [prior.drawn, prior.mark, prior.writers, prior.drawBounds, prior.lateBounds])
    return { drawn: row.drawn, mark: row.mark, writers: row.writers, drawBounds: row.draw_bounds, lateBounds: row.late_bounds, waitingPid: row.waiting_pid }
  }
  const session = async () => {
    const connection = await client()
    t.teardown(() => connection.end())
    const pid = Number((await connection.query('select pg_backend_pid() as pid')).rows[0].pid)
    const insert = async () => Number((await connection.query("insert into events (event_type) values ('census') returning event_id")).rows[0].event_id)
    return { connection, pid, insert }
  }
  const now = (await db.query('select last_value::text as v from events_settle_mark')).rows[0].v
  const quiet = await census({ drawn: now, mark: now, writers: [], drawBounds: [], lateBounds: [], waitingPid: null })
  t.same(quiet.writers, [], 'no writer in flight')

  const other = await session()
  await other.connection.query('begin')
  await other.connection.query('select pg_current_xact_id()')
  await other.connection.query('update runs set status = status where false')
  const c0 = await census(quiet)
  t.same(c0.writers, [], 'an open transaction that drew no event id is no writer')

  const a = await session()
  await a.connection.query('begin')
  const idA = await a.insert()
  const c1 = await census(c0)
  t.same({ drawBounds: c1.drawBounds, lateBounds: c1.lateBounds, waitingPid: c1.waitingPid }, { drawBounds: [c0.drawn], lateBounds: [c0.mark], waitingPid: a.pid },
    'a new writer took the lock after the census before read pg_locks: it draws above that census\'s sequence value, and inserts nothing at or below its mark')
  t.ok(Number(c1.drawBounds[0]) < idA)

  const b = await session()
  const idB = await b.insert()
  const c2 = await census(c1)
  t.same({ writers: c2.writers, drawBounds: c2.drawBounds }, { writers: c1.writers, drawBounds: c1.drawBounds }, `a writer seen before keeps its bounds; ${idB}, committed above it, is no writer`)
  t.equal(c2.drawn, String(idB))

  await a.connection.query('savepoint s')
  await a.insert()
  await a.connection.query('rollback to savepoint s')
  const c = await session()
  await c.connection.query('begin')
  await c.insert()
  const c3 = await census(c2)
  // In the order of their lowest bounds, both the mark here: either order.
  t.same([...c3.drawBounds].sort((x, y) => Number(x) - Number(y)), [c0.drawn, c2.drawn], 'a savepoint rolled back leaves the writer in flight; the next writer is bounded by the census before it')
  await a.connection.query('commit')
  const c4 = await census(c3)
  t.same({ drawBounds: c4.drawBounds, waitingPid: c4.waitingPid }, { drawBounds: [c2.drawn], waitingPid: c.pid }, 'the first writer ended: the lowest bound is the next one\'s')
  await c.connection.query('commit')
  t.same((await census(c4)).writers, [], 'no writer left')

  // A transaction that draws with nextval before it holds a transaction id is a writer all the same, and stays one when it takes an id.
  const early = await session()
  await early.connection.query('begin')
  await early.connection.query("select nextval('events_event_id_seq')")
  const first = await census(c4)
  t.equal(first.writers.length, 1)
  t.match(first.writers[0], /:$/, 'recorded with no transaction id yet')
  await early.connection.query('select pg_current_xact_id()')
  const later = await census(first)
  t.same(later.drawBounds, first.drawBounds, 'still recognized once it takes a transaction id: it keeps its bounds')
  t.not(later.writers.join(), first.writers.join(), 'its record now names its transaction id')
  for (const { connection } of [early, other]) await connection.query('commit')
})

t.test('a tick of the keeper: the settled position is the lowest bound, and the mark rises behind the writers', async (t) => {
  const db = await client()
  t.teardown(() => db.end())
  const tick = async () => (await db.query('select settled::text from events_keep_order()')).rows[0].settled as string
  const state = async () => (await db.query('select settled::text, census_writers, (select last_value::text from events_settle_mark) as mark from event_log_state')).rows[0]
  const drawn = async () => (await db.query('select last_value::text as v from events_event_id_seq')).rows[0].v as string
  await tick()
  t.equal(await tick(), await drawn(), 'no writer in flight: settled up to the last id drawn')

  const writer = await client()
  t.teardown(() => writer.end())
  await writer.query('begin')
  const held = Number((await writer.query("insert into events (event_type) values ('held') returning event_id")).rows[0].event_id)
  await insertEvents({ event_type: 'above' }, { event_type: 'above' })
  await tick()
  const waiting = await state()
  t.ok(Number(waiting.settled) < held, 'a writer in flight holds it below its id')
  t.ok(Number(waiting.mark) < held, 'and the mark too: the writer may insert its own id')
  t.equal(waiting.census_writers.length, 1)
  await writer.query('commit')
  await tick()
  t.equal(await tick(), await drawn(), 'the writer ended: settled up to the last id drawn again')
  const { settled, mark } = await state()
  t.ok(Number(mark) >= Number(settled), 'the mark is never below the settled position')
})

t.test('events_settled reads the ids above its position by index, not the log below it', async (t) => {
  const db = await client()
  t.teardown(() => db.end())
  await db.query("insert into events (event_type) select 'bulk' from generate_series(1, 3000)")
  const top = Number((await db.query('select max(event_id) as id from events')).rows[0].id)
  await db.query('begin')
  t.equal(Number((await db.query('select events_settled($1) as p', [top - 10])).rows[0].p), top, 'settled to the top: every id above the position is visible')
  // This transaction's own index statistics, published at once.
  const { rows: [read] } = await db.query(`select coalesce(sum(pg_stat_get_xact_tuples_returned(i.indexrelid)), 0)::int as n
    from pg_index i where i.indrelid in (select inhrelid from pg_inherits where inhparent = 'events'::regclass)`)
  t.ok(read.n <= 64 * 4, `index entries read: ${read.n} (the 3,000 below the position are not)`)
  await db.query('commit')
})

t.test('the settled position of one statement reaches the end of a burst, however long', async (t) => {
  const db = await client()
  t.teardown(() => db.end())
  const before = Number((await db.query('select events_settled(0) as p')).rows[0].p)
  const { rows } = await db.query("insert into events (event_type) select 'burst' from generate_series(1, 3000) returning event_id")
  const top = Number(rows.at(-1).event_id)
  t.equal(Number((await db.query('select events_settled($1) as p', [before])).rows[0].p), top,
    'a statement given the position before a burst of 3,000 (one transaction) settles up to its last id')
  await db.query('begin')
  const { rows: [held] } = await db.query("insert into events (event_type) values ('held') returning event_id")
  const other = await client()
  t.teardown(() => other.end())
  await other.query("insert into events (event_type) select 'after' from generate_series(1, 100)")
  t.equal(Number((await other.query('select events_settled($1) as p', [top])).rows[0].p), Number(held.event_id) - 1, 'and stops below an id in flight')
  // Committed, not rolled back: no hole is left for the tests after this one to wait on.
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
  const pool = testPool(await testDatabaseUrl(), WRITERS)
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
      await firstLeg.waitFor((s) => s.events().length >= 1)
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
    await stream.waitFor((s) => s.events().length >= want.length)
    t.same(stream.events().map((event) => event.event_id), want, `${name}: ${want.length} events, each once, ascending`)
  }
  await check('unfiltered', streams.all, expected.all)
  await check('unfiltered, from the tail', streams.allTail, expected.all)
  await check('run filter', streams.runA, expected.runA)
  await check('thread filter', streams.threadB, expected.threadB)
  await check('run and thread', streams.runCThreadC, expected.runCThreadC)
  await resumed!.waitFor((s) => firstLeg.events().length + s.events().length >= expected.all.length)
  t.same([...firstLeg.events(), ...resumed!.events()].map((event) => event.event_id), expected.all, 'dropped and resumed with Last-Event-ID: every event once, ascending, across both legs')
  t.ok(rolledBack > 0, `${rolledBack} transactions rolled back, their events never seen`)

  // The same holds for a late subscriber catching up from the table.
  const late = await openStream(url, `/api/events/stream?after_event_id=${base}`)
  t.teardown(late.close)
  await check('late catch-up', late, expected.all)

  const gaps = await sql<{ n: number }>`select count(*)::int as n from events where event_id > ${base}`.execute(app.db)
  t.equal(gaps.rows[0]?.n, expected.all.length, 'the table holds exactly the committed events')
})
