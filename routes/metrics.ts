import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { Type } from 'typebox'
import { commonErrors, errorResponse } from '../schemas/api.ts'

const metricsRoutes: FastifyPluginAsyncTypebox = async (app) => {
  app.get('/metrics', {
    schema: {
      operationId: 'getMetrics',
      tags: ['operations'],
      summary: 'Prometheus metrics (text exposition format)',
      response: {
        200: { description: 'Prometheus text format', content: { 'text/plain': { schema: Type.String() } } },
        400: commonErrors[400],
        401: errorResponse('`unauthorized`: a missing, unknown, expired or refused token (only when authentication is on)'),
        421: commonErrors[421]
      }
    }
  }, async (_request, reply) => {
    return reply.type(app.metrics.contentType).send(await app.metrics.metrics())
  })
}

export default metricsRoutes
