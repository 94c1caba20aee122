import { readFileSync } from 'node:fs'
import pg from 'pg'
import t, { type Test } from 'tap'
import { leaseMsFor, lockTimeoutMsFor } from '../events/keeper/keeper.ts'
import { build } from './helpers/app.ts'
import { needsServer, testDatabaseUrl } from './helpers/database.ts'
import { metricValue } from './helpers/metrics.ts'
import { startReplicas, type Replica } from './helpers/replicas.ts'
import { openStream } from './helpers/sse.ts'
import { PROMPTLY_MS, waitUntil } from './helpers/wait.ts'

/*
 * The keeper's lease (events/keeper/keeper.ts, db/sql/keeper.sql): only the
 * keeper settles holes (an event id drawn and rolled back), so a keeper that
 * hangs must be replaced. A keeper frozen by SIGSTOP (its process stopped,
 * its sessions alive on the server) is replaced by another replica within
 * its lease, and a hole holds that replica's streams for a second or two,
 * not for the whole freeze; when it comes back, its first tick finds the
 * lease gone, publishes nothing, and it follows. Before the lease, the
 * keeper was whoever held a session advisory lock, which a frozen process
 * keeps: a hole held every stream for the whole freeze (30 s measured).
 *
 * And in SQL, deterministically: a live lease is refused to others; a tick
 * under another's name or term publishes nothing; a lease given up (or
 * expired) goes at once, with the next term, and the old term is fenced off;
 * a role that may only read can neither take the lease, tick nor take a
 * census.
 *
 * And a session of the owner's left idle holding event_log_state's row
 * (only the owner may lock it) fails the keeper's ticks after its
 * lock_timeout, a quarter of the lease: warned once, naming the session,
 * counted; ticks resume once it lets go.
 */

const skip = needsServer('replicas are processes of their own over one Postgres, and the lease is held by sessions of their own')

const one = async <T extends pg.QueryResultRow>(client: pg.Client, text: string, values: unknown[] = []): Promise<T> => (await client.query<T>(text, values)).rows[0]!

async function connect (t: Test, url: string): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  t.teardown(() => client.end())
  return client
}

interface Lease { keeper: string | null, term: number, settled: number }

async function leaseOf (client: pg.Client): Promise<Lease> {
  const row = await one<{ keeper: string | null, term: string, settled: string }>(client,
    'select keeper, keeper_term::text as term, settled::text from event_log_state')
  return { keeper: row.keeper, term: Number(row.term), settled: Number(row.settled) }
}

async function takeLease (client: pg.Client, keeper: string, leaseMs: number): Promise<number | null> {
  const { term } = await one<{ term: string | null }>(client, 'select term::text from events_take_lease($1, $2)', [keeper, leaseMs])
  return term === null ? null : Number(term)
}

async function tick (client: pg.Client, keeper: string, term: number): Promise<{ leads: boolean, settled: number }> {
  const row = await one<{ leads: boolean, settled: string }>(client,
    'select leads, settled::text from events_keep_order(keeper => $1, term => $2, lease_ms => 60000)', [keeper, term])
  return { leads: row.leads, settled: Number(row.settled) }
}

const releaseLease = (client: pg.Client, keeper: string, term: number) => client.query('select events_release_lease($1, $2)', [keeper, term])

/** Commits an event (every column of events has a default but event_type); its id. */
async function commitEvent (client: pg.Client, type = 'lease-test'): Promise<number> {
  return Number((await one<{ id: string }>(client, 'insert into events (event_type) values ($1) returning event_id::text as id', [type])).id)
}

/** A hole (an id drawn in a transaction rolled back), then an event committed above it; both ids. */
async function holeThenEvent (client: pg.Client): Promise<{ hole: number, event: number }> {
  await client.query('begin')
  const hole = await commitEvent(client, 'rolled-back')
  await client.query('rollback')
  const event = await commitEvent(client)
  return { hole, event }
}

t.test('the lease in SQL: refused while live, no tick under another\'s name or term publishes, given up it goes at once with the next term, and the old term is fenced off', { skip }, async (t) => {
  const url = await testDatabaseUrl()
  const a = await connect(t, url)
  const b = await connect(t, url)
  // Whoever holds it when the test ends gives it up: the next test's replicas take it at once.
  t.teardown(() => a.query('select events_release_lease(keeper, keeper_term) from event_log_state where keeper is not null'))

  const term = await takeLease(a, 'a', 60_000)
  t.type(term, 'number', 'a free lease: a takes it, with a term')
  t.match(await leaseOf(b), { keeper: 'a', term }, 'event_log_state names a, under that term')
  t.equal(await takeLease(b, 'b', 60_000), null, 'while a\'s lease is live, b asks and gets none')
  t.equal((await leaseOf(b)).keeper, 'a', 'and a keeps it')

  t.equal((await tick(a, 'a', term!)).leads, true, 'a ticks under its term: it leads')
  const before = (await leaseOf(b)).settled
  const ids = [await commitEvent(b), await commitEvent(b), await commitEvent(b)]
  t.ok(ids[0]! > before, `events ${ids.join(', ')} committed above the settled position ${before}`)

  t.same(await tick(b, 'b', term!), { leads: false, settled: before }, 'b ticks with a\'s term: it does not lead')
  t.same(await tick(a, 'a', term! + 1), { leads: false, settled: before }, 'a ticks with a term not its own: it does not lead either')
  t.equal((await leaseOf(b)).settled, before, 'neither published anything: the settled position is where it was')

  t.same(await tick(a, 'a', term!), { leads: true, settled: ids[2] }, 'a tick of a\'s publishes them: they were settleable all along')

  await releaseLease(a, 'a', term!)
  t.equal(await takeLease(b, 'b', 60_000), term! + 1, 'a gives the lease up: b takes it at once, with the next term')
  t.match(await leaseOf(a), { keeper: 'b', term: term! + 1 }, 'event_log_state names b, under the next term')

  const later = await commitEvent(a)
  t.same(await tick(a, 'a', term!), { leads: false, settled: ids[2] }, 'a ticks with its old term: fenced off, it publishes nothing')
  t.equal((await leaseOf(a)).settled, ids[2], 'the settled position did not move')
  t.equal(await takeLease(a, 'a', 60_000), null, 'a asks for the lease again: b\'s is live')
  await releaseLease(a, 'a', term!)
  t.match(await leaseOf(a), { keeper: 'b', term: term! + 1 }, 'a giving up a lease it no longer holds changes nothing')
  t.same(await tick(b, 'b', term! + 1), { leads: true, settled: later }, 'b\'s tick under its term publishes the event since')

  // A lease not renewed expires: b asks again for 50 ms (its own: a new term) and ticks no more.
  t.equal(await takeLease(b, 'b', 50), term! + 2, 'b asks again for its own lease: a new term')
  let expiredTerm: number | null = null
  await waitUntil(async () => (expiredTerm = await takeLease(a, 'a', 60_000)) !== null, 'b\'s 50 ms lease to expire, and a to take it', 5000)
  t.equal(expiredTerm, term! + 3, 'once it expired, a takes it with the next term')
  t.same(await tick(b, 'b', term! + 2), { leads: false, settled: later }, 'and b\'s late tick is fenced off')
})

t.test('a role that may read every table can neither take the lease, tick, take a census, nor give the lease up (permission denied)', { skip }, async (t) => {
  const client = await connect(t, await testDatabaseUrl())
  const role = `ocp_test_lease_reader_${process.pid}`
  await client.query(`create role ${role} login nosuperuser`)
  t.teardown(async () => { await client.query('reset role'); await client.query(`drop owned by ${role}`); await client.query(`drop role ${role}`) })
  await client.query(`grant select on all tables in schema public to ${role}`)
  await client.query(`set role ${role}`)
  t.match(await leaseOf(client), { term: Number }, 'it reads event_log_state')
  await t.rejects(client.query('select events_keep_order()'), { code: '42501', message: /permission denied for function events_keep_order/ }, 'events_keep_order')
  await t.rejects(client.query('select events_keep_order(keeper => $1, term => 1, lease_ms => 60000)', [role]), { code: '42501' }, 'events_keep_order under a lease')
  await t.rejects(client.query('select events_take_lease($1, 60000)', [role]), { code: '42501', message: /permission denied for function events_take_lease/ }, 'events_take_lease')
  await t.rejects(client.query('select events_census(0, 0)'), { code: '42501', message: /permission denied for function events_census/ }, 'events_census')
  await t.rejects(client.query('select events_release_lease($1, 1)', [role]), { code: '42501' }, 'events_release_lease')
  await client.query('reset role')
})

/** The replica's event_log_keeper metric: 1 while it keeps the log, else 0. */
async function keeperMetric (replica: Replica): Promise<number> {
  return metricValue(await (await fetch(`http://127.0.0.1:${replica.port}/metrics`)).text(), 'event_log_keeper')
}

/** The process named in a lease (`${hostname}:${pid}:${random}`). */
const pidIn = (keeper: string | null) => Number(keeper?.split(':').at(-2))

/** A process's state as Linux has it (R running, S sleeping, T stopped...). */
const processState = (pid: number) => readFileSync(`/proc/${pid}/stat`, 'utf8').replace(/^.*\) /s, '')[0]

const KEEPER_INTERVAL_MS = 100
const LEASE_MS = leaseMsFor(KEEPER_INTERVAL_MS)
/** How soon a follower's stream must get past a hole while the keeper is frozen, which lasts until the test resumes it: a follower that never took over would never get past. */
const TAKEOVER_BOUND_MS = PROMPTLY_MS

t.test('a keeper frozen by SIGSTOP is replaced within its lease: a hole holds a follower\'s stream seconds, not the freeze; resumed, the old keeper is fenced off and follows', { skip }, async (t) => {
  const url = await testDatabaseUrl()
  const db = await connect(t, url)
  const replicas = await startReplicas(t, url, 2, { EVENTS_KEEPER_INTERVAL_MS: String(KEEPER_INTERVAL_MS), EVENTS_WAKEUP: 'off' })
  let roles: number[] = []
  await waitUntil(async () => {
    roles = await Promise.all(replicas.map(keeperMetric))
    return roles.includes(1) && roles.includes(0)
  }, 'one replica to keep the log (event_log_keeper 1), the other not (0)')
  const keeper = replicas[roles.indexOf(1)]!
  const follower = replicas[roles.indexOf(0)]!
  const before = await leaseOf(db)
  t.equal(pidIn(before.keeper), keeper.process.pid, `the lease (${before.keeper}, term ${before.term}) names the keeper's process`)
  t.equal(LEASE_MS, 1300, 'its lease: three ticks of 100 ms and a second')

  const followerUrl = `http://127.0.0.1:${follower.port}`
  const cursor = (await fetch(`${followerUrl}/api/runs`)).headers.get('x-event-cursor')
  t.match(cursor, /^\d+$/, 'the follower reports its position')
  const stream = await openStream(followerUrl, `/api/events/stream?after_event_id=${cursor}`)
  t.teardown(stream.close)
  t.equal(stream.status, 200, 'a stream on the follower, from there')

  // The keeper's session: the only one that ticks (a follower's asks for the lease, and reads the history's floor).
  const ticking = await db.query<{ pid: number }>('select pid from pg_stat_activity where datname = current_database() and application_name = \'ocp-api-keeper\' and query like \'%events_keep_order%\'')
  t.equal(ticking.rowCount, 1, 'one session ticks: the keeper\'s')
  const keeperSession = ticking.rows[0]!.pid

  // Frozen: the process stopped, its sessions alive on the server. A statement it sent just before the
  // stop still runs there; a tick of its own could settle the hole made next, so that one ends first.
  const pid = keeper.process.pid!
  const stoppedAt = Date.now()
  keeper.process.kill('SIGSTOP')
  await waitUntil(() => processState(pid) === 'T', 'the keeper\'s process to be stopped')
  await waitUntil(async () => (await one<{ n: number }>(db,
    'select count(*)::int as n from pg_stat_activity where datname = current_database() and application_name like \'ocp-api-keeper%\' and state = \'active\'')).n === 0,
  'the keeper\'s statement in flight, if any, to end')

  const first = await holeThenEvent(db)
  const committedAt = Date.now()
  const deliveredMs = await stream.waitFor((s) => s.events().some((event) => event.event_id === first.event), TAKEOVER_BOUND_MS)
    .then(() => Date.now() - committedAt, () => Infinity)
  t.ok(deliveredMs < TAKEOVER_BOUND_MS,
    `the follower's stream received event ${first.event}, above the hole ${first.hole}, ${deliveredMs} ms after its commit ` +
    `(${Date.now() - stoppedAt} ms after the keeper froze; lease ${LEASE_MS} ms, bound ${TAKEOVER_BOUND_MS} ms)`)
  t.equal(processState(pid), 'T', 'while the old keeper is frozen still')
  t.same(stream.events().map((event) => event.event_id), [first.event], 'the event, once; never the hole')
  t.equal(await keeperMetric(follower), 1, 'the follower keeps the log now (event_log_keeper 1)')
  const taken = await leaseOf(db)
  t.equal(pidIn(taken.keeper), follower.process.pid, `the lease (${taken.keeper}) names the follower's process`)
  t.ok(taken.term > before.term, `under a new term (${taken.term}, was ${before.term})`)
  t.ok(taken.settled >= first.event, `settled past the hole (${taken.settled})`)

  const resumedAt = Date.now()
  keeper.process.kill('SIGCONT')
  await waitUntil(async () => await keeperMetric(keeper) === 0, 'the old keeper to learn at its next tick that it lost the lease', 60_000)
  t.equal(await keeperMetric(keeper), 0, `resumed, the old keeper follows (event_log_keeper 0) ${Date.now() - resumedAt} ms after SIGCONT`)
  t.equal(pidIn((await leaseOf(db)).keeper), follower.process.pid, 'the lease names the follower\'s process still')

  const second = await holeThenEvent(db)
  await stream.waitFor((s) => s.events().some((event) => event.event_id === second.event))
  t.same(stream.events().map((event) => event.event_id), [first.event, second.event], `past another hole (${second.hole}), the next event (${second.event}) arrives once`)
  // Its keeper's session's last statement was the tick that found the lease gone; then it asks again.
  await waitUntil(async () => (await db.query('select 1 from pg_stat_activity where pid = $1 and query not like \'%events_keep_order%\'', [keeperSession])).rowCount === 1,
    'the old keeper to ask for the lease again (RETRY_MS after it lost it)')
  const after = await leaseOf(db)
  t.match(after, { keeper: taken.keeper, term: taken.term }, 'the follower\'s lease, its term unchanged: the old keeper asked for it again, and did not get it')
  t.same(await Promise.all([keeper, follower].map(keeperMetric)), [0, 1], 'one keeper: the follower')
})

t.test('a session left idle holding event_log_state fails the keeper\'s ticks after lock_timeout: one warning naming it, counted, and ticks resume when it lets go', { skip }, async (t) => {
  const lines: Array<Record<string, any>> = []
  const app = await build(t, { EVENTS_KEEPER_INTERVAL_MS: KEEPER_INTERVAL_MS }, { logger: { level: 'info', stream: { write: (line: string) => { lines.push(JSON.parse(line)) } } } })
  const keeper = app.events.keeper!
  await waitUntil(() => keeper.leading && keeper.ticks > 0, 'the app to keep the log')
  t.equal(keeper.lockTimeoutMs, lockTimeoutMsFor(LEASE_MS), `its lock_timeout: a quarter of its ${LEASE_MS} ms lease`)
  const lockTimeouts = async () => metricValue((await app.inject({ url: '/metrics' })).body, 'event_log_keeper_lock_timeouts_total')
  t.equal(await lockTimeouts(), 0, 'event_log_keeper_lock_timeouts_total starts at 0')

  const holder = await connect(t, await testDatabaseUrl())
  await holder.query('set application_name = \'left-idle\'')
  const { pid } = await one<{ pid: number }>(holder, 'select pg_backend_pid() as pid')
  await holder.query('begin')
  await holder.query('select * from event_log_state for update')
  const heldAt = Date.now()
  const warnings = () => lines.filter((line) => /a tick waited on a lock for lock_timeout/.test(line.msg))
  await waitUntil(() => warnings().length > 0, 'the keeper to warn')
  t.ok(Date.now() - heldAt >= keeper.lockTimeoutMs, `after waiting its lock_timeout (${keeper.lockTimeoutMs} ms)`)
  t.match(warnings()[0], {
    level: 40,
    lockTimeoutMs: keeper.lockTimeoutMs,
    waitedOn: /event_log_state/,
    holders: [{ pid, role: String, applicationName: 'left-idle', state: 'idle in transaction', transactionSeconds: Number }]
  }, 'the warning says where it waited, and names the session holding the row')
  await waitUntil(async () => await lockTimeouts() >= 2, 'the keeper to try again and time out again')
  t.equal(warnings().length, 1, 'one warning however many ticks time out')
  t.ok(keeper.leading, 'the keeper keeps its lease meanwhile (its connection is sound)')
  const event = await commitEvent(await connect(t, await testDatabaseUrl()))

  await holder.query('rollback')
  await waitUntil(() => lines.some((line) => /the lock it waited on was released; ticks resume/.test(line.msg)), 'the keeper to say it recovered')
  await waitUntil(async () => (await leaseOf(holder)).settled >= event, 'the keeper to settle the event committed meanwhile')
  t.pass(`ticks resume: the event committed while the row was held (${event}) is settled`)
})
