import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { Type } from 'typebox'

const healthRoutes: FastifyPluginAsyncTypebox = async (app) => {
  // Liveness only: it answers while the process does, whatever the database
  // is doing, so an orchestrator does not restart a replica for an outage.
  app.get('/health', {
    schema: {
      operationId: 'getHealth',
      summary: 'Liveness: the process is up',
      response: { 200: Type.Ref('Health') }
    }
  }, async () => ({ status: 'ok' as const }))
}

export default healthRoutes
