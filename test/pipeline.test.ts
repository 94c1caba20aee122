import { sql } from 'kysely'
import { Socket } from 'node:net'
import pg from 'pg'
import t, { type Test } from 'tap'
import { PipelinedConnections, STALLED_MS, TURN_BATCH_MAX } from '../db/pipeline.ts'
import { createReadPool, ReadPool } from '../db/pool.ts'
import { builder, queryRow, Statement } from '../db/statement.ts'
import { isDatabaseUnavailable } from '../errors.ts'
import { build } from './helpers/app.ts'
import { needsServer, testBackend, testDatabaseUrl } from './helpers/database.ts'
import { waitUntil } from './helpers/wait.ts'

// The API's reads go to a few connections in pg's pipeline mode (db/pipeline.ts).

/** The backend that ran it, after sleeping `seconds`; `tag` keeps identical reads from sharing one statement. */
const backendAfterSleep = new Statement(2, (tag: string, seconds: number) => builder.selectNoFrom([
  sql<number>`pg_backend_pid()`.as('pid'),
  sql<string>`${tag}::text`.as('tag'),
  sql<string>`pg_sleep(${seconds}::float8)::text`.as('slept')
]))

/** The number, divided by `divisor`: a divisor of 0 fails the statement (22012). */
const quotient = new Statement(2, (dividend: number, divisor: number) => builder.selectNoFrom([
  sql<number>`(${dividend}::int / ${divisor}::int)`.as('value')
]))

async function pipelinedPool (t: Test, pipelined: number, connectionString?: string): Promise<ReadPool> {
  const pool = createReadPool({ connectionString: connectionString ?? await testDatabaseUrl(), max: 1, statementTimeoutMs: 5000, connectTimeoutMs: 2000, pipelined })
  t.teardown(() => pool.end())
  return pool
}

t.test('reads share one connection while it keeps up; another opens only while every open one is busy, up to the number set', async (t) => {
  const pool = await pipelinedPool(t, 2)
  const pipeline = pool.pipeline!
  const one = await queryRow<{ pid: number }, [string, number]>(pool, backendAfterSleep, 'a', 0)
  const two = await queryRow<{ pid: number }, [string, number]>(pool, backendAfterSleep, 'b', 0)
  t.equal(two?.pid, one?.pid, 'one after the other: the same connection')
  t.equal(pipeline.openCount, 1, 'an idle service holds one')

  const started = Date.now()
  const together = await Promise.all(['c', 'd', 'e', 'f', 'g', 'h'].map((tag) => queryRow<{ pid: number }, [string, number]>(pool, backendAfterSleep, tag, 0.2)))
  t.equal(pipeline.openCount, 2, 'six at once: two connections, no more')
  // The embedded database's bridge serves every connection from one backend.
  if (testBackend === 'server') t.equal(new Set(together.map((row) => row?.pid)).size, 2, 'each statement on one of the two')
  t.ok(Date.now() - started >= 550, 'statements after each other on each (a turn\'s first four on one)')
  t.equal(pipeline.inFlightCount, 0, 'nothing in flight once answered')
  t.equal(pool.totalCount, 0, 'the pool itself was not used')
})

/** Counts the writes (system calls) to the test's database server, over every socket, while `fn` runs. */
async function socketWrites<T> (fn: () => Promise<T>): Promise<{ result: T, writes: number }> {
  const port = Number(new URL(await testDatabaseUrl()).port || 5432)
  const proto = Socket.prototype as unknown as { _write: (...args: unknown[]) => unknown, _writev: (...args: unknown[]) => unknown }
  const { _write: write, _writev: writev } = proto
  let writes = 0
  // Only the client's side: the embedded database's bridge answers in this process too.
  proto._write = function (this: Socket, ...args: unknown[]) { if (this.remotePort === port) writes++; return write.apply(this, args) }
  proto._writev = function (this: Socket, ...args: unknown[]) { if (this.remotePort === port) writes++; return writev.apply(this, args) }
  try {
    return { result: await fn(), writes }
  } finally {
    Object.assign(proto, { _write: write, _writev: writev })
  }
}

t.test('a turn\'s reads leave in one write: up to TURN_BATCH_MAX on one connection, then the next', async (t) => {
  const pool = await pipelinedPool(t, 2)
  const read = (tag: string) => queryRow<{ pid: number, tag: string }, [string, number]>(pool, backendAfterSleep, tag, 0)
  await read('warm') // one connection open
  const three = await socketWrites(() => Promise.all(['a', 'b', 'c'].map(read)))
  t.same(three.result.map((row) => row?.tag), ['a', 'b', 'c'], 'each read its own row')
  t.equal(three.writes, 1, 'three statements, one write')
  t.equal(new Set(three.result.map((row) => row?.pid)).size, 1, 'on one connection')

  const tags = Array.from({ length: TURN_BATCH_MAX + 2 }, (_, i) => `t${i}`)
  const more = await socketWrites(() => Promise.all(tags.map(read)))
  t.same(more.result.map((row) => row?.tag), tags, 'past the batch\'s bound, each read its own row too')
  t.equal(pool.pipeline!.openCount, 2, 'the rest went to another connection')
  if (testBackend === 'server') t.equal(new Set(more.result.map((row) => row?.pid)).size, 2, 'on its own backend')

  // A pipeline of one: past the bound, the turn's connection again, still corked.
  const single = await pipelinedPool(t, 1)
  await queryRow(single, quotient, 1, 1)
  const crowded = await socketWrites(() => Promise.all(tags.map((tag) => queryRow<{ tag: string }, [string, number]>(single, backendAfterSleep, tag, 0))))
  t.same(crowded.result.map((row) => row?.tag), tags)
  t.equal(crowded.writes, 1, `${tags.length} statements on the one connection, one write`)
})

t.test('a connection behind a slow statement gets no more reads while another can take them', async (t) => {
  const pool = await pipelinedPool(t, 2)
  // One more than a turn puts on one connection: two open.
  const warm = await Promise.all(Array.from({ length: TURN_BATCH_MAX + 1 }, (_, i) => queryRow<{ pid: number }, [string, number]>(pool, backendAfterSleep, `w${i}`, 0.05)))
  t.equal(pool.pipeline!.openCount, 2)
  let slowDone = false
  const slow = queryRow<{ pid: number }, [string, number]>(pool, backendAfterSleep, 'slow', 1).then((row) => { slowDone = true; return row })
  await new Promise((resolve) => setTimeout(resolve, STALLED_MS + 100))
  const fast = await Promise.all(['f1', 'f2', 'f3', 'f4'].map((tag) => queryRow<{ pid: number }, [string, number]>(pool, backendAfterSleep, tag, 0)))
  const answeredFirst = !slowDone
  const slowPid = (await slow)?.pid
  // The embedded database's one backend runs every statement in turn.
  if (testBackend === 'server') {
    t.ok(answeredFirst, 'the fast reads were answered while the slow one ran')
    t.same(new Set(warm.map((row) => row?.pid)).size, 2)
    t.notOk(fast.some((row) => row?.pid === slowPid), 'none went behind it')
  }
})

t.test('with no room for another connection, a read goes behind the slow statement rather than fail', async (t) => {
  const pool = await pipelinedPool(t, 1)
  const slow = queryRow(pool, backendAfterSleep, 'slow', 0.3)
  await new Promise((resolve) => setTimeout(resolve, STALLED_MS + 50))
  t.match(await queryRow(pool, backendAfterSleep, 'behind', 0), { tag: 'behind' })
  t.match(await slow, { tag: 'slow' })
  t.equal(pool.pipeline!.openCount, 1)
})

t.test('a connection idle for a while is closed, and the next read opens another', async (t) => {
  const url = await testDatabaseUrl()
  // Times with room for a loaded machine's late timers: idle 1 s, busy 1.5 s, looked at after 1.1 s.
  const pipeline = new PipelinedConnections({ connectionString: url }, 2, 1000)
  const pool = new ReadPool({ connectionString: url, max: 1 }, pipeline)
  t.teardown(() => pool.end())
  const busy = queryRow(pool, backendAfterSleep, 'busy', 1.5)
  await new Promise((resolve) => setTimeout(resolve, 1100))
  t.equal(pipeline.openCount, 1, 'busy past the idle time: kept')
  t.match(await busy, { tag: 'busy' })
  const closing = Date.now()
  await waitUntil(() => pipeline.openCount === 0, 'the idle connection to close')
  t.equal(pipeline.openCount, 0, 'closed once idle')
  t.ok(Date.now() - closing >= 500, 'not before')
  t.same(await queryRow(pool, quotient, 4, 2), { value: 2 }, 'a read after it opens another')
  t.equal(pipeline.openCount, 1)
})

t.test('a statement that fails, fails alone: those sent with it on the same connection are answered', async (t) => {
  const pool = await pipelinedPool(t, 1)
  const reads = [queryRow(pool, quotient, 6, 3), queryRow(pool, quotient, 1, 0), queryRow(pool, quotient, 8, 2)]
  const [first, failed, third] = await Promise.allSettled(reads)
  t.same(first, { status: 'fulfilled', value: { value: 2 } })
  t.match(failed, { status: 'rejected', reason: { code: '22012' } })
  t.same(third, { status: 'fulfilled', value: { value: 4 } })
  t.same(await queryRow(pool, quotient, 9, 3), { value: 3 }, 'and the connection serves the next')
})

t.test('a connection whose session already holds a name (a shared session) runs statements unnamed', async (t) => {
  const pool = await pipelinedPool(t, 1)
  await pool.pipeline!.run((client) => client.query(`prepare "${quotient.name}" as select 'someone else''s' as value`), () => {})
  t.same(await queryRow(pool, quotient, 10, 5), { value: 2 }, 'the right answer, not the name\'s holder')
  t.same(await queryRow(pool, quotient, 12, 4), { value: 3 }, 'and from then on')
})

t.test('a connection lost with statements in flight fails them as unavailable, and the next read opens another', { skip: needsServer('a backend terminated from another session') }, async (t) => {
  const pool = await pipelinedPool(t, 1)
  const first = await queryRow<{ pid: number }, [string, number]>(pool, backendAfterSleep, 'before', 0)
  const inFlight = queryRow(pool, backendAfterSleep, 'lost', 5).then(() => undefined, (err: unknown) => err)
  const admin = new pg.Client({ connectionString: await testDatabaseUrl() })
  await admin.connect()
  t.teardown(() => admin.end())
  await admin.query('select pg_terminate_backend($1)', [first!.pid])
  t.ok(isDatabaseUnavailable(await inFlight), 'the read answers 503')
  t.equal(pool.pipeline!.openCount, 0, 'the lost connection is out of use')
  const after = await queryRow<{ pid: number }, [string, number]>(pool, backendAfterSleep, 'after', 0)
  t.not(after?.pid, first!.pid, 'another connection')
})

t.test('a refused connection fails the read as unavailable and leaves nothing open', async (t) => {
  const pool = await pipelinedPool(t, 2, 'postgres://postgres@127.0.0.1:1/none')
  for (const attempt of ['first', 'again']) {
    const err = await queryRow(pool, quotient, 1, 1).then(() => undefined, (err: unknown) => err)
    t.ok(isDatabaseUnavailable(err), `${attempt}: unavailable`)
    t.equal(pool.pipeline!.openCount, 0)
  }
})

t.test('ending answers what is in flight, then refuses reads as unavailable', async (t) => {
  const pool = createReadPool({ connectionString: await testDatabaseUrl(), max: 1, statementTimeoutMs: 5000, connectTimeoutMs: 2000, pipelined: 1 })
  await queryRow(pool, backendAfterSleep, 'first', 0) // its connection open
  const inFlight = queryRow(pool, backendAfterSleep, 'last', 0.2).catch((err: unknown) => err)
  await new Promise((resolve) => setTimeout(resolve, 50))
  await pool.end()
  t.match(await inFlight, { tag: 'last' }, 'the read in flight is answered')
  // Ended in the turn its connection began to open: the read is sent once it is open, then the connection closes.
  const opening = createReadPool({ connectionString: await testDatabaseUrl(), max: 1, statementTimeoutMs: 5000, connectTimeoutMs: 2000, pipelined: 1 })
  const waiting = opening.pipeline!.run((client) => client.query("select 'opening' as tag"), () => {}).then((result) => result.rows[0], (err: unknown) => err)
  await opening.end()
  t.same(await waiting, { tag: 'opening' }, 'a read waiting for its connection to open is answered too')
  const err = await queryRow(pool, quotient, 1, 1).then(() => undefined, (err: unknown) => err)
  t.ok(isDatabaseUnavailable(err), 'a read after the end answers 503')
  await pool.pipeline!.end()
  t.equal(pool.pipeline!.openCount, 0)
})

t.test('DB_PIPELINED_CONNECTIONS=0: the API\'s reads take turns on the pool', async (t) => {
  const app = await build(t, { DB_PIPELINED_CONNECTIONS: 0 })
  t.equal(app.dbPool.pipeline, undefined)
  t.equal((await app.inject('/api/runs/none')).statusCode, 404)
  const metrics = (await app.inject('/metrics')).body
  t.match(metrics, /db_pipelined_connections\{state="open"\} 0\n/)
  t.match(metrics, /db_reads_total\{statement="own"\} 1\n/)
})
