import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { Type } from 'typebox'
import { getThreadDetail } from '../../db/queries.js'
import { notFound } from '../../errors.js'
import { notFoundErrors, ThreadParams } from '../../schemas/api.js'

const threadRoutes: FastifyPluginAsyncTypebox = async (app) => {
  app.get('/threads/:threadID', {
    schema: {
      operationId: 'getThreadDetail',
      tags: ['threads'],
      summary: 'A thread with its messages in order, each with its artifacts',
      params: ThreadParams,
      response: { 200: Type.Ref('ThreadDetailEnvelope', { description: 'The thread and its messages' }), ...notFoundErrors }
    }
  }, async (request, reply) => {
    const thread = await getThreadDetail(app.dbPool, request.params.threadID, await app.events.ready())
    if (thread === undefined) throw notFound('thread')
    return reply.sendRead(thread)
  })
}

export default threadRoutes
