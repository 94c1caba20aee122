import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { sql } from 'kysely'
import { Type } from 'typebox'
import { commonErrors, errorResponse } from '../schemas/api.ts'

const healthRoutes: FastifyPluginAsyncTypebox = async (app) => {
  // Liveness only: it answers while the process does, whatever the database
  // is doing, so an orchestrator does not restart a replica for an outage.
  app.get('/health', {
    schema: {
      operationId: 'getHealth',
      tags: ['operations'],
      security: [],
      summary: 'Liveness: the process is up',
      response: { 200: Type.Ref('Health', { description: 'The process is up' }), 400: commonErrors[400] }
    }
  }, async () => ({ status: 'ok' as const }))

  // Readiness: whether this replica should get traffic now.
  app.get('/ready', {
    schema: {
      operationId: 'getReady',
      tags: ['operations'],
      security: [],
      summary: 'Readiness: the database answers and the process is not shutting down',
      response: {
        200: Type.Object({ status: Type.Literal('ready') }, { additionalProperties: false, description: 'Ready for traffic' }),
        400: commonErrors[400],
        503: errorResponse('`unavailable`: the database does not answer, or the process is shutting down')
      }
    }
  }, async () => {
    // While shutting down, plugins/app/shutdown.ts answers 503 before this runs.
    await sql`select 1`.execute(app.db)
    return { status: 'ready' as const }
  })
}

export default healthRoutes
