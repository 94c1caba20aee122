import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { getThreadDetail } from '../../db/queries.ts'
import { notFound } from '../../errors.ts'
import { CACHE_CONTROL_DOCS, ConditionalHeaders, notFoundErrors, notModified, readResponse, ThreadParams } from '../../schemas/api.ts'

const threadRoutes: FastifyPluginAsyncTypebox = async (app) => {
  app.get('/threads/:threadID', {
    schema: {
      operationId: 'getThreadDetail',
      tags: ['threads'],
      summary: 'A thread with its messages in order, each with its artifacts',
      params: ThreadParams,
      headers: ConditionalHeaders,
      response: { 200: readResponse('ThreadDetailEnvelope', 'The thread and its messages', CACHE_CONTROL_DOCS.state), ...notModified, ...notFoundErrors }
    }
  }, async (request, reply) => {
    const thread = await getThreadDetail(app.dbPool, request.params.threadID, await app.events.ready())
    if (thread === undefined) throw notFound('thread')
    return reply.sendRead(thread)
  })
}

export default threadRoutes
