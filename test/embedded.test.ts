import { connect } from 'node:net'
import pg from 'pg'
import t, { type Test } from 'tap'
import { frame, namespaced, parseStartupOptions, startEmbeddedPostgres, type EmbeddedPostgres } from '../db/embedded.ts'
import { createReadPool } from '../db/pool.ts'
import { redactedUrl } from '../plugins/app/db.ts'
import { sleep, waitUntil } from './helpers/wait.ts'
import { testPool } from './helpers/database.ts'

// The embedded database (db/embedded.ts): PGlite behind a loopback bridge
// that gives its one backend to one connection at a time. Across processes:
// test/embedded-processes.test.ts.

async function embedded (t: Test, dataDir = 'memory://', options: { idleInTransactionTimeoutMs?: number } = {}): Promise<EmbeddedPostgres> {
  const database = await startEmbeddedPostgres({ dataDir, ...options })
  t.teardown(() => database.close())
  return database
}

t.test('startup options: -c pairs and --name=value, anything else refused', async (t) => {
  t.same([...parseStartupOptions('-c default_transaction_read_only=on  -cTimeZone=UTC --statement-timeout=5')], [
    ['default_transaction_read_only', 'on'], ['timezone', 'UTC'], ['statement_timeout', '5']
  ])
  t.same([...parseStartupOptions('')], [])
  t.throws(() => parseStartupOptions('-c'), /invalid startup option "-c"/)
  t.throws(() => parseStartupOptions('-c novalue'), /invalid startup option/)
  t.throws(() => parseStartupOptions('verbose'), /invalid startup option "verbose"/)
  t.throws(() => parseStartupOptions('-c bad;name=1'), /invalid setting name/)
})

t.test('statement and portal names move into the connection\'s namespace', async (t) => {
  const prepared = new Set<string>()
  const parse = namespaced(frame('P', Buffer.from('st\0select 1\0\0\0', 'latin1')), 'c7_', prepared)
  t.equal(parse.subarray(5).toString('latin1'), 'c7_st\0select 1\0\0\0')
  t.equal(parse.readInt32BE(1), parse.length - 1, 'the length follows')
  t.same([...prepared], ['c7_st'])
  t.equal(namespaced(frame('B', Buffer.from('\0st\0rest', 'latin1')), 'c7_', prepared).subarray(5).toString('latin1'), '\0c7_st\0rest', 'unnamed portal kept')
  t.equal(namespaced(frame('E', Buffer.from('pt\0\0\0\0\0', 'latin1')), 'c7_', prepared).subarray(5).toString('latin1'), 'c7_pt\0\0\0\0\0')
  t.equal(namespaced(frame('C', Buffer.from('Ppt\0', 'latin1')), 'c7_', prepared).subarray(5).toString('latin1'), 'Pc7_pt\0')
  t.same([...prepared], ['c7_st'], 'closing a portal leaves the statement')
  t.equal(namespaced(frame('C', Buffer.from('Sst\0', 'latin1')), 'c7_', prepared).subarray(5).toString('latin1'), 'Sc7_st\0')
  t.same([...prepared], [], 'closing the statement forgets it')
  const query = frame('Q', Buffer.from('select 1\0', 'latin1'))
  t.equal(namespaced(query, 'c7_', prepared), query, 'other messages pass as they are')
})

t.test('concurrent transactions and reads never see each other half-done', async (t) => {
  const database = await embedded(t)
  const pool = testPool(database.url, 8)
  t.teardown(() => pool.end())
  await pool.query('create table counters (worker int, n int)')
  const wrong: string[] = []
  await Promise.all(Array.from({ length: 8 }, async (_, worker) => {
    for (let i = 0; i < 15; i++) {
      if (worker % 2 === 0) {
        const client = await pool.connect()
        try {
          await client.query('begin')
          await client.query('insert into counters values ($1, $2)', [worker, i])
          await sleep(1) // others queue meanwhile: the transaction keeps the backend
          const { rows } = await client.query('select count(*)::int as n from counters where worker = $1', [worker])
          if (rows[0].n !== i + 1) wrong.push(`worker ${worker} saw ${rows[0].n} rows at ${i}`)
          await client.query(i % 5 === 4 ? 'rollback' : 'commit')
          if (i % 5 === 4) await client.query('insert into counters values ($1, $2)', [worker, i])
        } finally {
          client.release()
        }
      } else {
        const { rows } = await pool.query('select $1::text || repeat($2, 1000) as v', [String(i), 'x'])
        if (rows[0].v !== `${i}${'x'.repeat(1000)}`) wrong.push(`worker ${worker} read ${String(rows[0].v).slice(0, 20)}`)
      }
    }
  }))
  t.same(wrong, [], 'every statement ran in its own connection\'s context')
  const { rows } = await pool.query('select count(*)::int as n from counters')
  t.equal(rows[0].n, 60)
})

t.test('each connection keeps its own startup settings, as on a server', async (t) => {
  const database = await embedded(t)
  const reader = createReadPool({ connectionString: database.url, max: 2, statementTimeoutMs: 5000, connectTimeoutMs: 5000, pipelined: 0 })
  const writer = testPool(database.url, 2)
  t.teardown(async () => { await reader.end(); await writer.end() })
  await writer.query('create table notes (body text)')
  for (let round = 0; round < 3; round++) {
    await t.rejects(reader.query("insert into notes values ('no')"), /read-only transaction/, 'the read pool cannot write')
    await writer.query("insert into notes values ('yes')")
    const { rows } = await reader.query("select current_setting('TimeZone') as tz, count(*)::int as n from notes")
    t.same(rows[0], { tz: 'UTC', n: round + 1 })
  }
  const bad = new pg.Client({ connectionString: database.url, options: '-c no_such_setting=1' })
  await t.rejects(bad.connect(), /unrecognized configuration parameter "no_such_setting"/, 'a bad setting refuses the connection')
  const malformed = new pg.Client({ connectionString: database.url, options: 'oops' })
  await t.rejects(malformed.connect(), /invalid startup option "oops"/)
  t.same((await writer.query("select current_setting('default_transaction_read_only') as ro")).rows, [{ ro: 'off' }], 'the writer is still read-write')
})

t.test('a replication connection is refused (0A000), and the others are not disturbed', async (t) => {
  const database = await embedded(t)
  const pool = testPool(database.url, 1)
  t.teardown(() => pool.end())
  await pool.query('select 1')
  for (const replication of ['true', 'database'] as const) {
    const walSender = new pg.Client({ connectionString: database.url, replication } as pg.ClientConfig)
    await t.rejects(walSender.connect(), { code: '0A000', message: /does not serve replication connections/ }, replication)
  }
  const plain = new pg.Client({ connectionString: database.url, replication: 'false' } as pg.ClientConfig)
  await plain.connect()
  t.same((await plain.query('select 2 as n')).rows, [{ n: 2 }], 'replication=false is a plain connection')
  await plain.end()
  t.same((await pool.query({ text: 'select $1::int as n', values: [3] })).rows, [{ n: 3 }], 'the extended protocol still works for the others')
})

t.test('prepared statements: each connection has its own names, dropped when it goes', async (t) => {
  const database = await embedded(t)
  const clients = await Promise.all([0, 1, 2].map(async () => {
    const client = new pg.Client({ connectionString: database.url })
    await client.connect()
    return client
  }))
  const [first, second, observer] = clients as [pg.Client, pg.Client, pg.Client]
  const wrong: string[] = []
  await Promise.all([first, second].map(async (client, c) => {
    for (let i = 0; i < 20; i++) {
      // The same name, a different statement on each connection, as two pooled connections may.
      const { rows } = await client.query({ name: 'same-name"', text: c === 0 ? 'select $1::int + 1000 as v' : 'select $1::int * 2 as v', values: [i] })
      if (rows[0].v !== (c === 0 ? i + 1000 : i * 2)) wrong.push(`connection ${c}: ${rows[0].v} for ${i}`)
    }
  }))
  t.same(wrong, [])
  const count = async () => (await observer.query('select count(*)::int as n from pg_prepared_statements')).rows[0].n
  t.equal(await count(), 2)
  await first.end()
  await waitUntil(async () => await count() === 1, 'the first connection\'s statement to go', 60_000)
  // Cut without a Terminate while another connection holds the backend (a transaction): its statements go at its turn.
  const cut = new pg.Client({ connectionString: database.url })
  cut.on('error', () => {})
  await cut.connect()
  await cut.query({ name: 'cut', text: 'select 1' })
  t.equal(await count(), 2)
  await second.query('begin')
  ;(cut as unknown as { connection: { stream: { destroy: () => void } } }).connection.stream.destroy()
  await new Promise((resolve) => setTimeout(resolve, 100))
  await second.query('rollback')
  await waitUntil(async () => await count() === 1, 'the cut connection\'s statement to go', 60_000)
  await second.query('begin')
  const closing = second.query({ name: 'other', text: 'select 1' }).then(() => second.end())
  await closing
  await waitUntil(async () => await count() === 0, 'the second connection\'s statements to go', 60_000)
  await observer.end()
})

t.test('a client that goes mid-transaction is rolled back, and the others carry on', async (t) => {
  const database = await embedded(t)
  const pool = testPool(database.url, 2)
  t.teardown(() => pool.end())
  await pool.query('create table items (id int)')
  const leaver = new pg.Client({ connectionString: database.url })
  await leaver.connect()
  await leaver.query('begin')
  await leaver.query('insert into items values (1)')
  const waiting = pool.query('select count(*)::int as n from items') // waits for the backend
  const impatient = new pg.Client({ connectionString: database.url })
  impatient.on('error', () => {})
  const gaveUp = impatient.connect().catch((err: Error) => err) // waits too, then goes
  await sleep(50)
  ;(impatient as unknown as { connection: { stream: { destroy (): void } } }).connection.stream.destroy()
  t.type(await gaveUp, Error)
  leaver.on('error', () => {})
  ;(leaver as unknown as { connection: { stream: { destroy (): void } } }).connection.stream.destroy()
  t.same((await waiting).rows, [{ n: 0 }], 'the insert was rolled back')

  // Gone in the middle of a protocol cycle (Parse sent, no Sync): the cycle is finished for it.
  const socket = connect(Number(new URL(database.url).port), '127.0.0.1')
  await new Promise((resolve) => socket.once('connect', resolve))
  socket.write(startupMessage({ user: 'postgres', database: 'postgres' }))
  await new Promise((resolve) => socket.once('data', resolve))
  socket.write(frame('P', Buffer.from('\0select 1\0\0\0', 'latin1')))
  await sleep(50)
  socket.destroy()
  t.same((await pool.query('select 2 as two')).rows, [{ two: 2 }])
})

t.test('an idle transaction is ended after the timeout, freeing the backend', async (t) => {
  const database = await embedded(t, 'memory://', { idleInTransactionTimeoutMs: 200 })
  const idler = new pg.Client({ connectionString: database.url })
  const errors: Error[] = []
  idler.on('error', (err) => errors.push(err))
  await idler.connect()
  await idler.query('begin')
  const other = new pg.Client({ connectionString: database.url })
  await other.connect()
  t.same((await other.query('select 1 as one')).rows, [{ one: 1 }], 'answered once the idler is cut')
  await waitUntil(() => errors.length > 0, 'the idler to hear why', 60_000)
  t.match(errors[0]!.message, /idle-in-transaction timeout/)
  await other.end()
})

t.test('the wire: SSL refused politely, cancel and garbage closed, Terminate ends only the connection', async (t) => {
  const database = await embedded(t)
  const port = Number(new URL(database.url).port)
  const ssl = connect(port, '127.0.0.1')
  ssl.write(int32s(8, 80877103))
  const [answer] = await once(ssl, 'data') as [Buffer]
  t.equal(answer.toString(), 'N')
  ssl.destroy()
  for (const bytes of [int32s(16, 80877102, 1, 2), int32s(8, 12345678), int32s(3, 0), Buffer.concat([startupMessage({ user: 'postgres' })])]) {
    const socket = connect(port, '127.0.0.1')
    socket.on('error', () => {})
    socket.write(bytes)
    if (bytes.length > 16) {
      await once(socket, 'data')
      socket.write(Buffer.from([0x51, 0, 0, 0, 2])) // a message shorter than its own length field
    }
    await once(socket, 'close')
    t.pass(`closed after ${bytes.subarray(0, 8).toString('hex')}`)
  }
  // Messages split across packets, and several in one go.
  const raw = connect(port, '127.0.0.1')
  const startup = startupMessage({ user: 'postgres', database: 'postgres' })
  raw.write(startup.subarray(0, 10))
  await sleep(20)
  raw.write(startup.subarray(10))
  await once(raw, 'data')
  const query = frame('Q', Buffer.from('select 41 + 1\0', 'latin1'))
  let received = ''
  raw.on('data', (data: Buffer) => { received += data.toString('latin1') })
  const holder = new pg.Client({ connectionString: database.url })
  await holder.connect()
  await holder.query('begin') // the raw connection's queries wait for the backend meanwhile
  raw.write(query.subarray(0, 7))
  await sleep(20)
  raw.write(query.subarray(7))
  await sleep(20)
  raw.write(query) // arrives while the first still waits its turn
  await sleep(20)
  await holder.query('commit')
  await holder.end()
  await waitUntil(() => received.split('42').length === 3, 'both answers', 60_000)
  raw.destroy()
  const client = new pg.Client({ connectionString: database.url })
  await client.connect()
  await client.end() // sends Terminate
  const again = new pg.Client({ connectionString: database.url })
  await again.connect()
  t.same((await again.query('select 3 as three')).rows, [{ three: 3 }], 'the backend lives on')
  await again.end()
})

t.test('the log names a server database without its password', async (t) => {
  t.equal(redactedUrl('postgres://ocp:secret@db:5432/ocp'), 'postgres://ocp:***@db:5432/ocp')
  t.equal(redactedUrl('postgres://ocp@db/ocp'), 'postgres://ocp@db/ocp')
})

function int32s (...values: number[]): Buffer {
  const buffer = Buffer.alloc(values.length * 4)
  values.forEach((value, i) => buffer.writeInt32BE(value, i * 4))
  return buffer
}

function startupMessage (parameters: Record<string, string>): Buffer {
  const body = Buffer.from(Object.entries(parameters).map(([key, value]) => `${key}\0${value}\0`).join('') + '\0', 'utf8')
  return Buffer.concat([int32s(body.length + 8, 196608), body])
}

async function once (emitter: NodeJS.EventEmitter, event: string): Promise<unknown[]> {
  return new Promise((resolve) => emitter.once(event, (...args: unknown[]) => resolve(args)))
}
