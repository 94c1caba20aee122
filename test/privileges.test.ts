import { readFileSync } from 'node:fs'
import pg from 'pg'
import t, { type Test } from 'tap'
import { needsServer, serverDatabaseUrl, testDatabaseUrl, withAdmin } from './helpers/database.ts'

/*
 * Least privilege in the database (docs/database.md, "Roles and
 * privileges"). Every function, table, sequence and view of the migrated
 * database, with its privileges as Postgres states them (aclexplode, the
 * defaults included: a new function is executable by PUBLIC), must hold
 * exactly the grants that the docs name: those to PUBLIC below, and those
 * of deploy/postgres/grants.sql to the reader and the writer. A grant
 * anywhere else fails. Then, with roles of this file's own: a login with no
 * grants can neither read the stream-token key, nor call the keeper's
 * functions, nor lock event_log_state, and the one advisory lock it could
 * take stalls nothing; the writer writes (its triggers fire without
 * EXECUTE on their functions) and can do no more; the reader reads the key.
 */

const skip = needsServer('roles are the server\'s, not the embedded database\'s')

/**
 * The only grants to PUBLIC (docs/database.md names each): functions that
 * every writer's default and WHEN clauses and every read call as the
 * calling role, which grant nothing (security invoker), and three
 * sequences that hold positions and nothing else.
 */
const PUBLIC_GRANTS = [
  'EXECUTE on function events_id_needs_check(bigint)',
  'EXECUTE on function events_ids_unsafe()',
  'EXECUTE on function events_next_id()',
  'EXECUTE on function events_settled(bigint,integer)',
  'EXECUTE on function events_settled_row(bigint)',
  'SELECT on sequence events_forks',
  'SELECT on sequence events_ids_safe',
  'SELECT on sequence events_settle_mark'
]

/** What deploy/postgres/grants.sql gives the writer. */
const WRITER_TABLES = ['artifacts', 'messages', 'runs', 'task_attempts', 'tasks', 'threads']
const WRITER_GRANTS = [
  ...WRITER_TABLES.flatMap((table) => ['DELETE', 'INSERT', 'SELECT', 'UPDATE'].map((privilege) => `${privilege} on table ${table}`)),
  'INSERT on table events', 'SELECT on table events',
  'USAGE on sequence events_event_id_seq'
]

const KEEPER_CALLS = [
  'select events_keep_order()',
  "select events_take_lease('stranger', 60000)",
  "select events_release_lease('stranger', 1)",
  'select events_census(0, 0)',
  'select events_make_ids_safe()',
  'select events_timeline()',
  'select events_settle_bound()',
  'select events_drawn()'
]

/** Every grant in the database's schema but its owner's own, as "<grantee>: <privilege> on <kind> <name>". */
async function grants (client: pg.ClientBase): Promise<string[]> {
  const { rows } = await client.query<{ grant: string }>(`
    with objects as (
      select 'function' as kind, p.oid::regprocedure::text as name, p.proowner as owner, coalesce(p.proacl, acldefault('f'::"char", p.proowner)) as acl
      from pg_proc p where p.pronamespace = 'public'::regnamespace
      union all
      select case c.relkind when 'S' then 'sequence' when 'v' then 'view' else 'table' end, c.relname, c.relowner,
        coalesce(c.relacl, acldefault((case c.relkind when 'S' then 's' else 'r' end)::"char", c.relowner))
      from pg_class c where c.relnamespace = 'public'::regnamespace and c.relkind in ('r', 'p', 'S', 'v', 'm', 'f')
    )
    select format('%s: %s on %s %s', case when a.grantee = 0 then 'PUBLIC' else a.grantee::regrole::text end, a.privilege_type, o.kind, o.name) as grant
    from objects o, aclexplode(o.acl) a
    where a.grantee <> o.owner
    order by 1`)
  return rows.map((row) => row.grant)
}

const suffix = `${process.pid}`
const roles = { reader: `ocp_test_reader_${suffix}`, writer: `ocp_test_writer_${suffix}`, stranger: `ocp_test_stranger_${suffix}` }

/** deploy/postgres/grants.sql, for this file's roles. */
const grantsSql = () => readFileSync(new URL('../deploy/postgres/grants.sql', import.meta.url), 'utf8')
  .replaceAll('ocp_reader', roles.reader).replaceAll('ocp_writer', roles.writer)

async function connect (t: Test, url: string, role?: string): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  t.teardown(() => client.end())
  if (role !== undefined) await client.query(`set role ${role}`)
  return client
}

/** The error code a statement fails with ('' when it succeeds). */
async function codeOf (client: pg.ClientBase, text: string): Promise<string> {
  try {
    await client.query(text)
    return ''
  } catch (error) {
    return (error as { code?: string }).code ?? String(error)
  }
}

t.test('every grant in the migrated database is one the docs name', { skip }, async (t) => {
  const admin = await connect(t, await testDatabaseUrl())
  t.same(await grants(admin), PUBLIC_GRANTS.map((grant) => `PUBLIC: ${grant}`), 'PUBLIC holds these, and no other role anything')
  const docs = readFileSync(new URL('../docs/database.md', import.meta.url), 'utf8')
  const section = docs.slice(docs.indexOf('## Roles and privileges'))
  for (const grant of PUBLIC_GRANTS) {
    const name = grant.replace(/^.* on \w+ /, '').replace(/\(.*$/, '')
    t.match(section, `\`${name}`, `docs/database.md names ${name} among PUBLIC's`)
  }

  const { rows: definers } = await admin.query<{ name: string, config: string[] | null }>(`
    select p.oid::regprocedure::text as name, p.proconfig as config from pg_proc p
    where p.pronamespace = 'public'::regnamespace and p.prosecdef`)
  t.ok(definers.length >= 10, 'the security definer functions are found')
  for (const { name, config } of definers) {
    t.match(config?.find((setting) => setting.startsWith('search_path=')) ?? '', /^search_path=public, pg_temp$/, `${name} searches pg_temp last`)
  }
})

t.test('the roles of deploy/postgres/grants.sql, and a login with no grants', { skip }, async (t) => {
  const url = await testDatabaseUrl()
  const server = await serverDatabaseUrl()
  const admin = await connect(t, url)
  for (const role of Object.values(roles)) await admin.query(`drop role if exists ${role}`).then(() => admin.query(`create role ${role} nologin`))
  t.teardown(async () => {
    await withAdmin(url, (client) => client.query(`drop owned by ${Object.values(roles).join(', ')}`))
    await withAdmin(server, async (client) => { for (const role of Object.values(roles)) await client.query(`drop role if exists ${role}`) })
  })
  await admin.query(grantsSql())

  const { rows: relations } = await admin.query<{ name: string, kind: string }>(`
    select c.relname as name, case c.relkind when 'v' then 'view' else 'table' end as kind
    from pg_class c where c.relnamespace = 'public'::regnamespace and c.relkind in ('r', 'p', 'v')`)
  const expected = [
    ...PUBLIC_GRANTS.map((grant) => `PUBLIC: ${grant}`),
    ...relations.map((relation) => `${roles.reader}: SELECT on ${relation.kind} ${relation.name}`),
    `${roles.reader}: EXECUTE on function stream_token_key()`,
    ...WRITER_GRANTS.map((grant) => `${roles.writer}: ${grant}`)
  ].sort()
  t.same(await grants(admin), expected, 'the reader and the writer hold what the docs say, nothing more')

  const stranger = await connect(t, url, roles.stranger)
  t.equal(await codeOf(stranger, 'select stream_token_key()'), '42501', 'a login with no grants cannot read the stream-token key')
  t.equal(await codeOf(stranger, 'select secret from stream_token_key'), '42501', 'nor its table')
  for (const call of KEEPER_CALLS) t.equal(await codeOf(stranger, call), '42501', `nor call ${call}`)
  t.equal(await codeOf(stranger, 'begin; lock table event_log_state in access share mode'), '42501', 'nor lock event_log_state')
  await stranger.query('rollback')
  t.equal(await codeOf(stranger, 'select from event_log_state for update'), '42501', 'nor its row')

  const writer = await connect(t, url, roles.writer)
  // Without the fix its insert would wait on the advisory lock for ever: fail instead.
  await writer.query("set lock_timeout = '10s'")
  t.equal(await codeOf(writer, 'select stream_token_key()'), '42501', 'the writer cannot read the key')
  for (const call of KEEPER_CALLS) t.equal(await codeOf(writer, call), '42501', `nor call ${call}`)
  t.equal(await codeOf(writer, 'select from event_log_state for update'), '42501', 'nor lock event_log_state\'s row')

  // The one lock a login without grants could take that the event log once waited on: held, it stalls nothing now.
  await stranger.query('select pg_advisory_lock(7061737470931417003)')
  // A server that may have lost commits (forks.sql): the next insert makes the ids safe, then the keeper's tick records the fork.
  await admin.query("select setval('events_ids_safe', 1, false)")
  const forksBefore = Number((await admin.query<{ n: string }>("select coalesce(pg_sequence_last_value('events_forks'), 0)::text as n")).rows[0]!.n)
  t.equal(await codeOf(writer, "insert into runs (run_id, goal, status) values ('run-writer', 'g', 'running')"), '', 'the writer writes its tables')
  const inserted = await writer.query<{ event_id: string }>("insert into events (event_type, run_id) values ('run_created', 'run-writer') returning event_id::text")
  t.ok(Number(inserted.rows[0]!.event_id) > 2 ** 32, 'and an event, its triggers firing though it may not execute their functions: the ids made safe first, past the advisory lock held')
  t.equal(Number((await admin.query<{ n: string }>("select coalesce(pg_sequence_last_value('events_forks'), 0)::text as n")).rows[0]!.n), forksBefore + 1, 'the fork counted once')
  await admin.query("select setval('events_event_id_seq', 5, true)")
  t.equal(await codeOf(writer, "insert into events (event_type, run_id) values ('run_created', 'run-writer')"), '40001', 'a sequence moved back: the insert is refused, to be retried, and the sequence moved forward again past the advisory lock held')
  const keeper = await connect(t, url)
  await keeper.query("set lock_timeout = '5s'")
  t.equal(await codeOf(keeper, 'select events_keep_order()'), '', 'the keeper ticks, the advisory lock still held')
  t.ok(Number((await admin.query<{ n: string }>('select last_value::text as n from events_event_id_seq')).rows[0]!.n) > 2 ** 32, 'past every id handed out')
  t.equal(await codeOf(writer, "insert into events (event_type, run_id) values ('run_created', 'run-writer')"), '', 'and writers write again')

  const reader = await connect(t, url, roles.reader)
  t.equal((await reader.query<{ key: string }>('select stream_token_key() as key')).rows[0]!.key.length >= 32, true, 'the reader reads the key')
  t.equal(await codeOf(reader, 'select events_keep_order()'), '42501', 'and cannot keep the log')
  t.equal(await codeOf(reader, 'select from event_log_state for update'), '42501', 'nor lock its row')
})
