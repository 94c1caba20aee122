import { fastifySSE } from '@fastify/sse'
import fp from 'fastify-plugin'
import { EventHub } from './hub.js'
import { WalWakeup } from './wakeup.js'

declare module 'fastify' {
  interface FastifyInstance {
    /** The process's one event poller, its subscribers, and the opening of every stream (plugins/app/events/hub.ts). */
    events: EventHub
    /** What wakes the poller between polls (plugins/app/events/wakeup.ts); undefined when it only polls. */
    eventWakeup: WalWakeup | undefined
  }
}

/**
 * The event stream's machinery: @fastify/sse for the connection's life
 * (headers, Last-Event-ID, freeing a client the moment its response
 * closes), one EventHub polling the events table for all streams, and
 * what wakes it when something commits (EVENTS_WAKEUP; never on the
 * embedded database, which only polls).
 */
export default fp(async function eventsPlugin (app) {
  // No heartbeat of @fastify/sse, for every route (the one place it is
  // turned off): the hub's keep-alive, which also moves a filtered stream's
  // cursor, is the only one (SSE_KEEPALIVE_MS).
  await app.register(fastifySSE, { heartbeatInterval: 0 })
  const hub = new EventHub(app.db, {
    pollIntervalMs: app.config.EVENTS_POLL_INTERVAL_MS,
    wakeupPollIntervalMs: app.config.EVENTS_WAKEUP_POLL_INTERVAL_MS,
    keepAliveMs: app.config.SSE_KEEPALIVE_MS,
    windowBytes: app.config.EVENTS_WINDOW_BYTES,
    maxStreams: app.config.SSE_MAX_STREAMS,
    retryMs: app.config.SSE_RETRY_MS,
    maxBufferedBytes: app.config.SSE_MAX_BUFFERED_BYTES,
    slowClientMs: app.config.SSE_SLOW_CLIENT_TIMEOUT_MS,
    log: app.log.child({ component: 'event-hub' })
  })
  const mode = app.config.EVENTS_WAKEUP
  const wakeup = mode === 'off' || app.config.DATABASE_URL === undefined
    ? undefined
    : new WalWakeup({
      url: app.readDatabaseUrl,
      mode,
      connectTimeoutMs: app.config.DB_CONNECT_TIMEOUT_MS,
      log: app.log.child({ component: 'event-wakeup' }),
      onWake: () => { hub.wake() },
      onLive: (live) => {
        hub.wakeupLive = live
        // Lost: poll now, and at the faster interval from then on.
        if (!live) hub.wake()
      }
    })
  app.decorate('events', hub)
  app.decorate('eventWakeup', wakeup)
  app.addHook('onReady', async () => {
    hub.start()
    wakeup?.start()
  })
  // Before the server stops accepting: end every stream so that clients
  // reconnect (elsewhere) and the close does not wait on them.
  app.addHook('preClose', async () => {
    hub.stop()
    await wakeup?.stop()
  })
}, { name: 'events', dependencies: ['db'] })
