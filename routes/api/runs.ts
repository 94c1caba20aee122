import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import type { FastifyBaseLogger, FastifyReply, FastifyRequest } from 'fastify'
import { getRunDetail, getTaskDetail, listBlockedTasks, listRunTasks, listRuns, type PageKey, type PagedBody } from '../../db/queries.ts'
import { invalidParameter, notFound } from '../../errors.ts'
import {
  CACHE_CONTROL_DOCS, commonErrors, ConditionalHeaders, notFoundErrors, notModified, PageKeyParam, PageQuery, parseLimit, parseStatuses, readResponse,
  RunParams, RunsQuery, TaskParams, taskNotFoundErrors
} from '../../schemas/api.ts'

// ---- keyset paging (docs/reference.md, "Ordering and pages") -----------------------------------

/*
 * A page key is where the next page of a list starts: the sort key of the
 * previous page's last item. On the wire it is the opaque `cursor` query
 * parameter (docs/reference.md, "Ordering and pages"), which is not an event id; here it is
 * called a page key.
 */

const PAGE_KEY_TIMESTAMP = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$/

/** The page key as the opaque `cursor` parameter: base64url of [created_at, id] of the last item of the previous page. */
function encodePageKey (key: PageKey): string {
  return Buffer.from(JSON.stringify([key.createdAt, key.id])).toString('base64url')
}

function decodePageKey (text: string): PageKey {
  let decoded: unknown
  try {
    decoded = JSON.parse(Buffer.from(text, 'base64url').toString('utf8'))
  } catch {
    throw invalidParameter(PageKeyParam)
  }
  if (!Array.isArray(decoded) || decoded.length !== 2) throw invalidParameter(PageKeyParam)
  const [createdAt, id] = decoded as unknown[]
  if (typeof createdAt !== 'string' || !PAGE_KEY_TIMESTAMP.test(createdAt) || Number.isNaN(Date.parse(createdAt)) ||
      typeof id !== 'string' || id.includes('\u0000')) {
    throw invalidParameter(PageKeyParam)
  }
  return { createdAt, id }
}

/** Sends a page, with `Link: <...>; rel="next"` (RFC 8288) when more items remain; the next page keeps the page's filters. */
function sendPage (request: FastifyRequest, reply: FastifyReply, page: PagedBody, limit: number | undefined, filters: Record<string, string> = {}) {
  if (page.next !== undefined && limit !== undefined) {
    const path = request.url.split('?', 1)[0]
    const query = new URLSearchParams({ ...filters, limit: String(limit), cursor: encodePageKey(page.next) })
    reply.header('link', `<${path}?${query.toString()}>; rel="next"`)
  }
  return reply.sendRead(page)
}

// ---- blocked tasks left out (docs/reference.md, "Conventions") --------------------------

const MAX_REPORTED = 10_000

/**
 * A reporter that logs each blocked task with no attempt or no question
 * once (per application), at debug: it is the orchestrator's business, and
 * a dashboard polling the run must not repeat it on every request.
 */
function leftOutReporter () {
  const reported = new Set<string>()
  return (log: FastifyBaseLogger, runId: string, taskIds: string[]) => {
    for (const taskId of taskIds) {
      const key = JSON.stringify([runId, taskId])
      if (reported.has(key)) continue
      /* c8 ignore next: the memory bound, reached after 10,000 distinct left-out tasks */
      if (reported.size >= MAX_REPORTED) reported.clear()
      reported.add(key)
      log.debug({ runId, taskId }, 'blocked task left out of the blocked list: it has no attempt or no question')
    }
  }
}

// ---- routes ---------------------------------------------------------------

const runRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const { RUN_LIST_DEFAULT_LIMIT } = app.config
  const reportLeftOut = leftOutReporter()

  app.get('/runs', {
    schema: {
      operationId: 'listRuns',
      tags: ['runs'],
      summary: 'Runs, newest first, each with its task counts',
      description: `Newest first (created_at desc, run_id desc). Without \`limit\`, at most ${RUN_LIST_DEFAULT_LIMIT} runs ` +
        '(RUN_LIST_DEFAULT_LIMIT); a Link rel="next" header is sent whenever more remain, keeping `status` and `blocked`.',
      querystring: RunsQuery,
      headers: ConditionalHeaders,
      response: { 200: readResponse('RunList', 'The runs, newest first', CACHE_CONTROL_DOCS.state), ...notModified, ...commonErrors }
    }
  }, async (request, reply) => {
    const limit = parseLimit(request.query.limit) ?? RUN_LIST_DEFAULT_LIMIT
    const after = request.query.cursor === undefined ? undefined : decodePageKey(request.query.cursor)
    const statuses = parseStatuses(request.query.status)
    const blocked = request.query.blocked === 'true'
    const page = await listRuns(app.dbPool, { limit, after, statuses, blocked }, await app.events.ready())
    return sendPage(request, reply, page, limit, {
      ...(statuses === undefined ? {} : { status: statuses.join(',') }),
      ...(blocked ? { blocked: 'true' } : {})
    })
  })

  app.get('/runs/:runID', {
    schema: {
      operationId: 'getRunDetail',
      tags: ['runs'],
      summary: 'A run with its task counts, tasks and blocked tasks, from one snapshot',
      params: RunParams,
      headers: ConditionalHeaders,
      response: { 200: readResponse('RunDetailEnvelope', 'The run in detail', CACHE_CONTROL_DOCS.state), ...notModified, ...notFoundErrors }
    }
  }, async (request, reply) => {
    const { runID } = request.params
    const detail = await getRunDetail(app.dbPool, runID, await app.events.ready())
    if (detail === undefined) throw notFound('run')
    reportLeftOut(request.log, runID, detail.leftOut)
    return reply.sendRead(detail)
  })

  app.get('/runs/:runID/tasks', {
    schema: {
      operationId: 'listRunTasks',
      tags: ['runs'],
      summary: 'The tasks of a run',
      description: 'Ordered by created_at, then task_id. All of them unless `limit` is given; then a Link rel="next" header is sent whenever more remain.',
      params: RunParams,
      querystring: PageQuery,
      headers: ConditionalHeaders,
      response: { 200: readResponse('TaskList', 'The run\'s tasks', CACHE_CONTROL_DOCS.state), ...notModified, ...notFoundErrors }
    }
  }, async (request, reply) => {
    const limit = parseLimit(request.query.limit)
    const after = request.query.cursor === undefined ? undefined : decodePageKey(request.query.cursor)
    const page = await listRunTasks(app.dbPool, request.params.runID, { limit, after }, await app.events.ready())
    if (page === undefined) throw notFound('run')
    return sendPage(request, reply, page, limit)
  })

  app.get('/runs/:runID/tasks/:taskID', {
    schema: {
      operationId: 'getTaskDetail',
      tags: ['runs'],
      summary: 'A task with all its attempts and threads, from one snapshot',
      description: 'Every field of the task, its attempts (attempt_no desc) and its threads (created_at desc, then thread_id desc; each thread\'s ' +
        'messages: getThreadDetail).',
      params: TaskParams,
      headers: ConditionalHeaders,
      response: { 200: readResponse('TaskDetailEnvelope', 'The task in detail', CACHE_CONTROL_DOCS.state), ...notModified, ...taskNotFoundErrors }
    }
  }, async (request, reply) => {
    const { runID, taskID } = request.params
    const detail = await getTaskDetail(app.dbPool, runID, taskID, await app.events.ready())
    if (detail === 'no run') throw notFound('run')
    if (detail === 'no task') throw notFound('task')
    return reply.sendRead(detail)
  })

  app.get('/runs/:runID/blocked', {
    schema: {
      operationId: 'listBlockedTasks',
      tags: ['runs'],
      summary: 'The blocked tasks of a run, each with its attempt and the question that blocks it',
      params: RunParams,
      headers: ConditionalHeaders,
      response: { 200: readResponse('BlockedTaskList', 'The run\'s blocked tasks', CACHE_CONTROL_DOCS.state), ...notModified, ...notFoundErrors }
    }
  }, async (request, reply) => {
    const { runID } = request.params
    const blocked = await listBlockedTasks(app.dbPool, runID, await app.events.ready())
    if (blocked === undefined) throw notFound('run')
    reportLeftOut(request.log, runID, blocked.leftOut)
    return reply.sendRead(blocked)
  })
}

export default runRoutes
