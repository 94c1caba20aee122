import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import type { FastifyBaseLogger, FastifyReply, FastifyRequest } from 'fastify'
import { Type } from 'typebox'
import { getRunDetail, listBlockedTasks, listRunTasks, listRuns, type PageKey, type PagedBody } from '../../db/queries.js'
import { badRequest, notFound } from '../../errors.js'
import { commonErrors, notFoundErrors, PageQuery, parseLimit, RunParams } from '../../schemas/api.js'

// ---- keyset paging (CONTRACT section 3) -----------------------------------

const CURSOR_TIMESTAMP = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$/

/** The opaque `cursor`: base64url of [created_at, id] of the last item of the previous page. */
function encodeCursor (key: PageKey): string {
  return Buffer.from(JSON.stringify([key.createdAt, key.id])).toString('base64url')
}

function decodeCursor (cursor: string): PageKey {
  let decoded: unknown
  try {
    decoded = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8'))
  } catch {
    throw badRequest('cursor is not valid: pass the one from a Link: rel="next" URL')
  }
  if (!Array.isArray(decoded) || decoded.length !== 2) throw badRequest('cursor is not valid: pass the one from a Link: rel="next" URL')
  const [createdAt, id] = decoded as unknown[]
  if (typeof createdAt !== 'string' || !CURSOR_TIMESTAMP.test(createdAt) || Number.isNaN(Date.parse(createdAt)) ||
      typeof id !== 'string' || id.includes('\u0000')) {
    throw badRequest('cursor is not valid: pass the one from a Link: rel="next" URL')
  }
  return { createdAt, id }
}

/** Sends a page, with `Link: <...>; rel="next"` (RFC 8288) when more items remain. */
function sendPage (request: FastifyRequest, reply: FastifyReply, page: PagedBody, limit: number | undefined) {
  if (page.next !== undefined && limit !== undefined) {
    const path = request.url.split('?', 1)[0]
    const query = new URLSearchParams({ limit: String(limit), cursor: encodeCursor(page.next) })
    reply.header('link', `<${path}?${query.toString()}>; rel="next"`)
  }
  return reply.sendRead(page)
}

// ---- blocked tasks left out (CONTRACT section 2) --------------------------

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
      description: `Newest first (created_at desc, run_id desc). Without \`limit\`, at most ${RUN_LIST_DEFAULT_LIMIT} runs (RUN_LIST_DEFAULT_LIMIT); a Link rel="next" header is sent whenever more remain.`,
      querystring: PageQuery,
      response: { 200: Type.Ref('RunList', { description: 'The runs, newest first' }), ...commonErrors }
    }
  }, async (request, reply) => {
    const limit = parseLimit(request.query.limit) ?? RUN_LIST_DEFAULT_LIMIT
    const after = request.query.cursor === undefined ? undefined : decodeCursor(request.query.cursor)
    return sendPage(request, reply, await listRuns(app.dbPool, { limit, after }, await app.events.ready()), limit)
  })

  app.get('/runs/:runID', {
    schema: {
      operationId: 'getRunDetail',
      tags: ['runs'],
      summary: 'A run with its task counts, tasks and blocked tasks, from one snapshot',
      params: RunParams,
      response: { 200: Type.Ref('RunDetailEnvelope', { description: 'The run in detail' }), ...notFoundErrors }
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
      response: { 200: Type.Ref('TaskList', { description: 'The run\'s tasks' }), ...notFoundErrors }
    }
  }, async (request, reply) => {
    const { cursor } = request.query
    const limit = parseLimit(request.query.limit)
    const after = cursor === undefined ? undefined : decodeCursor(cursor)
    const page = await listRunTasks(app.dbPool, request.params.runID, { limit, after }, await app.events.ready())
    if (page === undefined) throw notFound('run')
    return sendPage(request, reply, page, limit)
  })

  app.get('/runs/:runID/blocked', {
    schema: {
      operationId: 'listBlockedTasks',
      tags: ['runs'],
      summary: 'The blocked tasks of a run, each with its attempt and the question that blocks it',
      params: RunParams,
      response: { 200: Type.Ref('BlockedTaskList', { description: 'The run\'s blocked tasks' }), ...notFoundErrors }
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
