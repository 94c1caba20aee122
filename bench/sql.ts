/*
 * The database floor's statements (bench/sql/*.sql) are the service's own:
 * each read of db/queries.ts is called once with a pool that records the
 * statement it is given instead of sending it, and the statement and its
 * parameters are written out as a pgbench script, the parameters becoming
 * pgbench variables (:run_id...). bench/http.ts does this at every run
 * before it starts pgbench, so the files cannot drift from the service:
 * when one changes, it says so (commit the new file).
 *
 *   DATABASE_URL=... node --import tsx bench/sql.ts [--scale small]    (writes them alone)
 */
import { readFileSync, writeFileSync } from 'node:fs'
import { join, resolve } from 'node:path'
import { pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'
import type pg from 'pg'
import { ConfigSchema } from '../config.ts'
import { getRunDetail, getThreadDetail, listBlockedTasks, listRuns } from '../db/queries.ts'
import { settledPosition } from '../db/settled-position.ts'
import { builder } from '../db/statement.ts'
import { adminUrl, defaultDatabaseFor, isScaleName, readMarker, root, withDatabase, type Targets } from './common.ts'

export const SQL_DIR = join(root, 'bench', 'sql')

/** The run list's default page (RUN_LIST_DEFAULT_LIMIT's default), as the service reads it without ?limit. */
export const RUN_LIST_DEFAULT_LIMIT = (ConfigSchema.properties.RUN_LIST_DEFAULT_LIMIT as unknown as { default: number }).default

export interface FloorStatement {
  /** bench/sql/<file> */
  file: string
  operation: string
  run: (pool: pg.Pool, targets: Targets) => Promise<unknown>
  /** The pgbench variable for each parameter value the statement is sent with. */
  variables: (targets: Targets) => Record<string, string>
  /**
   * bench/sql/<bodyAlone>: the same statement without the event cursor
   * (its column null): Postgres building the body alone, the fastest
   * statement known for it (BENCHMARKS.md, "A small run detail").
   */
  bodyAlone?: string
}

/**
 * The settled position every read is given (the hub's head in the service).
 * 0 makes the statement settle its own from the log's start: a little more
 * work than the service's (which starts at its head), never less.
 */
const KNOWN_POSITION = 0
const known = { known_position: String(KNOWN_POSITION) }

export const STATEMENTS: Record<string, FloorStatement> = {
  listRuns: {
    file: 'list-runs.sql',
    operation: `listRuns (default page of ${RUN_LIST_DEFAULT_LIMIT})`,
    run: (pool) => listRuns(pool, { limit: RUN_LIST_DEFAULT_LIMIT }, KNOWN_POSITION),
    variables: () => ({ ...known, page_limit: String(RUN_LIST_DEFAULT_LIMIT), page_limit_plus_1: String(RUN_LIST_DEFAULT_LIMIT + 1) })
  },
  getRunDetail: {
    file: 'run-detail.sql',
    operation: 'getRunDetail',
    run: (pool, targets) => getRunDetail(pool, targets.run200, KNOWN_POSITION),
    variables: (targets) => ({ ...known, run_id: targets.run200 }),
    bodyAlone: 'run-detail-body.sql'
  },
  listBlockedTasks: {
    file: 'blocked.sql',
    operation: 'listBlockedTasks',
    run: (pool, targets) => listBlockedTasks(pool, targets.run200, KNOWN_POSITION),
    variables: (targets) => ({ ...known, run_id: targets.run200 })
  },
  getThreadDetail: {
    file: 'thread-detail.sql',
    operation: 'getThreadDetail',
    run: (pool, targets) => getThreadDetail(pool, targets.thread200, KNOWN_POSITION),
    variables: (targets) => ({ ...known, thread_id: targets.thread200 })
  }
}

/**
 * pgbench reads `:name` anywhere in a statement as a variable, string
 * constants included (the timestamp format 'HH24:MI:SS'). A constant that
 * holds a colon is therefore written as the same constant in escape syntax,
 * E'...\x3a...', which Postgres reads back to the very same text.
 */
export function hideColonsFromPgbench (statement: string): string {
  return statement.replace(/(^|[^A-Za-z0-9_])'((?:[^']|'')*)'/g, (match, before: string, body: string) =>
    body.includes(':') ? `${before}E'${body.replaceAll('\\', '\\\\').replaceAll(':', '\\x3a')}'` : match)
}

/** The settled position a read reports (X-Event-Cursor), as every statement of db/queries.ts selects it (db/settled-position.ts), its parameter any. */
const EVENT_CURSOR = `${settledPosition(0).compile(builder).sql} as "event_cursor"`
const EVENT_CURSOR_COLUMN = new RegExp(EVENT_CURSOR.replace(/[.*+?^${}()|[\]\\]/g, '\\$&').replace('\\$1', '\\$\\d+'))

/** The statement without its event cursor: the column stays, null, so the row has the same shape. */
export function withoutEventCursor (text: string, operation: string): string {
  if (!EVENT_CURSOR_COLUMN.test(text)) throw new Error(`bench/sql: ${operation} selects no event cursor (${EVENT_CURSOR})`)
  return text.replace(EVENT_CURSOR_COLUMN, 'null::text as "event_cursor"')
}

/** The statement as a pgbench script: parameters $n become the variables their values were given under. */
export function toPgbenchScript (query: { text: string, values: unknown[] }, variables: Record<string, string>, operation: string, what = 'the one statement the service sends for it'): string {
  const byValue = new Map(Object.entries(variables).map(([name, value]) => [value, name]))
  const text = query.text.replace(/\$(\d+)/g, (_match, n: string) => {
    const value = String(query.values[Number(n) - 1])
    const name = byValue.get(value)
    if (name === undefined) throw new Error(`bench/sql: parameter $${n} of ${operation} (${value}) has no pgbench variable`)
    return `:${name}`
  })
  const defines = Object.entries(variables).map(([name, value]) => `-D ${name}=${value}`).join(' ')
  return [
    `-- ${operation}: ${what} (db/queries.ts, built with Kysely, run as a prepared statement),`,
    '-- written by bench/sql.ts from the service\'s own query builder at every run of bench/http.ts: do not edit.',
    `-- pgbench -n -M prepared ${defines} -f bench/sql/<this file>`,
    '-- String constants holding a colon are written E\'...\\x3a...\' (the same text), or pgbench would read :MI as a variable.',
    `${hideColonsFromPgbench(text)};`,
    ''
  ].join('\n')
}

/** A pool that records the statement a read sends instead of sending it, and answers with a row of nothing. */
function recordingPool (): { pool: pg.Pool, sent: () => pg.QueryConfig | undefined } {
  let sent: pg.QueryConfig | undefined
  const client = {
    query: async (config: pg.QueryConfig) => {
      sent = config
      return { rows: [{ body: '{}', left_out: null, next_created_at: null, next_id: null, event_cursor: '0' }] }
    },
    release: () => {}
  }
  return { pool: { connect: async () => client } as unknown as pg.Pool, sent: () => sent }
}

/** Records each read's statement and (re)writes bench/sql. Returns the files that changed. */
export async function writeFloorStatements (targets: Targets): Promise<string[]> {
  const changed: string[] = []
  for (const statement of Object.values(STATEMENTS)) {
    const recorder = recordingPool()
    await statement.run(recorder.pool, targets)
    const sent = recorder.sent()
    if (sent === undefined) throw new Error(`bench/sql: ${statement.operation} sent no statement`)
    const query = { text: sent.text, values: sent.values ?? [] }
    const scripts = [{ file: statement.file, script: toPgbenchScript(query, statement.variables(targets), statement.operation) }]
    if (statement.bodyAlone !== undefined) {
      scripts.push({
        file: statement.bodyAlone,
        script: toPgbenchScript({ ...query, text: withoutEventCursor(query.text, statement.operation) }, statement.variables(targets), statement.operation,
          'the statement the service sends for it without the event cursor, the body alone')
      })
    }
    for (const { file, script } of scripts) {
      const path = join(SQL_DIR, file)
      let previous: string | undefined
      try { previous = readFileSync(path, 'utf8') } catch {}
      if (previous !== script) {
        writeFileSync(path, script)
        changed.push(file)
      }
    }
  }
  return changed
}

/**
 * A bench/sql script as a statement for pg: comments dropped, its pgbench
 * variables back to parameters $n, with their values.
 */
export function readFloorStatement (file: string, variables: Record<string, string>): { text: string, values: string[] } {
  const script = readFileSync(join(SQL_DIR, file), 'utf8').split('\n').filter((line) => !line.startsWith('--')).join('\n').trim().replace(/;$/, '')
  const names: string[] = []
  const text = script.replace(/:([A-Za-z_][A-Za-z0-9_]*)/g, (match, name: string, offset: number) => {
    if (script[offset - 1] === ':' || !(name in variables)) return match
    let n = names.indexOf(name)
    if (n < 0) n = names.push(name) - 1
    return `$${n + 1}`
  })
  return { text, values: names.map((name) => variables[name]!) }
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  const { values } = parseArgs({ options: { scale: { type: 'string', default: 'small' }, database: { type: 'string' } } })
  if (!isScaleName(values.scale)) {
    console.error('usage: node --import tsx bench/sql.ts [--scale small|large] [--database NAME]')
    process.exit(2)
  }
  const url = withDatabase(adminUrl(), values.database ?? defaultDatabaseFor(values.scale))
  ;(async () => {
    const marker = await readMarker(url)
    if (marker === undefined) throw new Error(`no bench data in ${url}: run npm run bench:generate first`)
    const changed = await writeFloorStatements(marker.targets)
    console.log(changed.length === 0 ? 'bench/sql: up to date' : `bench/sql: rewritten from the service's SQL: ${changed.join(', ')}`)
  })().catch((err: unknown) => {
    console.error(err)
    process.exit(1)
  })
}
