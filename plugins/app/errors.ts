import type { FastifyReply, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { LimitRefusal, notFound, toApiError, type ApiError, type RequestSchemas } from '../../errors.ts'
import { NO_STORE } from './http-cache.ts'

declare module 'fastify' {
  interface FastifyContextConfig {
    /**
     * Whether a request is for an event stream: then a transient refusal is
     * answered so that an EventSource retries (docs/reference.md, "The event stream"). A
     * function, since a Durable Streams read is a stream only with live=sse;
     * it also says which requests @fastify/sse's wrapper runs for (events.ts).
     */
    eventStream?: (request: FastifyRequest) => boolean
  }
}

/** What a stream's refusal may be answered with a retry for: a transient one, or a limit per caller (its own streams may end). */
const RETRIED_ON_STREAMS = new Set(['unavailable', 'too_many_requests'])

/**
 * A stream refused for a transient reason (database unavailable, a stream
 * limit, shutting down, load shedding): a browser EventSource gives up for
 * good on any non-200, so it gets a 200 event stream with a `retry:`
 * (SSE_RETRY_MS) and a comment saying why, then the end. The client
 * reconnects by itself with its Last-Event-ID.
 */
function answerAsStreamRetry (reply: FastifyReply, apiError: ApiError, retryMs: number) {
  return reply.code(200)
    .header('content-type', 'text/event-stream')
    .header('cache-control', 'no-cache')
    .header('x-accel-buffering', 'no')
    .send(`retry: ${retryMs}\n: ${apiError.code}: ${apiError.message}\n\n`)
}

/**
 * Every error leaves as the {error: {code, message}} envelope, never
 * Fastify's default shape: the mapping itself is errors.ts's toApiError.
 * No cache keeps one (a 404 may become a 200, a 503 passes).
 */
export default fp(async function errorsPlugin (app) {
  const { SSE_RETRY_MS } = app.config
  // A long-poll refused at a limit waits as long as a refused stream's retry: says, in whole seconds.
  const limitRetryAfterS = Math.max(1, Math.ceil(SSE_RETRY_MS / 1000))
  app.setErrorHandler(async (err, request, reply) => {
    const apiError = toApiError(err, request.routeOptions.schema as RequestSchemas | undefined)
    // The request's own log line (request-log.ts) has its status; this adds the cause.
    // A stream's refusal is a 200 there: which limit refused it is said here.
    if (apiError instanceof LimitRefusal) {
      const details = { limit: apiError.kind, reason: apiError.reason }
      // The instance full is the operator's to see; a caller at its share, the caller's.
      if (apiError.reason === 'instance') request.log.warn(details, `${apiError.kind} refused: this instance is at its limit`)
      else request.log.info(details, `${apiError.kind} refused: the caller is at its share`)
    } else if (apiError.code === 'internal') request.log.error({ err }, 'request failed')
    else if (apiError.code === 'unavailable') request.log.warn({ err }, 'request failed: unavailable')
    else request.log.debug({ error: apiError.toBody().error }, 'request rejected')
    if (RETRIED_ON_STREAMS.has(apiError.code) && request.routeOptions.config.eventStream?.(request) === true) {
      return answerAsStreamRetry(reply, apiError, SSE_RETRY_MS)
    }
    if (apiError instanceof LimitRefusal) reply.header('retry-after', limitRetryAfterS)
    return reply.code(apiError.statusCode).header('cache-control', NO_STORE).send(apiError.toBody())
  })

  app.setNotFoundHandler(async (_request, reply) => {
    const error = notFound('route')
    return reply.code(error.statusCode).header('cache-control', NO_STORE).send(error.toBody())
  })
}, { name: 'errors', decorators: { fastify: ['config'] } })
