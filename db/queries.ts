import { sql, type Expression, type ExpressionBuilder, type Kysely } from 'kysely'
import * as Resource from '../schemas/resources.js'
import { streamEnd } from './events.js'
import { jsonArray, rowObject, utcTimestamp } from './json.js'
import type { Database } from './schema.js'

/*
 * The read queries of SPEC section 4. Each is ONE statement that returns
 * the finished JSON body as text: a statement reads one snapshot, so every
 * count agrees with every list in the same body, however writers interleave;
 * and a run detail or thread detail is one round trip, never N+1.
 * A query that finds nothing to answer for (unknown id) returns undefined.
 */

export type Db = Kysely<Database>

/** The sort key of the last item of a page: where the next page starts (keyset paging). */
export interface PageKey {
  createdAt: string
  id: string
}

export interface Page {
  /** Most items to return; undefined for all of them. */
  limit?: number
  /** Return only the items after this key. */
  after?: PageKey
}

/** Every read's body comes with the stream position it was read at (X-Event-Cursor). */
export interface ReadBody {
  body: string
  /** The highest event id visible to the snapshot that produced the body. */
  eventCursor: string
}

export interface PagedBody extends ReadBody {
  /** Present when more items remain after this page. */
  next?: PageKey
}

export interface BlockedBody extends ReadBody {
  /** Blocked tasks left out because they have no attempt or no question. */
  leftOut: string[]
}

/** The stream position of the statement's snapshot: subscribing after it misses nothing since. */
const eventCursor = streamEnd.as('event_cursor')

/** LIMIT for "no limit": larger than any table, and still a valid bigint. */
const UNBOUNDED = Number.MAX_SAFE_INTEGER

// ---- building blocks ------------------------------------------------------

/** {task_counts, total_tasks} of one run: an index-only count per status. */
function taskCounts (eb: ExpressionBuilder<any, any>, runId: Expression<string>) {
  return eb
    .selectFrom(
      eb.selectFrom('tasks as tc')
        .select(['tc.status', (inner) => inner.fn.countAll<string>().as('n')])
        .where('tc.run_id', '=', runId)
        .groupBy('tc.status')
        .as('c')
    )
    .select([
      sql<unknown>`coalesce(json_object_agg(c.status, c.n), '{}'::json)`.as('task_counts'),
      sql<string>`coalesce(sum(c.n), 0)::bigint`.as('total_tasks')
    ])
}

/** Artifacts of one message as a JSON array, in created_at, artifact_id order. */
function artifactsOf (eb: ExpressionBuilder<any, any>, messageId: Expression<string>) {
  return eb.selectFrom('artifacts as ar')
    .select(jsonArray(rowObject(Resource.Artifact, 'ar'), sql`ar.created_at, ar.artifact_id`).as('artifacts'))
    .where('ar.message_id', '=', messageId)
}

/**
 * One row per blocked task of a run (CONTRACT section 2): its attempt is the
 * one numbered latest_attempt_no (the highest when that is NULL), its
 * question the newest `question` message of the attempt's thread. `item`
 * is NULL when either is missing.
 */
function blockedTaskRows (eb: ExpressionBuilder<any, any>, runId: Expression<string>) {
  return eb.selectFrom('tasks as t')
    .leftJoinLateral(
      (lateral) => lateral.selectFrom('task_attempts as a')
        .selectAll('a')
        .whereRef('a.run_id', '=', 't.run_id')
        .whereRef('a.task_id', '=', 't.task_id')
        .where((w) => w.or([
          w('t.latest_attempt_no', 'is', null),
          w('a.attempt_no', '=', w.ref('t.latest_attempt_no'))
        ]))
        .orderBy('a.attempt_no', 'desc')
        .limit(1)
        .as('a'),
      (join) => join.onTrue()
    )
    .leftJoinLateral(
      (lateral) => lateral.selectFrom('messages as q')
        .selectAll('q')
        .whereRef('q.thread_id', '=', 'a.thread_id')
        .where('q.kind', '=', sql.lit('question'))
        .orderBy('q.created_at', 'desc')
        .orderBy('q.message_id', 'desc')
        .limit(1)
        .as('q'),
      (join) => join.onTrue()
    )
    .where('t.run_id', '=', runId)
    .where('t.status', '=', sql.lit('blocked'))
    .select((row) => [
      't.task_id',
      't.created_at',
      sql<unknown>`case when q.message_id is not null then json_build_object(
        'task', ${rowObject(Resource.Task, 't')},
        'attempt', ${rowObject(Resource.TaskAttempt, 'a')},
        'question', ${rowObject(Resource.Message, 'q', { artifacts: artifactsOf(row, row.ref('q.message_id')) })}
      ) end`.as('item')
    ])
}

/** {blocked: JSON array, left_out: task ids} of a run's blocked tasks. */
function blockedTasks (eb: ExpressionBuilder<any, any>, runId: Expression<string>) {
  return eb.selectFrom(blockedTaskRows(eb, runId).as('bt'))
    .select([
      sql<unknown>`coalesce(json_agg(bt.item order by bt.created_at, bt.task_id) filter (where bt.item is not null), '[]'::json)`.as('blocked'),
      sql<string[] | null>`array_agg(bt.task_id order by bt.created_at, bt.task_id) filter (where bt.item is null)`.as('left_out')
    ])
}

/** A run's tasks as a JSON array in list order. */
function tasksOf (eb: ExpressionBuilder<any, any>, runId: Expression<string>) {
  return eb.selectFrom('tasks as t')
    .select(jsonArray(rowObject(Resource.Task, 't'), sql`t.created_at, t.task_id`).as('tasks'))
    .where('t.run_id', '=', runId)
}

/**
 * Aggregates a page subquery `p` (columns item, position, key_created_at,
 * key_id; at most limit + 1 rows) into the body {<key>: [...]} and the key
 * of the next page when a row beyond the limit exists.
 */
function pageAggregates (key: string, limit: number) {
  return [
    sql<string>`json_build_object(${sql.lit(key)}, coalesce(json_agg(p.item order by p.position) filter (where p.position <= ${limit}), '[]'::json))::text`.as('body'),
    sql<string | null>`case when count(p.position) > ${limit} then max(p.key_created_at) filter (where p.position = ${limit}) end`.as('next_created_at'),
    sql<string | null>`case when count(p.position) > ${limit} then max(p.key_id) filter (where p.position = ${limit}) end`.as('next_id'),
    eventCursor
  ] as const
}

function toPagedBody (row: { body: string, next_created_at: string | null, next_id: string | null, event_cursor: string }): PagedBody {
  const page = { body: row.body, eventCursor: row.event_cursor }
  return row.next_created_at !== null && row.next_id !== null
    ? { ...page, next: { createdAt: row.next_created_at, id: row.next_id } }
    : page
}

function toBlockedBody (row: { body: string, left_out: string[] | null, event_cursor: string }): BlockedBody {
  return { body: row.body, eventCursor: row.event_cursor, leftOut: row.left_out ?? [] }
}

// ---- the queries ----------------------------------------------------------

/** listRuns: newest first (created_at desc, run_id desc), each with its task counts. */
export async function listRuns (db: Db, page: Page & { limit: number }): Promise<PagedBody> {
  const { limit } = page
  const { after } = page
  const rows = db.selectFrom('runs as r')
    .innerJoinLateral((eb) => taskCounts(eb, eb.ref('r.run_id')).as('c'), (join) => join.onTrue())
    .select((eb) => [
      sql<unknown>`json_build_object('run', ${rowObject(Resource.Run, 'r')}, 'task_counts', c.task_counts, 'total_tasks', c.total_tasks)`.as('item'),
      sql<number>`row_number() over (order by r.created_at desc, r.run_id desc)`.as('position'),
      utcTimestamp(eb.ref('r.created_at')).as('key_created_at'),
      'r.run_id as key_id'
    ])
    .$if(after !== undefined, (query) => query.where((eb) => eb(
      eb.refTuple('r.created_at', 'r.run_id'), '<', eb.tuple(sql<Date>`${after!.createdAt}::timestamptz`, after!.id)
    )))
    .orderBy('r.created_at', 'desc')
    .orderBy('r.run_id', 'desc')
    .limit(limit + 1)
  const row = await db.selectFrom(rows.as('p')).select(pageAggregates('runs', limit)).executeTakeFirstOrThrow()
  return toPagedBody(row)
}

/** listRunTasks: a run's tasks (created_at asc, task_id asc); undefined for an unknown run. */
export async function listRunTasks (db: Db, runId: string, page: Page): Promise<PagedBody | undefined> {
  const limit = page.limit ?? UNBOUNDED
  const { after } = page
  const row = await db.selectFrom('runs as r')
    .leftJoinLateral(
      (eb) => eb.selectFrom('tasks as t')
        .select((inner) => [
          rowObject(Resource.Task, 't').as('item'),
          sql<number>`row_number() over (order by t.created_at, t.task_id)`.as('position'),
          utcTimestamp(inner.ref('t.created_at')).as('key_created_at'),
          't.task_id as key_id'
        ])
        .whereRef('t.run_id', '=', 'r.run_id')
        .$if(after !== undefined, (query) => query.where((w) => w(
          w.refTuple('t.created_at', 't.task_id'), '>', w.tuple(sql<Date>`${after!.createdAt}::timestamptz`, after!.id)
        )))
        .orderBy('t.created_at')
        .orderBy('t.task_id')
        .limit(limit + 1)
        .as('p'),
      (join) => join.onTrue()
    )
    .select(pageAggregates('tasks', limit))
    .where('r.run_id', '=', runId)
    .groupBy('r.run_id')
    .executeTakeFirst()
  return row === undefined ? undefined : toPagedBody(row)
}

/** getRunDetail: the run, its counts, tasks and blocked tasks, from one snapshot. */
export async function getRunDetail (db: Db, runId: string): Promise<BlockedBody | undefined> {
  const row = await db.selectFrom('runs as r')
    .innerJoinLateral((eb) => taskCounts(eb, eb.ref('r.run_id')).as('c'), (join) => join.onTrue())
    .innerJoinLateral((eb) => blockedTasks(eb, eb.ref('r.run_id')).as('b'), (join) => join.onTrue())
    .select((eb) => [
      sql<string>`json_build_object('run', json_build_object(
        'run', ${rowObject(Resource.Run, 'r')},
        'task_counts', c.task_counts,
        'total_tasks', c.total_tasks,
        'tasks', (${tasksOf(eb, eb.ref('r.run_id'))}),
        'blocked_tasks', b.blocked
      ))::text`.as('body'),
      'b.left_out',
      eventCursor
    ])
    .where('r.run_id', '=', runId)
    .executeTakeFirst()
  return row === undefined ? undefined : toBlockedBody(row)
}

/** listBlockedTasks: a run's blocked tasks; undefined for an unknown run. */
export async function listBlockedTasks (db: Db, runId: string): Promise<BlockedBody | undefined> {
  const row = await db.selectFrom('runs as r')
    .innerJoinLateral((eb) => blockedTasks(eb, eb.ref('r.run_id')).as('b'), (join) => join.onTrue())
    .select([sql<string>`json_build_object('blocked', b.blocked)::text`.as('body'), 'b.left_out', eventCursor])
    .where('r.run_id', '=', runId)
    .executeTakeFirst()
  return row === undefined ? undefined : toBlockedBody(row)
}

/** getThreadDetail: the thread and its messages (created_at, message_id), each with its artifacts. */
export async function getThreadDetail (db: Db, threadId: string): Promise<ReadBody | undefined> {
  const row = await db.selectFrom('threads as th')
    .select((eb) => [sql<string>`json_build_object('thread', json_build_object(
      'thread', ${rowObject(Resource.Thread, 'th')},
      'messages', (${eb.selectFrom('messages as m')
        .select((inner) => jsonArray(
          rowObject(Resource.Message, 'm', { artifacts: artifactsOf(inner, inner.ref('m.message_id')) }),
          sql`m.created_at, m.message_id`
        ).as('messages'))
        .whereRef('m.thread_id', '=', 'th.thread_id')})
    ))::text`.as('body'), eventCursor])
    .where('th.thread_id', '=', threadId)
    .executeTakeFirst()
  return row === undefined ? undefined : { body: row.body, eventCursor: row.event_cursor }
}
