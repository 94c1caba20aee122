import type { FastifyReply } from 'fastify'
import fp from 'fastify-plugin'

declare module 'fastify' {
  interface FastifyReply {
    /**
     * Sends a read's body with the stream position it was read at, in
     * X-Event-Cursor (docs/reference.md, "The event stream"): subscribe with
     * after_event_id=<X-Event-Cursor> and nothing between is missed.
     * Cached as state (plugins/app/http-cache.ts).
     */
    sendRead (read: { body: string, eventCursor: string }): FastifyReply
  }
}

export default fp(async function rawJsonPlugin (app) {
  app.decorateReply('sendRead', function (this: FastifyReply, read: { body: string, eventCursor: string }) {
    return this.header('x-event-cursor', read.eventCursor).sendCacheable(read.body, 'state')
  })
}, { name: 'raw-json', dependencies: ['http-cache'] })
