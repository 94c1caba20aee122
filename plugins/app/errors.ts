import fp from 'fastify-plugin'
import { notFound, toApiError } from '../../errors.js'

/**
 * Every error leaves as the {error: {code, message}} envelope, never
 * Fastify's default shape: the mapping itself is errors.ts's toApiError.
 */
export default fp(async function errorsPlugin (app) {
  app.setErrorHandler(async (err, request, reply) => {
    const apiError = toApiError(err)
    // The request's own log line (request-log.ts) has its status; this adds the cause.
    if (apiError.code === 'internal') request.log.error({ err }, 'request failed')
    else if (apiError.code === 'unavailable') request.log.warn({ err }, 'request failed: unavailable')
    else request.log.debug({ error: apiError.toBody().error }, 'request rejected')
    return reply.code(apiError.statusCode).send(apiError.toBody())
  })

  app.setNotFoundHandler(async (_request, reply) => {
    const error = notFound('route')
    return reply.code(error.statusCode).send(error.toBody())
  })
}, { name: 'errors' })
