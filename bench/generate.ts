/*
 * Fills a bench database with control-plane history of a chosen scale
 * (BENCHMARKS.md, "HTTP reads"). Deterministic: the same scale and seed give the
 * same rows, byte for byte.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm run bench:generate -- --scale small
 *   ... npm run bench:generate -- --scale large                 (50,000 runs, 1,000,000 tasks, 5,000,000 events)
 *   ... npm run bench:generate -- --scale small --database NAME --seed 7 --force
 *
 * The database (ocp_bench_<scale> unless --database) is created when
 * missing and migrated to the latest schema. When its marker (bench.marker)
 * says it already holds this scale, seed and generator version, nothing is
 * regenerated (--force regenerates). Otherwise the tables are emptied, the
 * secondary indexes dropped, every table filled by INSERT ... SELECT over
 * generate_series inside Postgres (no rows cross the wire), three tables at
 * once, the indexes rebuilt, and the tables vacuumed and analyzed, as a
 * long-lived database would be. Triggers and foreign-key checks are
 * bypassed while loading (session_replication_role = replica): event ids
 * are given explicitly, and the event id sequence is moved past them.
 *
 * The shape: runs of 10 to 500 tasks (most 10 to 30, one in a hundred 100
 * to 500); tasks in every status; 1 to 3 attempts for each task that
 * started, each attempt with its thread; threads of 5 to 200 messages (most
 * under 10); a quarter of the messages with one or two artifacts; every
 * blocked task's latest thread ending with a question (but one in 33,
 * left out of the blocked list, as docs/reference.md allows); raw JSON of varied
 * shapes; events spread over the tasks in history order. Two runs with
 * fixed ids and content, identical at every scale, are what the HTTP
 * benchmark reads: run-b010 (10 tasks, 2 blocked) and run-b200 (200 tasks,
 * 10 blocked), whose task-020 has a 200-message thread; they sit in the
 * middle of the history.
 */
import { resolve } from 'node:path'
import { pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'
import pg from 'pg'
import { migrateToLatest } from '../db/migrate.ts'
import { adminUrl, defaultDatabaseFor, formatInt, isScaleName, readMarker, SCALES, withDatabase, type Marker, type Targets } from './common.ts'

/** Bump when the generated data changes, so that existing bench databases are regenerated. */
export const GENERATOR_VERSION = 1

const TABLES = ['runs', 'tasks', 'task_attempts', 'threads', 'messages', 'artifacts', 'events']

const TARGETS: Targets = { run10: 'run-b010', run200: 'run-b200', thread200: 'th-b200-020-1' }

/** Tasks of the runs, one number per run: deterministic, summing to exactly `tasks`, targets included. */
export function planRuns (runs: number, tasks: number, seed: number): { keys: string[], counts: number[] } {
  // mulberry32: small, fast, and the same everywhere.
  let state = seed >>> 0
  const random = () => {
    state = (state + 0x6D2B79F5) >>> 0
    let x = state
    x = Math.imul(x ^ (x >>> 15), x | 1)
    x ^= x + Math.imul(x ^ (x >>> 7), x | 61)
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296
  }
  const keys: string[] = []
  const counts: number[] = []
  const middle = Math.floor(runs / 2)
  for (let r = 1; r <= runs; r++) {
    if (r === middle) { keys.push('b010'); counts.push(10); continue }
    if (r === middle + 1) { keys.push('b200'); counts.push(200); continue }
    keys.push(String(r).padStart(6, '0'))
    counts.push(random() < 0.01 ? 100 + Math.floor(random() * 401) : 10 + Math.floor(20 * random() ** 2))
  }
  // Bring the total to exactly `tasks` by moving ordinary runs (10 to 30 tasks) one task at a time.
  let difference = tasks - counts.reduce((sum, n) => sum + n, 0)
  const ordinary = counts.map((n, i) => (n <= 30 && !keys[i]!.startsWith('b') ? i : -1)).filter((i) => i >= 0)
  for (let pass = 0; difference !== 0; pass++) {
    if (pass > 1000) throw new Error(`cannot fit ${tasks} tasks into ${runs} runs of 10 to 500`)
    for (const i of ordinary) {
      if (difference === 0) break
      if (difference > 0 && counts[i]! < 30) { counts[i]!++; difference-- }
      if (difference < 0 && counts[i]! > 10) { counts[i]!--; difference++ }
    }
  }
  return { keys, counts }
}

const LOREM = 'The orchestrator dispatched the task to a worker agent, which claimed the thread, checked out a fresh worktree from the base commit, ran the test suite and reported the failures it found. ' +
  'Acceptance requires every test to pass, the linter to be clean, and the coverage report to stay above the threshold agreed in the plan; the reviewer asked for a smaller diff and a clearer commit message. ' +
  'A question was raised about the schema of the migration: whether the new index should be concurrent, and how the backfill interacts with the writers that keep running during the deploy window. ' +
  'The agent rebased the branch on the latest main, resolved two conflicts in the query builder, regenerated the fixtures and pushed the result commit for the council to tally and persist its report. '

/** Helper functions of the generator, in a schema of their own (the service never sees it). */
function helpersSql (seed: number): string {
  const lorem = LOREM.replaceAll("'", "''")
  return `
    create schema if not exists bench;
    -- A deterministic hash of a key, in [0, 2^63): every generated value derives from one.
    create or replace function bench.h(key text, salt int) returns bigint
      language sql immutable parallel safe
      as $$ select hashtextextended(key, ${seed}::bigint * 1000 + salt) & 9223372036854775807 $$;
    -- Uniform in [0, 1).
    create or replace function bench.u(key text, salt int) returns double precision
      language sql immutable parallel safe
      as $$ select (bench.h(key, salt) % 1000000000)::double precision / 1e9 $$;
    create or replace function bench.pick(choices text[], key text, salt int) returns text
      language sql immutable parallel safe
      as $$ select choices[1 + bench.h(key, salt) % array_length(choices, 1)] $$;
    -- Prose of between min and max characters.
    create or replace function bench.prose(key text, salt int, min int, max int) returns text
      language sql immutable parallel safe
      as $$ select substr('${lorem}${lorem}', 1 + (bench.h(key, salt) % 400)::int, min + (bench.h(key, salt + 1) % (max - min + 1))::int) $$;
    create or replace function bench.hex(key text, salt int, length int) returns text
      language sql immutable parallel safe
      as $$ select substr(md5(key || salt) || md5(salt || key), 1, length) $$;
  `
}

const BASE_TIME = '2025-01-01T00:00:00Z'
const HISTORY_DAYS = 365

/** The statements of the load, in order; those of one stage run concurrently. */
function loadStages (tasks: number, events: number): Array<Array<{ name: string, sql: string }>> {
  const agents = "array['planner','coder-1','coder-2','coder-3','reviewer','tester','council']"
  const taskStatus = `
    case when u < 0.50 then 'done' when u < 0.58 then 'running' when u < 0.70 then 'pending'
         when u < 0.80 then 'ready' when u < 0.86 then 'blocked' when u < 0.93 then 'failed' else 'cancelled' end`
  return [
    [{
      name: 'runs',
      sql: `
        insert into runs (run_id, goal, summary, status, created_at, updated_at)
        select run_id,
          'Goal: ' || bench.prose(run_id, 1, 40, 140),
          bench.prose(run_id, 3, 60, 240),
          case when key like 'b%' then 'running'
               else bench.pick(array['done','done','done','done','running','running','failed','cancelled','paused'], run_id, 5) end,
          created_at,
          created_at + interval '1 minute' * (bench.h(run_id, 6) % 2880)
        from bench.run_plan`
    }],
    [{
      name: 'task plan',
      sql: `
        create unlogged table bench.task_plan as
        select n, key, run_id, j, task_id, created_at, status, n_att,
          case when n_att = 0 or (key not like 'b%' and bench.h(task_key, 12) % 10 = 0) then null else n_att end as latest_no,
          -- A blocked task's latest thread ends with a question, but for one in 33 (left out of the blocked list).
          status = 'blocked' and (key like 'b%' or bench.h(task_key, 13) % 33 <> 0) as asks
        from (
          select n, key, run_id, j, task_id, task_key, created_at, status,
            case when status in ('pending', 'ready') then 0
                 else 1 + (bench.h(task_key, 11) % 10 >= 7)::int + (bench.h(task_key, 11) % 10 >= 9)::int end as n_att
          from (
            select row_number() over (order by p.r, j)::int as n, p.key, p.run_id, j,
              'task-' || lpad(j::text, 3, '0') as task_id,
              p.run_id || '/' || j as task_key,
              p.created_at + j * interval '7 seconds' as created_at,
              case when p.key = 'b200' and j % 20 = 0 then 'blocked'
                   when p.key = 'b010' and j % 5 = 0 then 'blocked'
                   when p.key like 'b%' then (select case s when 'blocked' then 'done' else s end from (select ${taskStatus} as s) x)
                   else ${taskStatus} end as status
            from bench.run_plan p, generate_series(1, p.n_tasks) j,
              lateral (select bench.u(p.run_id || '/' || j, 10) as u) r
          ) numbered
        ) attempts;
        create unique index on bench.task_plan (n);
        analyze bench.task_plan`
    }],
    [{
      name: 'tasks',
      sql: `
        insert into tasks (run_id, task_id, title, summary, status, default_to, priority, acceptance_json, latest_attempt_no, created_at, updated_at)
        select run_id, task_id,
          'Implement ' || bench.prose(run_id || task_id, 20, 20, 60),
          bench.prose(run_id || task_id, 22, 60, 240),
          status,
          case when bench.h(run_id || task_id, 24) % 2 = 0 then bench.pick(${agents}, run_id || task_id, 25) end,
          bench.pick(array['low','normal','normal','normal','high','urgent'], run_id || task_id, 26),
          case bench.h(run_id || task_id, 27) % 20
            when 0 then '"see the thread"'::jsonb
            when 1 then 'null'::jsonb
            when 2 then '12345678901234567890'::jsonb
            when 3 then '["tests pass", "docs updated"]'::jsonb
            else jsonb_build_object('criteria', jsonb_build_array('tests pass', 'lint clean', bench.prose(run_id || task_id, 28, 20, 50)),
                                    'min_coverage', 80 + bench.h(run_id || task_id, 29) % 20, 'reviewers', 1 + bench.h(run_id || task_id, 30) % 3)
          end,
          latest_no,
          created_at,
          created_at + interval '1 second' * (bench.h(run_id || task_id, 31) % 86400)
        from bench.task_plan`
    }],
    [{
      name: 'thread plan',
      sql: `
        create unlogged table bench.thread_plan as
        select t.run_id, t.task_id, t.key, t.j, a as attempt_no, t.status as task_status, a = t.n_att as latest,
          a = t.n_att and t.asks as asks,
          'th-' || t.key || '-' || lpad(t.j::text, 3, '0') || '-' || a as thread_id,
          t.created_at + a * interval '3 minutes' as created_at,
          case when t.key = 'b200' and t.j = 20 and a = 1 then 200
               else 5 + floor(195 * power(greatest(bench.u(t.run_id || t.task_id || a, 40), 0.01), 60))::int end as n_msgs
        from bench.task_plan t, generate_series(1, t.n_att) a;
        analyze bench.thread_plan`
    }],
    [{
      name: 'task_attempts',
      sql: `
        insert into task_attempts (run_id, task_id, attempt_no, assigned_to, thread_id, base_ref, base_commit, branch_name,
          worktree_path, workspace_status, result_commit, status, created_at, updated_at)
        select run_id, task_id, attempt_no,
          bench.pick(${agents}, thread_id, 50),
          thread_id,
          case when bench.h(thread_id, 51) % 10 <> 0 then 'main' end,
          case when bench.h(thread_id, 51) % 10 <> 0 then bench.hex(thread_id, 52, 40) end,
          case when bench.h(thread_id, 53) % 5 <> 0 then 'ocp/' || thread_id end,
          case when bench.h(thread_id, 53) % 5 <> 0 then '/work/trees/' || thread_id end,
          case bench.h(thread_id, 54) % 4 when 0 then null when 1 then 'dirty' when 2 then 'merged' else 'clean' end,
          case when latest and task_status = 'done' then bench.hex(thread_id, 55, 40) end,
          case when not latest then bench.pick(array['failed','superseded'], thread_id, 56)
               when task_status = 'done' then 'succeeded'
               else task_status end,
          created_at,
          created_at + interval '1 second' * (bench.h(thread_id, 57) % 7200)
        from bench.thread_plan`
    }, {
      name: 'threads',
      sql: `
        insert into threads (thread_id, run_id, task_id, subject, created_by, assigned_to, status, priority, latest_message_id, created_at, updated_at)
        select thread_id, run_id, task_id,
          bench.prose(thread_id, 60, 20, 80),
          'orchestrator',
          bench.pick(${agents}, thread_id, 50),
          case when not latest then 'closed' when task_status = 'blocked' then 'waiting' when task_status in ('done', 'failed', 'cancelled') then 'closed' else 'open' end,
          bench.pick(array['low','normal','normal','high'], thread_id, 61),
          case when key like 'b%' or bench.h(thread_id, 62) % 20 <> 0 then 'msg-' || substr(thread_id, 4) || '-' || lpad(n_msgs::text, 3, '0') end,
          created_at,
          created_at + n_msgs * interval '30 seconds'
        from bench.thread_plan`
    }],
    [{
      name: 'messages',
      sql: `
        insert into messages (message_id, thread_id, from_agent, to_agent, kind, summary, body, payload_json, created_at)
        select m.message_id, tp.thread_id,
          case when k % 2 = 1 then 'orchestrator' else bench.pick(${agents}, tp.thread_id, 50) end,
          case when k % 2 = 0 then 'orchestrator' else bench.pick(${agents}, tp.thread_id, 50) end,
          case when k = tp.n_msgs and tp.asks then 'question'
               when k = 1 then 'claim'
               else bench.pick(array['update','update','update','reply','note','result'], m.message_id, 70) end,
          bench.prose(m.message_id, 71, 20, 90),
          bench.prose(m.message_id, 73, 40, 600),
          case bench.h(m.message_id, 75) % 10
            when 0 then '[]'::jsonb
            when 1 then '"ok"'::jsonb
            else ('{"seq": ' || k || ', "tokens": ' || bench.h(m.message_id, 76) % 5000 || ', "model": "agent-' || bench.h(m.message_id, 77) % 4 || '"}')::jsonb
          end,
          tp.created_at + k * interval '30 seconds'
        from bench.thread_plan tp, generate_series(1, tp.n_msgs) k,
          lateral (select 'msg-' || substr(tp.thread_id, 4) || '-' || lpad(k::text, 3, '0') as message_id) m`
    }, {
      name: 'artifacts',
      sql: `
        insert into artifacts (artifact_id, message_id, path, kind, metadata_json, created_at)
        select 'art-' || substr(m.message_id, 5) || '-' || x, m.message_id,
          'artifacts/' || tp.thread_id || '/' || bench.pick(array['diff.patch','test-report.xml','coverage.json','build.log','notes.md'], m.message_id || x, 81),
          bench.pick(array['diff','report','coverage','log','file'], m.message_id || x, 82),
          case when x = 2 then '{}'::jsonb
               else ('{"bytes": ' || bench.h(m.message_id, 83) % 1000000 || ', "sha256": "' || bench.hex(m.message_id, 84, 64) || '"}')::jsonb end,
          tp.created_at + k * interval '30 seconds' + x * interval '1 second'
        from bench.thread_plan tp, generate_series(1, tp.n_msgs) k,
          lateral (select 'msg-' || substr(tp.thread_id, 4) || '-' || lpad(k::text, 3, '0') as message_id) m,
          generate_series(1, 1 + (bench.h(m.message_id, 80) % 3 = 0)::int) x
        where bench.h(m.message_id, 79) % 4 = 0`
    }, {
      name: 'events',
      sql: `
        insert into events (event_id, event_type, run_id, task_id, thread_id, summary, payload, created_at)
        select i, e.event_type, t.run_id,
          case when e.event_type like 'council%' then '' else t.task_id end,
          case when e.event_type like 'council%' or t.n_att = 0 then '' else 'th-' || t.key || '-' || lpad(t.j::text, 3, '0') || '-' || t.n_att end,
          e.event_type || ' ' || t.task_id,
          case when i % 7 = 0 then '{}'::jsonb else ('{"attempt": ' || greatest(t.n_att, 1) || ', "seq": ' || i || '}')::jsonb end,
          timestamptz '${BASE_TIME}' + (i::float8 / ${events} * ${HISTORY_DAYS}) * interval '1 day' + interval '1 hour'
        from generate_series(1, ${events}) i
          join bench.task_plan t on t.n = 1 + ((i - 1)::bigint * ${tasks} / ${events})::int,
          lateral (select (array['task_added','task_ready','task_dispatched','task_running','task_blocked','task_answered','task_done',
                                 'task_failed','thread_claim','thread_update','thread_reply','thread_result','council_tallied',
                                 'council_report_persisted'])[1 + bench.h(i::text, 90) % 14] as event_type) e;
        select setval('events_event_id_seq', ${events})`
    }]
  ]
}

async function connect (url: string): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: url, application_name: 'ocp-bench-generate' })
  await client.connect()
  // Bulk load: no triggers, no foreign-key checks (the generator keeps the references whole), no fsync per statement.
  await client.query("set session_replication_role = replica; set synchronous_commit = off; set maintenance_work_mem = '1GB'; set work_mem = '256MB'")
  return client
}

async function timed<T> (label: string, work: () => Promise<T>): Promise<T> {
  const started = Date.now()
  const result = await work()
  console.log(`  ${label.padEnd(28)} ${((Date.now() - started) / 1000).toFixed(1).padStart(6)} s`)
  return result
}

export async function generate (options: { scale: keyof typeof SCALES, database: string, seed: number, force: boolean }): Promise<Marker> {
  const admin = adminUrl()
  const scale = SCALES[options.scale]
  const url = withDatabase(admin, options.database)

  const server = new pg.Client({ connectionString: admin })
  await server.connect()
  const exists = await server.query('select 1 from pg_database where datname = $1', [options.database])
  if (exists.rowCount === 0) await server.query(`create database "${options.database.replaceAll('"', '""')}"`)
  await server.end()
  const { applied } = await migrateToLatest(url)
  if (applied.length > 0) console.log(`generate: ${options.database}: migrations applied: ${applied.join(', ')}`)

  const marker = await readMarker(url)
  if (!options.force && marker !== undefined && marker.scale === options.scale && marker.seed === options.seed && marker.version === GENERATOR_VERSION) {
    console.log(`generate: ${options.database} already holds scale ${options.scale} (seed ${options.seed}, generated ${marker.generated_at} in ${marker.seconds.toFixed(0)} s): kept (--force regenerates)`)
    return marker
  }

  console.log(`generate: ${options.database}: scale ${options.scale} (${formatInt(scale.runs)} runs, ${formatInt(scale.tasks)} tasks, ${formatInt(scale.events)} events), seed ${options.seed}`)
  const started = Date.now()
  const clients = await Promise.all([connect(url), connect(url), connect(url)])
  const [main] = clients as [pg.Client, pg.Client, pg.Client]

  await timed('empty tables, drop indexes', async () => {
    await main.query('create schema if not exists bench')
    await main.query('drop table if exists bench.marker, bench.run_plan, bench.task_plan, bench.thread_plan')
    await main.query(`truncate ${TABLES.join(', ')}`)
    await main.query(helpersSql(options.seed))
    const { keys, counts } = planRuns(scale.runs, scale.tasks, options.seed)
    await main.query(`
      create unlogged table bench.run_plan as
      select r::int, key, 'run-' || key as run_id, n_tasks,
        timestamptz '${BASE_TIME}' + (r::float8 / $3 * ${HISTORY_DAYS}) * interval '1 day' as created_at
      from unnest($1::text[], $2::int[]) with ordinality as p(key, n_tasks, r)`, [keys, counts, scale.runs])
    // The secondary indexes are built once the rows are in. Their definitions are kept in a
    // table until they are rebuilt, so that an interrupted run's next run still rebuilds them.
    await main.query('create table if not exists bench.dropped_indexes (name text primary key, definition text not null)')
    await main.query(`
      insert into bench.dropped_indexes
      select i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid)
      from pg_index i join pg_class c on c.oid = i.indrelid
      where c.relnamespace = 'public'::regnamespace and c.relname = any($1)
        and not exists (select 1 from pg_constraint k where k.conindid = i.indexrelid)
      on conflict do nothing`, [TABLES])
    const dropped = await main.query('select name from bench.dropped_indexes')
    for (const { name } of dropped.rows) await main.query(`drop index if exists ${name}`)
  })

  for (const stage of loadStages(scale.tasks, scale.events)) {
    await Promise.all(stage.map((step, i) => timed(step.name, () => clients[i]!.query(step.sql))))
  }

  await timed('rebuild indexes', async () => {
    const { rows } = await main.query<{ name: string, definition: string }>('select name, definition from bench.dropped_indexes order by name')
    const queue = [...rows]
    await Promise.all(clients.slice(0, 2).map(async (client) => {
      for (let index = queue.shift(); index !== undefined; index = queue.shift()) {
        await client.query(index.definition)
        await client.query('delete from bench.dropped_indexes where name = $1', [index.name])
      }
    }))
  })
  await timed('vacuum, analyze', async () => {
    await main.query('drop table bench.task_plan, bench.thread_plan, bench.run_plan, bench.dropped_indexes')
    const queue = [...TABLES].reverse()
    await Promise.all(clients.slice(0, 2).map(async (client) => {
      for (let table = queue.shift(); table !== undefined; table = queue.shift()) await client.query(`vacuum (analyze) ${table}`)
    }))
  })

  const counts: Record<string, number> = {}
  for (const table of TABLES) counts[table] = Number((await main.query(`select count(*) from ${table}`)).rows[0].count)
  const seconds = (Date.now() - started) / 1000
  await main.query('create table bench.marker (scale text, seed int, version int, counts jsonb, targets jsonb, seconds numeric, generated_at timestamptz)')
  await main.query('insert into bench.marker values ($1, $2, $3, $4, $5, $6, now())',
    [options.scale, options.seed, GENERATOR_VERSION, JSON.stringify(counts), JSON.stringify(TARGETS), seconds])
  const size = await main.query('select pg_size_pretty(pg_database_size(current_database())) as size')
  await Promise.all(clients.map((client) => client.end()))

  console.log(`generate: ${options.database} filled in ${seconds.toFixed(0)} s, ${size.rows[0].size}: ` +
    Object.entries(counts).map(([table, n]) => `${formatInt(n)} ${table}`).join(', '))
  return (await readMarker(url))!
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  const { values } = parseArgs({
    options: {
      scale: { type: 'string', default: 'small' },
      database: { type: 'string' },
      seed: { type: 'string', default: '1' },
      force: { type: 'boolean', default: false }
    }
  })
  const scales = values.scale === 'both' ? ['small', 'large'] : [values.scale]
  if (!scales.every(isScaleName) || (values.database !== undefined && scales.length > 1)) {
    console.error('usage: npm run bench:generate -- --scale small|large|both [--database NAME] [--seed N] [--force]')
    process.exit(2)
  }
  ;(async () => {
    for (const scale of scales as Array<keyof typeof SCALES>) {
      await generate({ scale, database: values.database ?? defaultDatabaseFor(scale), seed: Number(values.seed), force: values.force })
    }
  })().catch((err: unknown) => {
    console.error(err)
    process.exit(1)
  })
}
