import { fastifySSE } from '@fastify/sse'
import type { FastifyInstance, RouteHandlerMethod, RouteOptions } from 'fastify'
import fp from 'fastify-plugin'
import { durationMs } from '../../config.ts'
import { EventLog } from '../../events/index.ts'

declare module 'fastify' {
  interface FastifyInstance {
    /** The process's event log (events/): its hub, streams, Durable Streams reads, wake-up and keeper. */
    events: EventLog
  }
}

/**
 * @fastify/sse, for the routes that may stream (`sse`). It wraps such a
 * route's handler: every request gets an SSE context, two listeners and
 * one more async frame. A route that streams for some requests only (its
 * config.eventStream says which: a Durable Streams read with live=sse)
 * keeps the handler it declared for the others (a crowd's every
 * long-poll): taken before the wrapping, and chosen by request after it.
 */
export async function registerSse (app: FastifyInstance): Promise<void> {
  const declared = new WeakMap<RouteOptions, RouteHandlerMethod>()
  app.addHook('onRoute', (route) => {
    if (route.sse !== undefined && route.config?.eventStream !== undefined) declared.set(route, route.handler)
  })
  // No heartbeat of @fastify/sse, for every route (the one place it is
  // turned off): the event log's keep-alive, which also moves a filtered
  // stream's event id, is the only one (SSE_KEEPALIVE_MS).
  await app.register(fastifySSE, { heartbeatInterval: 0 })
  app.addHook('onRoute', (route) => {
    const plain = declared.get(route)
    const streams = route.config?.eventStream
    if (plain === undefined || streams === undefined) return
    const withSse = route.handler
    route.handler = function (request, reply) {
      return (streams(request) ? withSse : plain).call(this, request, reply)
    }
  })
}

/**
 * The event log (events/) as the application uses it: @fastify/sse for a
 * stream's connection (headers, Last-Event-ID, freeing a client the moment
 * its response closes), the log started when the server is ready, its
 * streams ended as the server stops accepting (so that clients reconnect
 * elsewhere and the close does not wait on them), its keeper stopped last.
 * The wake-up runs unless EVENTS_WAKEUP=off or on the embedded database
 * (which only polls); the keeper where this service may write
 * (plugins/app/db.ts says where each connects).
 */
export default fp(async function eventsPlugin (app) {
  const { config } = app
  await registerSse(app)
  const mode = config.EVENTS_WAKEUP
  const events = new EventLog(app.db, {
    pollIntervalMs: config.EVENTS_POLL_INTERVAL_MS,
    wakeupPollIntervalMs: config.EVENTS_WAKEUP_POLL_INTERVAL_MS,
    windowBytes: config.EVENTS_WINDOW_BYTES,
    keepAliveMs: config.SSE_KEEPALIVE_MS,
    maxStreams: config.SSE_MAX_STREAMS,
    maxStreamsPerCaller: config.SSE_MAX_STREAMS_PER_CALLER,
    longPolls: { max: config.DURABLE_STREAMS_MAX_LONG_POLLS, maxPerCaller: config.DURABLE_STREAMS_MAX_LONG_POLLS_PER_CALLER },
    longPollMs: config.DURABLE_STREAMS_LONG_POLL_MS,
    sseMaxMs: config.DURABLE_STREAMS_SSE_MAX_MS,
    retryMs: config.SSE_RETRY_MS,
    maxBufferedBytes: config.SSE_MAX_BUFFERED_BYTES,
    slowClientMs: config.SSE_SLOW_CLIENT_TIMEOUT_MS,
    wakeup: mode === 'off' || config.DATABASE_URL === undefined
      ? undefined
      : { mode, url: app.wakeupDatabaseUrl, connectTimeoutMs: config.DB_CONNECT_TIMEOUT_MS },
    keeper: app.keeperDatabaseUrl === undefined
      ? undefined
      : {
          url: app.keeperDatabaseUrl,
          keeperIntervalMs: config.EVENTS_KEEPER_INTERVAL_MS,
          retentionMs: config.EVENTS_RETENTION === undefined ? undefined : durationMs(config.EVENTS_RETENTION)
        },
    logger: app.log
  })
  app.decorate('events', events)
  app.addHook('onReady', async () => { events.start() })
  app.addHook('preClose', async () => { await events.stopReading() })
  app.addHook('onClose', async () => { await events.stopKeeper() })
}, { name: 'events', dependencies: ['db', 'shutdown'] })
