import { fastifySSE } from '@fastify/sse'
import fp from 'fastify-plugin'
import { durationMs } from '../../config.js'
import { EventLog } from '../../events/index.js'

declare module 'fastify' {
  interface FastifyInstance {
    /** The process's event log (events/): its hub, streams, Durable Streams reads, wake-up and upkeep. */
    events: EventLog
  }
}

/**
 * The event log (events/) as the application uses it: @fastify/sse for a
 * stream's connection (headers, Last-Event-ID, freeing a client the moment
 * its response closes), the log started when the server is ready, its
 * streams ended as the server stops accepting (so that clients reconnect
 * elsewhere and the close does not wait on them), its upkeep stopped last.
 * The wake-up runs unless EVENTS_WAKEUP=off or on the embedded database
 * (which only polls); the upkeep where this service may write
 * (plugins/app/db.ts says where).
 */
export default fp(async function eventsPlugin (app) {
  const { config } = app
  // No heartbeat of @fastify/sse, for every route (the one place it is
  // turned off): the event log's keep-alive, which also moves a filtered
  // stream's cursor, is the only one (SSE_KEEPALIVE_MS).
  await app.register(fastifySSE, { heartbeatInterval: 0 })
  const mode = config.EVENTS_WAKEUP
  const events = new EventLog(app.db, {
    pollIntervalMs: config.EVENTS_POLL_INTERVAL_MS,
    wakeupPollIntervalMs: config.EVENTS_WAKEUP_POLL_INTERVAL_MS,
    windowBytes: config.EVENTS_WINDOW_BYTES,
    keepAliveMs: config.SSE_KEEPALIVE_MS,
    maxStreams: config.SSE_MAX_STREAMS,
    maxStreamsPerCaller: config.SSE_MAX_STREAMS_PER_CALLER,
    longPolls: { max: config.STREAMS_MAX_LONG_POLLS, maxPerCaller: config.STREAMS_MAX_LONG_POLLS_PER_CALLER },
    retryMs: config.SSE_RETRY_MS,
    maxBufferedBytes: config.SSE_MAX_BUFFERED_BYTES,
    slowClientMs: config.SSE_SLOW_CLIENT_TIMEOUT_MS,
    wakeup: mode === 'off' || config.DATABASE_URL === undefined ? undefined : { mode, url: app.readDatabaseUrl, connectTimeoutMs: config.DB_CONNECT_TIMEOUT_MS },
    upkeep: app.upkeepDatabaseUrl === undefined
      ? undefined
      : { url: app.upkeepDatabaseUrl, clockIntervalMs: config.EVENTS_CLOCK_INTERVAL_MS, retentionMs: config.EVENTS_RETENTION === undefined ? undefined : durationMs(config.EVENTS_RETENTION) },
    log: app.log
  })
  app.decorate('events', events)
  app.addHook('onReady', async () => { events.start() })
  app.addHook('preClose', async () => { await events.stopReading() })
  app.addHook('onClose', async () => { await events.stopUpkeep() })
}, { name: 'events', dependencies: ['db', 'shutdown'] })
