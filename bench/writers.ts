/*
 * The orchestrator's write transaction, with and without the service's
 * triggers and functions on events (BENCHMARKS.md, "Event writers: write
 * throughput with and without the service's triggers").
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm run bench:writers
 *   ... npm run bench:writers -- --rounds 5 --seconds 10 --warmup 2 --clients 16
 *   ... npm run bench:writers -- --quick     (CI's smoke run: figures not meaningful)
 *
 * Two databases, recreated at every run so that a changed migration is
 * always the one measured: ocp_bench_writers_service, migrated by the
 * service's own migrateToLatest, and ocp_bench_writers_bare, the same
 * schema without the service's write path on events (its triggers dropped,
 * event_id's default a plain nextval of its sequence, its functions
 * dropped). Both get the same runs and tasks. Then:
 *
 * 1. Throughput: pgbench -M prepared runs the orchestrator's transaction
 *    (a task's status, then the event announcing it, event_id left out;
 *    db/writer.ts setTaskStatus) with many writers and with one, on the two
 *    databases in alternating rounds; prints each round's tps and the
 *    median ratio service / bare.
 * 2. The open-transaction probe, on the service's database: 8 writers
 *    (node pg clients, each transaction timed) run the same transaction in
 *    a loop, for 3 s with nothing else, then for 3 s while another
 *    connection holds open a transaction that has inserted an event.
 *
 * Each figure is printed as it comes and again as a `figure {json}` line,
 * then as tables.
 */
import { execFileSync, spawn, spawnSync } from 'node:child_process'
import { existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs'
import { cpus, loadavg, tmpdir } from 'node:os'
import { join } from 'node:path'
import { performance } from 'node:perf_hooks'
import { parseArgs } from 'node:util'
import pg from 'pg'
import { migrateToLatest } from '../db/migrate.ts'
import { formatInt, gitDescription, sleep, withDatabase } from './common.ts'

const { values: args } = parseArgs({
  options: {
    seconds: { type: 'string', default: '10' },
    rounds: { type: 'string', default: '3' },
    warmup: { type: 'string', default: '2' },
    clients: { type: 'string', default: '16' },
    quick: { type: 'boolean', default: false },
    keep: { type: 'boolean', default: false },
    instructions: { type: 'boolean', default: false }
  }
})
const USAGE = 'usage: npm run bench:writers -- [--seconds N] [--rounds N] [--warmup N] [--clients N] [--quick] [--keep] | --instructions'
// --quick: one round of 20 transactions per writer without warm-up, for CI (it must work; its figures mean little).
const seconds = Number(args.seconds)
/** Each measured stretch: --seconds, or the smoke run's count of transactions. */
const measuredLength: Length = args.quick ? { transactions: 20 } : { seconds }
const rounds = args.quick ? 1 : Number(args.rounds)
const warmup = args.quick ? 0 : Number(args.warmup)
const manyWriters = Number(args.clients)
if (![seconds, rounds, manyWriters].every((n) => Number.isInteger(n) && n >= 1) || !Number.isInteger(warmup) || warmup < 0) {
  console.error(USAGE)
  process.exit(2)
}

const ADMIN_URL = process.env.DATABASE_URL || 'postgres://postgres@127.0.0.1:5432/postgres'
const SERVICE = 'ocp_bench_writers_service'
const BARE = 'ocp_bench_writers_bare'
type Side = typeof SERVICE | typeof BARE
const sideName = (side: Side) => side === SERVICE ? 'service' : 'bare'

/** 10 runs of 100 tasks: writers pick a task at random, so that 16 of them seldom wait on the same row. */
const RUNS = 10
const TASKS_PER_RUN = 100
/** The open-transaction probe: how long the transaction is held open, and how many writers run meanwhile. */
const HOLD_MS = 3000
const PROBE_WRITERS = 8
const TARGETS = { many: 0.9, one: 0.95 }

/*
 * The orchestrator's transaction: db/writer.ts setTaskStatus, the event last.
 * Ids are built from numbers in SQL because pgbench has no string variables;
 * pgbench and the probe's writers send these very statements ($1 = run,
 * $2 = task).
 */
const UPDATE_TASK = "UPDATE tasks SET status = 'running', updated_at = now() WHERE run_id = 'bench-run-' || $1::int AND task_id = 'task-' || $2::int"
const INSERT_EVENT = "INSERT INTO events (event_type, run_id, task_id, summary, payload) VALUES ('task_running', 'bench-run-' || $1::int, 'task-' || $2::int, '', '{\"status\": \"running\"}')"

const PGBENCH_SCRIPT = [
  `\\set r random(1, ${RUNS})`,
  `\\set t random(1, ${TASKS_PER_RUN})`,
  'BEGIN;',
  `${UPDATE_TASK.replaceAll('$1', ':r').replaceAll('$2', ':t')};`,
  `${INSERT_EVENT.replaceAll('$1', ':r').replaceAll('$2', ':t')};`,
  'COMMIT;',
  ''
].join('\n')

/** A machine-readable line per figure: `figure {"name": ..., "value": ...}`. */
function figure (name: string, fields: Record<string, string | number>, value: number, unit: string): void {
  console.log(`figure ${JSON.stringify({ name, ...fields, value: Number(value.toFixed(3)), unit })}`)
}

const median = (values: number[]) => {
  const sorted = [...values].sort((a, b) => a - b)
  const middle = Math.floor(sorted.length / 2)
  return sorted.length % 2 === 1 ? sorted[middle]! : (sorted[middle - 1]! + sorted[middle]!) / 2
}
const percentile = (sorted: number[], p: number) => sorted.length === 0 ? Number.NaN : sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * p))]!
const fixed = (n: number, digits = 2) => Number.isNaN(n) ? '' : n.toFixed(digits)

// ---- the databases -----------------------------------------------------------

async function withClient<T> (url: string, use: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: url, application_name: 'ocp-bench-writers' })
  await client.connect()
  try {
    return await use(client)
  } finally {
    await client.end()
  }
}

/** The same runs and tasks in both databases, tasks `ready`. */
async function seed (client: pg.Client): Promise<void> {
  await client.query(`insert into runs (run_id, goal, summary, status)
    select 'bench-run-' || r, 'writers benchmark', '', 'running' from generate_series(1, ${RUNS}) r`)
  await client.query(`insert into tasks (run_id, task_id, title, summary, status, priority, acceptance_json)
    select 'bench-run-' || r, 'task-' || t, 'task ' || t, '', 'ready', 'normal', '[]'::jsonb
    from generate_series(1, ${RUNS}) r, generate_series(1, ${TASKS_PER_RUN}) t`)
  await client.query('vacuum analyze')
}

/** What the schema does when an event is inserted: event_id's default and the triggers on events. */
async function describeEventsWritePath (client: pg.Client): Promise<string> {
  const column = await client.query(`select a.attidentity, pg_get_expr(d.adbin, d.adrelid) as default_expr
    from pg_attribute a left join pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
    where a.attrelid = 'events'::regclass and a.attname = 'event_id'`)
  const { attidentity, default_expr: defaultExpr } = column.rows[0]
  const triggers = await client.query("select pg_get_triggerdef(oid) as def from pg_trigger where tgrelid = 'events'::regclass and not tgisinternal order by tgname")
  const identity = attidentity === 'a' ? 'identity (always)' : attidentity === 'd' ? 'identity (by default)' : undefined
  return `event_id ${identity ?? `default ${defaultExpr ?? 'none'}`}; ` +
    (triggers.rows.length === 0 ? 'no triggers on events' : `triggers: ${triggers.rows.map((row) => row.def).join('; ')}`)
}

/**
 * Makes the bare database "the same schema without the service's triggers
 * and functions": drops every trigger on events, gives event_id a plain
 * nextval of its sequence (an identity is kept as it is), then drops the
 * schema's own functions. A function something else still depends on is
 * kept and said so. Returns what it did.
 */
async function stripServiceWritePath (client: pg.Client): Promise<string[]> {
  const done: string[] = []
  const triggers = await client.query("select tgname from pg_trigger where tgrelid = 'events'::regclass and not tgisinternal order by tgname")
  for (const { tgname } of triggers.rows) {
    await client.query(`drop trigger ${client.escapeIdentifier(tgname)} on events`)
    done.push(`dropped trigger ${tgname}`)
  }
  const column = await client.query(`select a.attidentity,
      coalesce(pg_get_serial_sequence('events', 'event_id'), to_regclass('events_event_id_seq')::text) as sequence
    from pg_attribute a where a.attrelid = 'events'::regclass and a.attname = 'event_id'`)
  const { attidentity, sequence } = column.rows[0]
  if (attidentity !== '') {
    done.push('kept event_id\'s identity')
  } else if (sequence === null) {
    throw new Error('bare database: events.event_id is no identity and has no sequence (neither owned nor events_event_id_seq)')
  } else {
    await client.query(`alter table events alter column event_id set default nextval(${client.escapeLiteral(sequence)}::regclass)`)
    done.push(`event_id default nextval('${sequence}')`)
  }
  // The schema's own functions and procedures (not Postgres's, not an extension's).
  const functions = await client.query(`select p.oid::regprocedure::text as signature
    from pg_proc p join pg_namespace n on n.oid = p.pronamespace
    where n.nspname not in ('pg_catalog', 'information_schema') and n.nspname not like 'pg\\_%' and p.prokind in ('f', 'p')
      and not exists (select from pg_depend d where d.classid = 'pg_proc'::regclass and d.objid = p.oid and d.deptype = 'e')
    order by 1`)
  for (const { signature } of functions.rows) {
    await client.query('savepoint drop_function')
    try {
      await client.query(`drop routine ${signature}`)
      await client.query('release savepoint drop_function')
      done.push(`dropped function ${signature}`)
    } catch (err) {
      if ((err as { code?: string }).code !== '2BP01') throw err
      await client.query('rollback to savepoint drop_function')
      done.push(`KEPT function ${signature} (still used: ${(err as { detail?: string }).detail ?? (err as Error).message})`)
    }
  }
  return done
}

async function createDatabases (admin: pg.Client, adminUrl = ADMIN_URL): Promise<{ applied: string[], stripped: string[] }> {
  let applied: string[] = []
  let stripped: string[] = []
  for (const side of [SERVICE, BARE] as const) {
    await admin.query(`drop database if exists ${side} with (force)`)
    await admin.query(`create database ${side}`)
    applied = (await migrateToLatest(withDatabase(adminUrl, side))).applied
    await withClient(withDatabase(adminUrl, side), async (client) => {
      if (side === BARE) {
        await client.query('begin')
        stripped = await stripServiceWritePath(client)
        await client.query('commit')
      }
      await seed(client)
    })
  }
  return { applied, stripped }
}

// ---- pgbench -----------------------------------------------------------------

/** Debian's pgbench: on PATH, else beside pg_config's binaries, else any installed major's. */
function findPgbench (): string {
  if (spawnSync('pgbench', ['--version']).error === undefined) return 'pgbench'
  const candidates: string[] = []
  try {
    candidates.push(join(execFileSync('pg_config', ['--bindir'], { encoding: 'utf8' }).trim(), 'pgbench'))
  } catch {}
  if (existsSync('/usr/lib/postgresql')) {
    for (const major of readdirSync('/usr/lib/postgresql').sort().reverse()) candidates.push(`/usr/lib/postgresql/${major}/bin/pgbench`)
  }
  const found = candidates.find((candidate) => existsSync(candidate))
  if (found === undefined) {
    console.error('bench: pgbench not found (on PATH, in pg_config --bindir, in /usr/lib/postgresql/*/bin); on Debian 12 it comes with postgresql-15 (apt-get install postgresql-15)')
    process.exit(2)
  }
  return found
}

interface PgbenchResult { tps: number, transactions: number, failed: number, latencyMs: number }

/** How long a stretch runs: seconds, or (the smoke run) a number of transactions per client, which a loaded machine cannot cut to none. */
type Length = { seconds: number } | { transactions: number }

function pgbench (binary: string, script: string, database: Side, clients: number, length: Length): Promise<PgbenchResult> {
  const url = new URL(withDatabase(ADMIN_URL, database))
  const password = decodeURIComponent(url.password)
  const argv = [
    '-n', '-M', 'prepared', '-c', String(clients), '-j', String(Math.min(2, clients)),
    ...('seconds' in length ? ['-T', String(length.seconds)] : ['-t', String(length.transactions)]), '-f', script,
    '-h', url.hostname, '-p', url.port || '5432', '-U', decodeURIComponent(url.username || 'postgres'), database
  ]
  return new Promise((resolve, reject) => {
    const child = spawn(binary, argv, { env: password === '' ? process.env : { ...process.env, PGPASSWORD: password }, stdio: ['ignore', 'pipe', 'pipe'] })
    let output = ''
    child.stdout.on('data', (chunk) => { output += chunk })
    child.stderr.on('data', (chunk) => { output += chunk })
    child.on('error', reject)
    child.on('exit', (code) => {
      const tps = /tps = ([\d.]+) \(without initial connection time\)/.exec(output)
      const transactions = /number of transactions actually processed: (\d+)/.exec(output)
      if (code !== 0 || tps === null || transactions === null) {
        reject(new Error(`pgbench on ${database} failed (exit ${code}):\n${output}`))
        return
      }
      resolve({
        tps: Number(tps[1]),
        transactions: Number(transactions[1]),
        failed: Number(/number of failed transactions: (\d+)/.exec(output)?.[1] ?? 0),
        latencyMs: Number(/latency average = ([\d.]+) ms/.exec(output)?.[1] ?? Number.NaN)
      })
    })
  })
}

// ---- throughput ----------------------------------------------------------------

interface Throughput { clients: number, bare: number[], service: number[], ratios: number[] }

async function throughput (binary: string, script: string, admin: pg.Client, counters: Record<Side, pg.Client>, clients: number): Promise<Throughput> {
  let checkpointWarned = false
  /** Every stretch starts from a checkpoint, so that one side does not pay for the other's dirty pages and full-page writes. */
  const checkpoint = async () => {
    try {
      await admin.query('checkpoint')
    } catch (err) {
      if (!checkpointWarned) console.log(`  (no checkpoint between stretches: ${(err as Error).message})`)
      checkpointWarned = true
    }
  }
  const eventCount = async (side: Side) => Number((await counters[side].query('select count(*) as n from events')).rows[0].n)
  /** One stretch, checked: every transaction committed its event. */
  const stretch = async (side: Side, length: Length) => {
    await checkpoint()
    const before = await eventCount(side)
    const result = await pgbench(binary, script, side, clients, length)
    const inserted = await eventCount(side) - before
    if (result.failed > 0 || inserted !== result.transactions) {
      throw new Error(`${sideName(side)}, ${clients} writers: ${result.transactions} transactions, ${result.failed} failed, ${inserted} events inserted`)
    }
    return result
  }

  const label = clients === 1 ? '1 writer' : `${clients} writers`
  if (warmup > 0) {
    for (const side of [BARE, SERVICE] as const) await stretch(side, { seconds: warmup })
  }
  const measured: Throughput = { clients, bare: [], service: [], ratios: [] }
  for (let round = 1; round <= rounds; round++) {
    // Which side goes first alternates, so that a drift of the machine's load falls on both sides.
    const order = round % 2 === 1 ? [BARE, SERVICE] as const : [SERVICE, BARE] as const
    const results = {} as Record<Side, PgbenchResult>
    for (const side of order) results[side] = await stretch(side, measuredLength)
    const ratio = results[SERVICE].tps / results[BARE].tps
    measured.bare.push(results[BARE].tps)
    measured.service.push(results[SERVICE].tps)
    measured.ratios.push(ratio)
    console.log(`  ${label}, round ${round}: bare ${formatInt(results[BARE].tps)} tx/s (${fixed(results[BARE].latencyMs)} ms), ` +
      `service ${formatInt(results[SERVICE].tps)} tx/s (${fixed(results[SERVICE].latencyMs)} ms): service / bare ${fixed(ratio)}`)
    for (const side of [BARE, SERVICE] as const) figure('tps', { writers: clients, database: sideName(side), round }, results[side].tps, 'tx/s')
    figure('ratio', { writers: clients, round }, ratio, 'service/bare')
  }
  const target = clients === 1 ? TARGETS.one : TARGETS.many
  const ratio = median(measured.ratios)
  console.log(`  ${label}: median service / bare ${fixed(ratio)} (target >= ${target}: ${ratio >= target ? 'met' : 'MISSED'})`)
  figure('median_ratio', { writers: clients }, ratio, 'service/bare')
  return measured
}

// ---- the open-transaction probe ----------------------------------------------------

interface Window { commits: number, p50: number, p99: number, max: number, ms: number }

/** The orchestrator's transaction in a loop until `until`, each one timed from BEGIN to COMMIT's reply. */
async function writeUntil (client: pg.Client, until: number, latencies: number[]): Promise<void> {
  // Bounded twice: by the clock and by a count no 3 s stretch can reach.
  for (let i = 0; i < 1_000_000 && performance.now() < until; i++) {
    const run = 1 + Math.floor(Math.random() * RUNS)
    const task = 1 + Math.floor(Math.random() * TASKS_PER_RUN)
    const started = performance.now()
    await client.query('BEGIN')
    const updated = await client.query({ name: 'update-task', text: UPDATE_TASK, values: [run, task] })
    const inserted = await client.query({ name: 'insert-event', text: INSERT_EVENT, values: [run, task] })
    await client.query('COMMIT')
    latencies.push(performance.now() - started)
    if (updated.rowCount !== 1 || inserted.rowCount !== 1) throw new Error(`probe: updated ${updated.rowCount} tasks, inserted ${inserted.rowCount} events`)
  }
}

async function writersFor (writers: pg.Client[], ms: number): Promise<Window> {
  const latencies: number[] = []
  const started = performance.now()
  await Promise.all(writers.map((writer) => writeUntil(writer, started + ms, latencies)))
  latencies.sort((a, b) => a - b)
  return { commits: latencies.length, p50: percentile(latencies, 0.5), p99: percentile(latencies, 0.99), max: latencies[latencies.length - 1] ?? Number.NaN, ms }
}

async function openTransactionProbe (): Promise<{ free: Window, held: Window }> {
  const url = withDatabase(ADMIN_URL, SERVICE)
  // statement_timeout: should a writer wait on something that never ends, the probe fails instead of hanging.
  const connect = async () => {
    const client = new pg.Client({ connectionString: url, application_name: 'ocp-bench-writers', statement_timeout: 60_000 })
    await client.connect()
    return client
  }
  const holder = await connect()
  const writers: pg.Client[] = []
  try {
    for (let i = 0; i < PROBE_WRITERS; i++) writers.push(await connect())
    await writersFor(writers, 500) // warm-up: connections, prepared statements
    const free = await writersFor(writers, HOLD_MS)

    await holder.query('BEGIN')
    await holder.query("INSERT INTO events (event_type, summary) VALUES ('bench_open_transaction', 'held open by bench/writers.ts')")
    const writing = writersFor(writers, HOLD_MS)
    try {
      await sleep(HOLD_MS)
    } finally {
      await holder.query('COMMIT')
    }
    return { free, held: await writing }
  } finally {
    await Promise.all([holder, ...writers].map((client) => client.end()))
  }
}

// ---- report ---------------------------------------------------------------------------

function table (header: string[], lines: string[][]): string {
  const align = header.map((_cell, i) => i === 0 ? '---' : '---:')
  return [header, align, ...lines].map((cells) => `| ${cells.join(' | ')} |`).join('\n')
}

async function main () {
  // The load average before the benchmark does anything says whether something else shares the
  // two cores (the ratios are taken side by side; the tps are not). Later it counts the benchmark too.
  const load = loadavg()
  const binary = findPgbench()
  const scriptDir = mkdtempSync(join(tmpdir(), 'ocp-bench-writers-'))
  const script = join(scriptDir, 'orchestrator-transaction.sql')
  writeFileSync(script, PGBENCH_SCRIPT)
  const admin = new pg.Client({ connectionString: ADMIN_URL, application_name: 'ocp-bench-writers' })
  await admin.connect()
  const counters = {} as Record<Side, pg.Client>
  try {
    const version = (await admin.query('show server_version')).rows[0].server_version as string
    const synchronousCommit = (await admin.query('show synchronous_commit')).rows[0].synchronous_commit as string
    const { applied, stripped } = await createDatabases(admin)
    for (const side of [SERVICE, BARE] as const) {
      counters[side] = new pg.Client({ connectionString: withDatabase(ADMIN_URL, side), application_name: 'ocp-bench-writers' })
      await counters[side].connect()
    }
    const servicePath = await describeEventsWritePath(counters[SERVICE])
    const barePath = await describeEventsWritePath(counters[BARE])

    console.log(`machine: ${cpus().length} × ${cpus()[0]?.model ?? 'unknown CPU'}, load average ${load.map((n) => n.toFixed(2)).join(' ')}; ` +
      `Node.js ${process.version}, Postgres ${version} (synchronous_commit ${synchronousCommit}), ${binary === 'pgbench' ? 'pgbench' : binary}; commit ${gitDescription()}`)
    console.log(`${SERVICE}: migrations ${applied.join(', ')}; ${servicePath}`)
    console.log(`${BARE}: the same, then ${stripped.join(', ')}; ${barePath}`)
    console.log(`both: ${RUNS} runs, ${formatInt(RUNS * TASKS_PER_RUN)} tasks; the transaction: BEGIN; ${UPDATE_TASK}; ${INSERT_EVENT}; COMMIT`)
    console.log(`throughput: pgbench -M prepared, ${rounds} round(s) of ${'seconds' in measuredLength ? `${seconds} s` : `${measuredLength.transactions} transactions per writer`} per database, alternating, after ${warmup} s of warm-up each\n`)

    const results: Throughput[] = []
    for (const clients of manyWriters === 1 ? [1] : [manyWriters, 1]) {
      results.push(await throughput(binary, script, admin, counters, clients))
    }

    console.log(`\nopen-transaction probe (${SERVICE}): ${PROBE_WRITERS} writers for ${HOLD_MS / 1000} s, then ${HOLD_MS / 1000} s more while another connection holds a transaction open after inserting an event`)
    const { free, held } = await openTransactionProbe()
    for (const [window, measured] of [['none', free], ['held', held]] as const) {
      console.log(`  transaction held open: ${window === 'none' ? 'no ' : 'yes'}  ${formatInt(measured.commits)} commits (${formatInt(measured.commits / (measured.ms / 1000))}/s), ` +
        `latency p50 ${fixed(measured.p50)} ms, p99 ${fixed(measured.p99)} ms, max ${fixed(measured.max)} ms`)
      figure('probe_commits', { held_open: window }, measured.commits, 'commits')
      figure('probe_p99', { held_open: window }, measured.p99, 'ms')
      figure('probe_max', { held_open: window }, measured.max, 'ms')
    }
    figure('probe_delay_at_most', { hold_ms: HOLD_MS }, held.max, 'ms')

    // ---- summary
    console.log(`\n## Event writers: ${new Date().toISOString().slice(0, 16).replace('T', ' ')} UTC, commit ${gitDescription()}, ` +
      `load average (1 min) ${load[0]!.toFixed(2)} before it started\n`)
    console.log(`service: migrations ${applied.join(', ')}; bare: the same without the service's triggers and functions on events\n`)
    console.log(table(
      ['writers', 'bare tx/s by round', 'service tx/s by round', 'service / bare by round', 'median service / bare', 'target', 'verdict'],
      results.map(({ clients, bare, service, ratios }) => {
        const target = clients === 1 ? TARGETS.one : TARGETS.many
        const ratio = median(ratios)
        return [String(clients), bare.map(formatInt).join(', '), service.map(formatInt).join(', '), ratios.map((n) => fixed(n)).join(', '), fixed(ratio), `≥ ${target}`, ratio >= target ? 'met' : '**MISSED**']
      })
    ))
    console.log('')
    console.log(table(
      [`${PROBE_WRITERS} writers, ${HOLD_MS / 1000} s`, 'commits', 'commits/s', 'p50 ms', 'p99 ms', 'max ms'],
      ([['nothing held open', free], [`a transaction held open ${HOLD_MS / 1000} s`, held]] as Array<[string, Window]>).map(([label, window]) =>
        [label, formatInt(window.commits), formatInt(window.commits / (window.ms / 1000)), fixed(window.p50), fixed(window.p99), fixed(window.max)])
    ))
    console.log(`\na writer holding its transaction open ${HOLD_MS / 1000} s delays other writers' commits by at most ${formatInt(held.max)} ms ` +
      `(the longest of their transactions while it was open, its own time included; with nothing held open: ${fixed(free.max)} ms)`)
  } finally {
    await Promise.all(Object.values(counters).map((client) => client.end()))
    if (!args.keep) {
      for (const side of [SERVICE, BARE]) await admin.query(`drop database if exists ${side} with (force)`)
    }
    await admin.end()
    rmSync(scriptDir, { recursive: true, force: true })
  }
}

// ---- instructions per transaction (--instructions) ---------------------------------

/**
 * The same comparison counted in CPU instructions instead of seconds, so
 * that it does not depend on what else the machine is doing: a Postgres
 * of its own (initdb in a temporary directory, as the postgres user), the
 * two databases made as above, then each runs the orchestrator's
 * transaction in single-user mode (no client, no network, no fsync) under
 * valgrind's callgrind, 200 times and 1,200 times; the difference over
 * 1,000 is the server's instructions per transaction.
 */
async function instructions (): Promise<void> {
  const bin = execFileSync('pg_config', ['--bindir'], { encoding: 'utf8' }).trim()
  if (spawnSync('valgrind', ['--version']).error !== undefined) {
    console.error('bench: valgrind not found (apt-get install valgrind)')
    process.exit(2)
  }
  // Postgres refuses to run as root: run its binaries as postgres when we are root.
  const asPostgres = (command: string[]): string[] => process.getuid?.() === 0 ? ['runuser', '-u', 'postgres', '--', ...command] : command
  const run = (command: string[], input?: string) => {
    const [file, ...argv] = asPostgres(command)
    const result = spawnSync(file!, argv, { input, encoding: 'utf8', maxBuffer: 64 * 1024 * 1024 })
    if (result.status !== 0) throw new Error(`${command.join(' ')} failed (exit ${result.status}):\n${result.stderr}`)
    return result.stdout
  }
  const dir = mkdtempSync(join(tmpdir(), 'ocp-bench-instructions-'))
  const data = join(dir, 'data')
  if (process.getuid?.() === 0) execFileSync('chown', ['postgres', dir])
  const port = 20000 + Math.floor(Math.random() * 20000)
  try {
    run([join(bin, 'initdb'), '-D', data, '-A', 'trust', '-U', 'postgres', '--no-sync'])
    run([join(bin, 'pg_ctl'), '-D', data, '-o', `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1`, '-l', join(dir, 'log'), '-w', 'start'])
    const adminUrl = `postgres://postgres@127.0.0.1:${port}/postgres`
    let applied: string[] = []
    try {
      await withClient(adminUrl, async (admin) => { applied = (await createDatabases(admin, adminUrl)).applied })
    } finally {
      run([join(bin, 'pg_ctl'), '-D', data, '-m', 'fast', '-w', 'stop'])
    }
    const script = (n: number) => [
      `PREPARE update_task(int, int) AS ${UPDATE_TASK};`,
      `PREPARE insert_event(int, int) AS ${INSERT_EVENT};`,
      ...Array.from({ length: n }, (_, i) => `BEGIN;\nEXECUTE update_task(${1 + i % RUNS}, ${1 + (i * 7) % TASKS_PER_RUN});\nEXECUTE insert_event(${1 + i % RUNS}, ${1 + (i * 7) % TASKS_PER_RUN});\nCOMMIT;`)
    ].join('\n') + '\n'
    const count = (side: Side, n: number): number => {
      const out = join(dir, `callgrind.${side}.${n}`)
      run(['valgrind', '--tool=callgrind', `--callgrind-out-file=${out}`, join(bin, 'postgres'), '--single', '-D', data,
        '-c', 'fsync=off', '-c', 'synchronous_commit=off', side], script(n))
      const totals = /^(?:totals|summary): (\d+)/m.exec(run(['cat', out]))
      if (totals === null) throw new Error(`no totals in ${out}`)
      return Number(totals[1])
    }
    const perTransaction = {} as Record<Side, number>
    for (const side of [BARE, SERVICE] as const) {
      perTransaction[side] = (count(side, 1200) - count(side, 200)) / 1000
      figure('instructions_per_transaction', { database: sideName(side) }, perTransaction[side], 'instructions')
    }
    const ratio = perTransaction[SERVICE] / perTransaction[BARE]
    figure('instructions_ratio', {}, ratio, 'service/bare')
    console.log(`\n## Event writers, instructions: ${new Date().toISOString().slice(0, 16).replace('T', ' ')} UTC, commit ${gitDescription()}\n`)
    console.log(`service: migrations ${applied.join(', ')}; the orchestrator's transaction in single-user mode under callgrind (Postgres ${run([join(bin, 'postgres'), '--version']).trim()})\n`)
    console.log(table(['database', 'instructions per transaction'], [[sideName(BARE), formatInt(perTransaction[BARE])], [sideName(SERVICE), formatInt(perTransaction[SERVICE])]]))
    console.log(`\nservice / bare: ${fixed(ratio, 3)} (${fixed((ratio - 1) * 100, 1)}% more instructions per transaction)`)
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}

(args.instructions ? instructions() : main()).catch((err: unknown) => {
  console.error(err)
  process.exit(1)
})
