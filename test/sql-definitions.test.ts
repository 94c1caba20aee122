import { readdirSync, readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import pg from 'pg'
import t from 'tap'
import { testDatabaseUrl } from './helpers/database.ts'

/*
 * db/sql/ holds the current definition of every function, trigger, view
 * and sequence of the event order, for people to read: the migrations made
 * them, and stay as they were. This file checks that the two agree, on this
 * file's migrated database.
 *
 * How: in one transaction, rolled back, it reads the database's definitions
 * (pg_get_functiondef, pg_get_triggerdef, pg_get_viewdef, pg_sequence, the
 * events column defaults, and their grants), drops those objects, runs
 * db/sql/*.sql, and reads the definitions again. Postgres itself states
 * both readings, so any difference in a function's arguments, defaults,
 * return type, language, volatility, security definer, search_path or body
 * shows, and so does an object the files lack (gone after) or add (new
 * after). Only indentation and blank lines of a function's text are free:
 * each line is compared trimmed.
 */

const sqlDir = join(dirname(fileURLToPath(import.meta.url)), '../db/sql')

/** db/sql/*.sql, by name. */
function sqlFiles (): Map<string, string> {
  return new Map(readdirSync(sqlDir).filter((name) => name.endsWith('.sql')).sort().map((name) => [name, readFileSync(join(sqlDir, name), 'utf8')]))
}

/** The functions of the event order: named events_* or stream_token*. */
const OURS = String.raw`p.pronamespace = 'public'::regnamespace and (p.proname like 'events\_%' or p.proname like 'stream\_token%')`
/** Its relations of one kind (pg_class.relkind: 'S' sequence, 'v' view), as `c`: named events_*. */
const ourRelations = (kind: 'S' | 'v') => String.raw`c.relkind = '${kind}' and c.relnamespace = 'public'::regnamespace and c.relname like 'events\_%'`

type Kind = 'function' | 'trigger' | 'sequence' | 'default' | 'view'
type Definitions = Record<Kind, Map<string, string>>

/** A function's text with each line trimmed and blank lines left out. */
const normalize = (text: string) => text.split('\n').map((line) => line.trim()).filter((line) => line !== '').join('\n')

async function readDefinitions (client: pg.ClientBase): Promise<Definitions> {
  const functions = await client.query<{ name: string, definition: string, acl: string }>(`
    select p.oid::regprocedure::text as name, pg_get_functiondef(p.oid) as definition, coalesce(p.proacl::text, 'default') as acl
    from pg_proc p where ${OURS}`)
  // On the events table and its partitions (clones of the parent's row triggers included), and any calling ours.
  const triggers = await client.query<{ name: string, definition: string, enabled: string }>(`
    select g.tgrelid::regclass::text || ' ' || g.tgname as name, pg_get_triggerdef(g.oid) as definition, g.tgenabled::text as enabled
    from pg_trigger g
    where not g.tgisinternal
      and (g.tgrelid in (select relid from pg_partition_tree('events'))
        or g.tgfoid in (select p.oid from pg_proc p where ${OURS}))`)
  const sequences = await client.query<{ name: string, definition: string }>(`
    select c.relname as name,
      format('%s as %s start %s increment %s minvalue %s maxvalue %s cache %s cycle %s owned by %s acl %s',
        case c.relpersistence when 'u' then 'unlogged' else 'logged' end, s.seqtypid::regtype, s.seqstart, s.seqincrement, s.seqmin, s.seqmax, s.seqcache, s.seqcycle,
        coalesce((select d.refobjid::regclass::text || '.' || a.attname from pg_depend d
          join pg_attribute a on a.attrelid = d.refobjid and a.attnum = d.refobjsubid
          where d.classid = 'pg_class'::regclass and d.objid = c.oid and d.refclassid = 'pg_class'::regclass and d.deptype = 'a'), 'none'),
        coalesce(c.relacl::text, 'default')) as definition
    from pg_sequence s join pg_class c on c.oid = s.seqrelid
    where ${ourRelations('S')}`)
  const views = await client.query<{ name: string, definition: string }>(`
    select c.relname as name, pg_get_viewdef(c.oid) || ' acl ' || coalesce(c.relacl::text, 'default') as definition
    from pg_class c where ${ourRelations('v')}`)
  // The parent's: an insert through it takes them (partitions copy them when made).
  const defaults = await client.query<{ name: string, definition: string }>(`
    select 'events.' || a.attname as name, pg_get_expr(d.adbin, d.adrelid) as definition
    from pg_attrdef d join pg_attribute a on a.attrelid = d.adrelid and a.attnum = d.adnum
    where d.adrelid = 'events'::regclass`)
  return {
    function: new Map(functions.rows.map((row) => [row.name, `${normalize(row.definition)}\n-- grants: ${row.acl}`])),
    trigger: new Map(triggers.rows.map((row) => [row.name, `${row.definition} -- enabled: ${row.enabled}`])),
    sequence: new Map(sequences.rows.map((row) => [row.name, row.definition])),
    default: new Map(defaults.rows.map((row) => [row.name, row.definition])),
    view: new Map(views.rows.map((row) => [row.name, row.definition]))
  }
}

/** Drops the objects of the event order, so that only the files can put them back. */
async function dropDefinitions (client: pg.ClientBase): Promise<void> {
  const { rows: triggers } = await client.query<{ name: string, on: string }>(`
    select quote_ident(g.tgname) as name, g.tgrelid::regclass::text as on from pg_trigger g
    where not g.tgisinternal and g.tgparentid = 0
      and (g.tgrelid in (select relid from pg_partition_tree('events')) or g.tgfoid in (select p.oid from pg_proc p where ${OURS}))`)
  for (const trigger of triggers) await client.query(`drop trigger ${trigger.name} on ${trigger.on}`)
  const { rows: defaults } = await client.query<{ on: string, column: string }>(`
    select distinct a.attrelid::regclass::text as on, quote_ident(a.attname) as column
    from pg_depend d join pg_attrdef ad on d.classid = 'pg_attrdef'::regclass and d.objid = ad.oid
    join pg_attribute a on a.attrelid = ad.adrelid and a.attnum = ad.adnum
    where d.refclassid = 'pg_proc'::regclass and d.refobjid in (select p.oid from pg_proc p where ${OURS})`)
  for (const column of defaults) await client.query(`alter table ${column.on} alter column ${column.column} drop default`)
  // Without cascade: anything else built on them (a view of another name, say) fails here, to be added to the files and this test.
  const { rows: functions } = await client.query<{ name: string }>(`select p.oid::regprocedure::text as name from pg_proc p where ${OURS}`)
  for (const fn of functions) await client.query(`drop function ${fn.name}`)
  const { rows: views } = await client.query<{ name: string }>(`select c.oid::regclass::text as name from pg_class c where ${ourRelations('v')}`)
  for (const view of views) await client.query(`drop view ${view.name}`)
  const { rows: sequences } = await client.query<{ name: string }>(`select c.oid::regclass::text as name from pg_class c where ${ourRelations('S')}`)
  for (const sequence of sequences) await client.query(`drop sequence ${sequence.name}`)
}

interface Comparison { database: Definitions, files: Definitions }

/** The database's definitions, and those that running `files` in their place gives (rolled back). */
async function compare (client: pg.ClientBase, files: Map<string, string>): Promise<Comparison> {
  await client.query('begin')
  try {
    const database = await readDefinitions(client)
    await dropDefinitions(client)
    for (const [name, text] of files) {
      try {
        await client.query(text)
      } catch (error) {
        throw new Error(`db/sql/${name}: ${(error as Error).message}`, { cause: error })
      }
    }
    return { database, files: await readDefinitions(client) }
  } finally {
    await client.query('rollback')
  }
}

/** Each difference, as "<kind> <name>: <what>". */
function differences ({ database, files }: Comparison): string[] {
  const found: string[] = []
  for (const kind of Object.keys(database) as Kind[]) {
    for (const [name, definition] of database[kind]) {
      const inFiles = files[kind].get(name)
      if (inFiles === undefined) found.push(`${kind} ${name}: not in db/sql/`)
      else if (inFiles !== definition) found.push(`${kind} ${name}: differs`)
    }
    for (const name of files[kind].keys()) {
      if (!database[kind].has(name)) found.push(`${kind} ${name}: in db/sql/, not in the database`)
    }
  }
  return found
}

async function connect (): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: await testDatabaseUrl() })
  await client.connect()
  t.teardown(() => client.end())
  return client
}

t.test('db/sql/ states what the migrated database has, object for object', async (t) => {
  const client = await connect()
  const result = await compare(client, sqlFiles())
  // The readings are not empty by mistake: the objects every reader and writer relies on are in them.
  t.ok(result.database.function.has('events_keep_order(integer,text,bigint,integer)') && result.database.function.has('events_settled(bigint,integer)') &&
    result.database.function.has('stream_token_key()'), 'the database has the functions of the event order')
  t.ok(result.database.trigger.has('events events_explicit_id') && result.database.trigger.has('events_default events_explicit_id'), 'and its triggers, clones included')
  t.equal(result.database.default.get('events.event_id'), 'events_next_id()', 'and the id default')
  t.ok(result.database.sequence.has('events_settle_mark'), 'and the settle mark')
  t.ok(result.database.view.has('events_id_drawn'), 'and the view of the ids drawn')

  t.same(differences(result), [], 'no object differs, is missing or is extra')
  // Each one's own diff, when one differs.
  for (const kind of Object.keys(result.database) as Kind[]) {
    for (const [name, definition] of result.database[kind]) {
      if (result.files[kind].has(name)) t.equal(result.files[kind].get(name), definition, `${kind} ${name}`)
    }
  }
})

t.test('the comparison fails on any real difference', async (t) => {
  const client = await connect()
  const files = sqlFiles()
  const changed = (file: string, from: string | RegExp, to: string): Map<string, string> => {
    const text = files.get(file)!
    const next = text.replace(from, to)
    t.not(next, text, `the change applies to ${file}: ${String(from)}`)
    return new Map([...files, [file, next]])
  }
  const cases: Array<[string, Map<string, string>, string]> = [
    ['a body', changed('readers.sql', 'e.event_id = p + 1)', 'e.event_id = p + 2)'), 'function events_settled(bigint,integer): differs'],
    ['a volatility', changed('readers.sql', 'language plpgsql stable', 'language plpgsql volatile'), 'function events_settled(bigint,integer): differs'],
    ['security definer', changed('older-replicas.sql', 'returns bigint\nlanguage plpgsql volatile security definer', 'returns bigint\nlanguage plpgsql volatile'), 'function events_drawn(): differs'],
    ['a search_path', changed('keeper.sql', 'security definer set search_path = public, pg_temp', 'security definer set search_path = public'), 'function events_census(bigint,bigint,text[],bigint[],bigint[],bigint): differs'],
    ['a default argument', changed('keeper.sql', 'pause_ms integer default 0', 'pause_ms integer default 1'), 'function events_keep_order(integer,text,bigint,integer): differs'],
    ['a trigger', changed('event-ids.sql', 'before update of event_id on events', 'before update on events'), 'trigger events events_id_unchanged: differs'],
    ['a sequence', changed('event-ids.sql', 'minvalue 0 start 1 cache 1', 'minvalue 0 start 1 cache 10'), 'sequence events_event_id_seq: differs'],
    ['a sequence that must not survive a crash', changed('forks.sql', 'create unlogged sequence events_ids_safe', 'create sequence events_ids_safe'), 'sequence events_ids_safe: differs'],
    ['a view', changed('readers.sql', 'else s.last_value - 1 end as drawn', 'else s.last_value end as drawn'), 'view events_id_drawn: differs'],
    ['an inlined function', changed('readers.sql', 'returns table (settled bigint)\nlanguage sql stable', 'returns table (settled bigint)\nlanguage sql stable strict'), 'function events_settled_row(bigint): differs'],
    ['a grant', changed('event-ids.sql', 'grant select on sequence events_settle_mark to public;', ''), 'sequence events_settle_mark: differs'],
    ['a function\'s grant', changed('stream-token.sql', 'revoke execute on function stream_token_key() from public;', ''), 'function stream_token_key(): differs'],
    ['a function left out', changed('keeper.sql', /create or replace function events_timeline\(\)[^]*?\$\$;\nrevoke [^\n]*\n/, ''), 'function events_timeline(): not in db/sql/'],
    ['a function the database lacks', new Map([...files, ['zz-extra.sql', 'create function events_extra() returns int language sql as $$ select 1 $$;']]), 'function events_extra(): in db/sql/, not in the database']
  ]
  for (const [what, mutated, expected] of cases) {
    const found = differences(await compare(client, mutated))
    t.ok(found.includes(expected), `${what}: ${expected}`, { found })
  }
})

t.test('each file explains itself first, by what it guarantees, not by the history of its migrations', async (t) => {
  for (const [name, text] of sqlFiles()) {
    t.match(text, /^--/, `${name} starts with its explanation`)
    t.notMatch(text, /migration \d|\b00\d\d_/i, `${name} does not explain by migration`)
  }
})
