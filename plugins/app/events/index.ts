import { fastifySSE } from '@fastify/sse'
import fp from 'fastify-plugin'
import { EventHub } from './hub.js'

declare module 'fastify' {
  interface FastifyInstance {
    /** The process's one event poller and its subscribers (plugins/events/hub.ts). */
    events: EventHub
  }
}

/**
 * The event stream's machinery: @fastify/sse for the connection's life
 * (headers, Last-Event-ID, freeing a client the moment its response
 * closes), and one EventHub polling the events table for all streams.
 */
export default fp(async function eventsPlugin (app) {
  await app.register(fastifySSE, { heartbeatInterval: 0 })
  const hub = new EventHub(app.db, {
    pollIntervalMs: app.config.EVENTS_POLL_INTERVAL_MS,
    keepAliveMs: app.config.SSE_KEEPALIVE_MS,
    log: app.log.child({ component: 'event-hub' })
  })
  app.decorate('events', hub)
  app.addHook('onReady', async () => { hub.start() })
  // Before the server stops accepting: end every stream so that clients
  // reconnect (elsewhere) and the close does not wait on them.
  app.addHook('preClose', async () => { hub.stop() })
}, { name: 'events', dependencies: ['db'] })
