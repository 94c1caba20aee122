import underPressure, { TYPE_EVENT_LOOP_DELAY } from '@fastify/under-pressure'
import type { FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { getHeapStatistics } from 'node:v8'
import { overloaded } from '../../errors.ts'

/** Routes that answer even under pressure: liveness, readiness, and the metrics that explain it. */
const ALWAYS_ANSWERED = new Set(['/health', '/ready', '/metrics'])

/**
 * A Durable Streams long-poll waits in memory and is answered by the
 * poller's fan-out: shedding it under event-loop delay saves the loop
 * nothing (it comes back after Retry-After, on a new request), and the
 * delay it would be shed for is mostly that fan-out's. Memory pressure
 * still sheds it.
 */
const isLongPoll = (request: FastifyRequest) => request.url.startsWith('/api/streams/') && (request.query as { live?: unknown }).live === 'long-poll'

/** Seconds a shed client is asked to wait. */
const RETRY_AFTER_SECONDS = 2

/** How often under-pressure samples the event loop's delay. */
const SAMPLE_INTERVAL_MS = 250

/** How long after its first request the service sheds nothing for event-loop delay: until a whole sample has been taken after it. */
export const START_GRACE_MS = 2 * SAMPLE_INTERVAL_MS

/**
 * Load shedding: when the event loop lags past MAX_EVENT_LOOP_DELAY_MS, or
 * the heap passes MAX_HEAP_USED_BYTES (90% of V8's limit by default), or
 * resident memory passes MAX_RSS_BYTES, requests answer 503 `unavailable`
 * at once instead of queueing behind the backlog.
 *
 * The samples taken while the application starts measure its loading (on a
 * busy machine, seconds of compiling), not load: event-loop delay sheds
 * nothing until a whole sample has been taken after the first request. The
 * start ends when the service first answers (a healthcheck, usually), not at
 * an `onReady` hook of its own, which later hooks can outlast.
 */
export default fp(async function underPressurePlugin (app) {
  const { MAX_EVENT_LOOP_DELAY_MS, MAX_HEAP_USED_BYTES, MAX_RSS_BYTES } = app.config
  let measuresLoadFrom: number | undefined
  // Before under-pressure's own hook, so that it runs first.
  app.addHook('onRequest', (_request, _reply, done) => { measuresLoadFrom ??= performance.now() + START_GRACE_MS; done() })
  await app.register(underPressure, {
    maxEventLoopDelay: MAX_EVENT_LOOP_DELAY_MS,
    maxHeapUsedBytes: MAX_HEAP_USED_BYTES || Math.floor(getHeapStatistics().heap_size_limit * 0.9),
    maxRssBytes: MAX_RSS_BYTES,
    sampleInterval: SAMPLE_INTERVAL_MS,
    // Resolving lets the request through; rejecting sends it to the error
    // handler, which answers with the envelope.
    pressureHandler: async (request, reply, type, value) => {
      if (ALWAYS_ANSWERED.has(request.url.split('?', 1)[0]!)) return
      if (type === TYPE_EVENT_LOOP_DELAY && (performance.now() < measuresLoadFrom! || isLongPoll(request))) return
      request.log.warn({ type, value }, 'shedding load')
      reply.header('retry-after', RETRY_AFTER_SECONDS)
      throw overloaded
    }
  })
}, { name: 'under-pressure', decorators: { fastify: ['config'] } })
