import underPressure from '@fastify/under-pressure'
import fp from 'fastify-plugin'
import { getHeapStatistics } from 'node:v8'
import { overloaded } from '../../errors.js'

/** Routes that answer even under pressure: liveness, readiness, and the metrics that explain it. */
const ALWAYS_ANSWERED = new Set(['/health', '/ready', '/metrics'])

/** Seconds a shed client is asked to wait. */
const RETRY_AFTER_SECONDS = 2

/**
 * Load shedding: when the event loop lags past MAX_EVENT_LOOP_DELAY_MS, or
 * the heap passes MAX_HEAP_USED_BYTES (90% of V8's limit by default), or
 * resident memory passes MAX_RSS_BYTES, requests answer 503 `unavailable`
 * at once instead of queueing behind the backlog.
 */
export default fp(async function underPressurePlugin (app) {
  const { MAX_EVENT_LOOP_DELAY_MS, MAX_HEAP_USED_BYTES, MAX_RSS_BYTES } = app.config
  await app.register(underPressure, {
    maxEventLoopDelay: MAX_EVENT_LOOP_DELAY_MS,
    maxHeapUsedBytes: MAX_HEAP_USED_BYTES || Math.floor(getHeapStatistics().heap_size_limit * 0.9),
    maxRssBytes: MAX_RSS_BYTES,
    sampleInterval: 250,
    // Resolving lets the request through; rejecting sends it to the error
    // handler, which answers with the envelope.
    pressureHandler: async (request, reply, type, value) => {
      if (ALWAYS_ANSWERED.has(request.url.split('?', 1)[0]!)) return
      request.log.warn({ type, value }, 'shedding load')
      reply.header('retry-after', RETRY_AFTER_SECONDS)
      throw overloaded
    }
  })
}, { name: 'under-pressure', decorators: { fastify: ['config'] } })
