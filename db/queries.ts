import { sql, type Expression, type ExpressionBuilder } from 'kysely'
import type pg from 'pg'
import * as Resource from '../schemas/resources.ts'
import { settledPosition } from './settled-position.ts'
import { jsonArray, jsonObject, rowJson, utcTimestamp } from './json.ts'
import { builder, queryRow, Statement } from './statement.ts'

/*
 * The read queries of docs/reference.md, "Endpoints". Each is ONE statement that returns
 * the finished JSON body as text: a statement reads one snapshot, so every
 * count agrees with every list in the same body, however writers interleave;
 * and a run detail or thread detail is one round trip, never N+1.
 * A query that finds nothing to answer for (unknown id) returns undefined.
 * Each statement is built once, at startup, and runs through the pool as a
 * prepared statement (db/statement.ts).
 */

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
  /** The settled position of the snapshot that produced the body (every event at or below it is visible to it or never commits). */
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

/**
 * The settled position of the statement's snapshot (X-Event-Cursor):
 * subscribing after it misses nothing since. `known` is a position settled
 * before the statement began: every read takes the hub's as its last argument.
 */
const eventCursor = (known: number) => settledPosition(known).as('event_cursor')

/** LIMIT for "no limit": larger than any table, and still a valid bigint. */
const UNBOUNDED = Number.MAX_SAFE_INTEGER

/** The task status that asks a person for an answer (docs/reference.md, "Conventions"). */
const BLOCKED = sql.lit('blocked')

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
    .select(jsonArray(rowJson(Resource.Artifact, 'ar'), sql`ar.created_at, ar.artifact_id`).as('artifacts'))
    .where('ar.message_id', '=', messageId)
}

/**
 * One row per blocked task of a run (docs/reference.md, "Conventions"): its attempt is the
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
        .limit(sql.lit(1))
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
        .limit(sql.lit(1))
        .as('q'),
      (join) => join.onTrue()
    )
    .where('t.run_id', '=', runId)
    .where('t.status', '=', BLOCKED)
    .select((row) => [
      't.task_id',
      't.created_at',
      sql<boolean>`q.message_id is not null`.as('complete'),
      jsonObject({
        task: rowJson(Resource.Task, 't'),
        attempt: rowJson(Resource.TaskAttempt, 'a'),
        question: rowJson(Resource.Message, 'q', { artifacts: artifactsOf(row, row.ref('q.message_id')) })
      }).as('item')
    ])
}

/** {blocked: JSON array, left_out: task ids} of a run's blocked tasks. */
function blockedTasks (eb: ExpressionBuilder<any, any>, runId: Expression<string>) {
  return eb.selectFrom(blockedTaskRows(eb, runId).as('bt'))
    .select([
      jsonArray(sql`bt.item`, sql`bt.created_at, bt.task_id`, sql`bt.complete`).as('blocked'),
      sql<string[] | null>`array_agg(bt.task_id order by bt.created_at, bt.task_id) filter (where not bt.complete)`.as('left_out')
    ])
}

/** Whether the run has a task in status blocked: one probe of tasks_run_status_idx. */
function hasBlockedTask (eb: ExpressionBuilder<any, any>, runId: Expression<string>) {
  return eb.exists(eb.selectFrom('tasks as bt')
    .select(sql.lit(1).as('one'))
    .where('bt.run_id', '=', runId)
    .where('bt.status', '=', BLOCKED))
}

/** A run's tasks as a JSON array in list order. */
function tasksOf (eb: ExpressionBuilder<any, any>, runId: Expression<string>) {
  return eb.selectFrom('tasks as t')
    .select(jsonArray(rowJson(Resource.Task, 't'), sql`t.created_at, t.task_id`).as('tasks'))
    .where('t.run_id', '=', runId)
}

/**
 * Aggregates a page subquery `p` (columns item, position, key_created_at,
 * key_id; at most limit + 1 rows) into the body {<key>: [...]} and the key
 * of the next page when a row beyond the limit exists.
 */
function pageAggregates (key: string, limit: number, known: number) {
  return [
    jsonObject({ [key]: jsonArray(sql`p.item`, sql`p.position`, sql`p.position <= ${limit}`) }).as('body'),
    sql<string | null>`case when count(p.position) > ${limit} then max(p.key_created_at) filter (where p.position = ${limit}) end`.as('next_created_at'),
    sql<string | null>`case when count(p.position) > ${limit} then max(p.key_id) filter (where p.position = ${limit}) end`.as('next_id'),
    eventCursor(known)
  ] as const
}

function toPagedBody (row: PageRow): PagedBody {
  const page = { body: row.body, eventCursor: row.event_cursor }
  return row.next_created_at !== null && row.next_id !== null
    ? { ...page, next: { createdAt: row.next_created_at, id: row.next_id } }
    : page
}

function toBlockedBody (row: BlockedRow): BlockedBody {
  return { body: row.body, eventCursor: row.event_cursor, leftOut: row.left_out ?? [] }
}

// ---- the queries ----------------------------------------------------------

interface PageRow extends pg.QueryResultRow { body: string, next_created_at: string | null, next_id: string | null, event_cursor: string }
interface BlockedRow extends pg.QueryResultRow { body: string, left_out: string[] | null, event_cursor: string }
interface BodyRow extends pg.QueryResultRow { body: string, event_cursor: string }

/**
 * The runs of a filtered page, before their task counts: for each status
 * wanted, its own keyset page from runs_status_created_at_run_id_idx,
 * then the newest `limitPlusOne` of those. A plain
 * `status = any(...)` filter would walk the whole list in order and skip the
 * runs in other statuses: the whole table for a rare status. Here a page
 * reads at most a page per status wanted. Stating the later pages' key as
 * (status, created_at, run_id) < (wanted, ...) matters for the generic plan of
 * the prepared statement: written as (created_at, run_id) < (...), the list's
 * own index takes it as an index condition too and the planner, estimating
 * the status filter without its value, may pick that index and skip its way
 * through most of the table. With `blocked`, each status's page keeps only
 * the runs with a blocked task, before its limit.
 */
function runsInStatuses (limitPlusOne: number, statuses: string[], blocked: boolean, after?: PageKey) {
  return builder.selectFrom(sql<{ status: string }>`unnest(${statuses}::text[])`.as<'wanted'>(sql`wanted(status)`))
    .innerJoinLateral((eb) => eb.selectFrom('runs as one').selectAll('one')
      .whereRef('one.status', '=', 'wanted.status')
      .$if(blocked, (query) => query.where((inner) => hasBlockedTask(inner, inner.ref('one.run_id'))))
      // The status leads the keyset comparison so that only the status index can start the scan at the key.
      .$if(after !== undefined, (query) => query.where((inner) => inner(
        inner.refTuple('one.status', 'one.created_at', 'one.run_id'), '<',
        inner.tuple(inner.ref('wanted.status'), sql<Date>`${after!.createdAt}::timestamptz`, after!.id)
      )))
      .orderBy('one.created_at', 'desc')
      .orderBy('one.run_id', 'desc')
      .limit(limitPlusOne)
      .as('one'), (join) => join.onTrue())
    .selectAll('one')
    .orderBy('one.created_at', 'desc')
    .orderBy('one.run_id', 'desc')
    .limit(limitPlusOne)
}

/** What narrows the run list: a status (any of several), and having a blocked task. */
export interface RunFilters {
  statuses?: string[]
  blocked?: boolean
}

/**
 * listRuns' statement: a page of runs after `after` (or the first), at most
 * `limit` of them, in `statuses` when given, only those with a blocked task
 * when `blocked`. Newest first from runs_created_at_run_id_idx (or each
 * status's page), the blocked filter a probe of tasks_run_status_idx for
 * each run passed over: no index orders runs by their blocked tasks, and
 * runs are thousands, where tasks are many more.
 */
function listRunsQuery (known: number, limit: number, limitPlusOne: number, after: PageKey | undefined, statuses: string[] | undefined, blocked: boolean) {
  const runs = statuses === undefined
    ? builder.selectFrom('runs as r')
      .$if(after !== undefined, (query) => query.where((eb) => eb(
        eb.refTuple('r.created_at', 'r.run_id'), '<', eb.tuple(sql<Date>`${after!.createdAt}::timestamptz`, after!.id)
      )))
      .$if(blocked, (query) => query.where((eb) => hasBlockedTask(eb, eb.ref('r.run_id'))))
    : builder.selectFrom(runsInStatuses(limitPlusOne, statuses, blocked, after).as('r'))
  const rows = runs
    .innerJoinLateral((eb) => taskCounts(eb, eb.ref('r.run_id')).as('c'), (join) => join.onTrue())
    .select((eb) => [
      jsonObject({ run: rowJson(Resource.Run, 'r'), task_counts: sql`c.task_counts`, total_tasks: sql`c.total_tasks` }).as('item'),
      sql<number>`row_number() over (order by r.created_at desc, r.run_id desc)`.as('position'),
      utcTimestamp(eb.ref('r.created_at')).as('key_created_at'),
      'r.run_id as key_id'
    ])
    .orderBy('r.created_at', 'desc')
    .orderBy('r.run_id', 'desc')
    .limit(limitPlusOne)
  return builder.selectFrom(rows.as('p')).select(pageAggregates('runs', limit, known))
}

type ListRunsArgs = [known: number, limit: number, limitPlusOne: number, createdAt: string | undefined, id: string | undefined, statuses: string[] | undefined]

/**
 * One statement per shape of page (first or after a key, in statuses or
 * not, blocked or not): each its own SQL, so that each gets its own plan.
 * Every one takes the same arguments; a shape's SQL uses only its own.
 */
const listRunsStatements = new Map<string, Statement<ListRunsArgs>>()
const shapeOf = (after: boolean, inStatuses: boolean, blocked: boolean) => `${after}/${inStatuses}/${blocked}`
for (const after of [false, true]) {
  for (const inStatuses of [false, true]) {
    for (const blocked of [false, true]) {
      listRunsStatements.set(shapeOf(after, inStatuses, blocked), new Statement<ListRunsArgs>(6, (known, limit, limitPlusOne, createdAt, id, statuses) =>
        listRunsQuery(known, limit, limitPlusOne, after ? { createdAt: createdAt!, id: id! } : undefined, inStatuses ? statuses : undefined, blocked)))
    }
  }
}

/**
 * listRuns: newest first (created_at desc, run_id desc), each with its task
 * counts; only runs in `statuses` when given, only runs with a blocked task
 * when `blocked`.
 */
export async function listRuns (pool: pg.Pool, page: Page & RunFilters & { limit: number }, known: number): Promise<PagedBody> {
  const { limit, after, statuses, blocked = false } = page
  const statement = listRunsStatements.get(shapeOf(after !== undefined, statuses !== undefined, blocked))!
  const row = await queryRow<PageRow, ListRunsArgs>(pool, statement, known, limit, limit + 1, after?.createdAt, after?.id, statuses)
  return toPagedBody(row!)
}

/** listRunTasks' statement: a page of a run's tasks after `after` (or the first). */
function listRunTasksQuery (known: number, runId: string, limit: number, limitPlusOne: number, after?: PageKey) {
  return builder.selectFrom('runs as r')
    .leftJoinLateral(
      (eb) => eb.selectFrom('tasks as t')
        .select((inner) => [
          rowJson(Resource.Task, 't').as('item'),
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
        .limit(limitPlusOne)
        .as('p'),
      (join) => join.onTrue()
    )
    .select(pageAggregates('tasks', limit, known))
    .where('r.run_id', '=', runId)
    .groupBy('r.run_id')
}

const listRunTasksFirst = new Statement(4,
  (known: number, runId: string, limit: number, limitPlusOne: number) => listRunTasksQuery(known, runId, limit, limitPlusOne))
const listRunTasksAfter = new Statement(6, (known: number, runId: string, limit: number, limitPlusOne: number, createdAt: string, id: string) =>
  listRunTasksQuery(known, runId, limit, limitPlusOne, { createdAt, id }))

/** listRunTasks: a run's tasks (created_at asc, task_id asc); undefined for an unknown run. */
export async function listRunTasks (pool: pg.Pool, runId: string, page: Page, known: number): Promise<PagedBody | undefined> {
  const limit = page.limit ?? UNBOUNDED
  const { after } = page
  const row = after === undefined
    ? await queryRow<PageRow, [number, string, number, number]>(pool, listRunTasksFirst, known, runId, limit, limit + 1)
    : await queryRow<PageRow, [number, string, number, number, string, string]>(
      pool, listRunTasksAfter, known, runId, limit, limit + 1, after.createdAt, after.id)
  return row === undefined ? undefined : toPagedBody(row)
}

const runDetail = new Statement(2, (known: number, runId: string) => builder.selectFrom('runs as r')
  .innerJoinLateral((eb) => taskCounts(eb, eb.ref('r.run_id')).as('c'), (join) => join.onTrue())
  .innerJoinLateral((eb) => blockedTasks(eb, eb.ref('r.run_id')).as('b'), (join) => join.onTrue())
  .select((eb) => [
    jsonObject({
      run: jsonObject({
        run: rowJson(Resource.Run, 'r'),
        task_counts: sql`c.task_counts`,
        total_tasks: sql`c.total_tasks`,
        tasks: sql`(${tasksOf(eb, eb.ref('r.run_id'))})`,
        blocked_tasks: sql`b.blocked`
      })
    }).as('body'),
    'b.left_out',
    eventCursor(known)
  ])
  .where('r.run_id', '=', runId))

/** getRunDetail: the run, its counts, tasks and blocked tasks, from one snapshot. */
export async function getRunDetail (pool: pg.Pool, runId: string, known: number): Promise<BlockedBody | undefined> {
  const row = await queryRow<BlockedRow, [number, string]>(pool, runDetail, known, runId)
  return row === undefined ? undefined : toBlockedBody(row)
}

/**
 * A task's detail as a lateral row of its run `r`: {task: TaskDetail}, the
 * task with every attempt (attempt_no desc) and every thread (created_at
 * desc, thread_id desc); no row when the run has no such task.
 */
function taskDetailOf (eb: ExpressionBuilder<any, any>, taskId: string) {
  return eb.selectFrom('tasks as t')
    .select((row) => jsonObject({
      task: rowJson(Resource.TaskDetail, 't', {
        attempts: sql`(${row.selectFrom('task_attempts as a')
          .select(jsonArray(rowJson(Resource.TaskAttempt, 'a'), sql`a.attempt_no desc`).as('attempts'))
          .whereRef('a.run_id', '=', 't.run_id')
          .whereRef('a.task_id', '=', 't.task_id')})`,
        threads: sql`(${row.selectFrom('threads as th')
          .select(jsonArray(rowJson(Resource.Thread, 'th'), sql`th.created_at desc, th.thread_id desc`).as('threads'))
          .whereRef('th.run_id', '=', 't.run_id')
          .whereRef('th.task_id', '=', 't.task_id')})`
      })
    }).as('body'))
    .whereRef('t.run_id', '=', 'r.run_id')
    .where('t.task_id', '=', taskId)
}

const taskDetail = new Statement(3, (known: number, runId: string, taskId: string) => builder.selectFrom('runs as r')
  .leftJoinLateral((eb) => taskDetailOf(eb, taskId).as('td'), (join) => join.onTrue())
  .select(['td.body', eventCursor(known)])
  .where('r.run_id', '=', runId))

interface TaskDetailRow extends pg.QueryResultRow { body: string | null, event_cursor: string }

/** getTaskDetail: the task, its attempts and its threads, from one snapshot; says which is missing when the run or its task is unknown. */
export async function getTaskDetail (pool: pg.Pool, runId: string, taskId: string, known: number): Promise<ReadBody | 'no run' | 'no task'> {
  const row = await queryRow<TaskDetailRow, [number, string, string]>(pool, taskDetail, known, runId, taskId)
  if (row === undefined) return 'no run'
  if (row.body === null) return 'no task'
  return { body: row.body, eventCursor: row.event_cursor }
}

const blockedList = new Statement(2, (known: number, runId: string) => builder.selectFrom('runs as r')
  .innerJoinLateral((eb) => blockedTasks(eb, eb.ref('r.run_id')).as('b'), (join) => join.onTrue())
  .select([jsonObject({ blocked: sql`b.blocked` }).as('body'), 'b.left_out', eventCursor(known)])
  .where('r.run_id', '=', runId))

/** listBlockedTasks: a run's blocked tasks; undefined for an unknown run. */
export async function listBlockedTasks (pool: pg.Pool, runId: string, known: number): Promise<BlockedBody | undefined> {
  const row = await queryRow<BlockedRow, [number, string]>(pool, blockedList, known, runId)
  return row === undefined ? undefined : toBlockedBody(row)
}

const threadDetail = new Statement(2, (known: number, threadId: string) => builder.selectFrom('threads as th')
  .select((eb) => [jsonObject({
    thread: jsonObject({
      thread: rowJson(Resource.Thread, 'th'),
      messages: sql`(${eb.selectFrom('messages as m')
        .select((inner) => jsonArray(
          rowJson(Resource.Message, 'm', { artifacts: artifactsOf(inner, inner.ref('m.message_id')) }),
          sql`m.created_at, m.message_id`
        ).as('messages'))
        .whereRef('m.thread_id', '=', 'th.thread_id')})`
    })
  }).as('body'), eventCursor(known)])
  .where('th.thread_id', '=', threadId))

/** getThreadDetail: the thread and its messages (created_at, message_id), each with its artifacts. */
export async function getThreadDetail (pool: pg.Pool, threadId: string, known: number): Promise<ReadBody | undefined> {
  const row = await queryRow<BodyRow, [number, string]>(pool, threadDetail, known, threadId)
  return row === undefined ? undefined : { body: row.body, eventCursor: row.event_cursor }
}
