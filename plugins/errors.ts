import fp from 'fastify-plugin'
import { notFound, toApiError } from '../errors.js'

/**
 * Every error leaves as the {error: {code, message}} envelope, never
 * Fastify's default shape: the mapping itself is errors.ts's toApiError.
 */
export default fp(async function errorsPlugin (app) {
  app.setErrorHandler(async (err, request, reply) => {
    const apiError = toApiError(err)
    if (apiError.statusCode >= 500) {
      request.log[apiError.code === 'unavailable' ? 'warn' : 'error']({ err }, `request failed: ${apiError.code}`)
    } else {
      request.log.info({ err: { code: apiError.code, message: apiError.message } }, 'request rejected')
    }
    return reply.code(apiError.statusCode).send(apiError.toBody())
  })

  app.setNotFoundHandler(async (_request, reply) => {
    const error = notFound('route')
    return reply.code(error.statusCode).send(error.toBody())
  })
}, { name: 'errors' })
