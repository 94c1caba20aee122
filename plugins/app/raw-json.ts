import type { FastifyReply } from 'fastify'
import fp from 'fastify-plugin'

declare module 'fastify' {
  interface FastifyReply {
    /**
     * Sends a body that is already JSON text (built by Postgres, see
     * db/json.ts), bypassing serialization: the route's response schema
     * still documents it, and the contract tests validate it.
     */
    sendRawJson (json: string): FastifyReply
    /**
     * Sends a read's body with the stream position it was read at, in
     * X-Event-Cursor (CONTRACT section 5): subscribe with
     * after_event_id=<X-Event-Cursor> and nothing between is missed.
     */
    sendRead (read: { body: string, eventCursor: string }): FastifyReply
  }
}

export default fp(async function rawJsonPlugin (app) {
  app.decorateReply('sendRawJson', function (this: FastifyReply, json: string) {
    return this.type('application/json; charset=utf-8').send(json)
  })
  app.decorateReply('sendRead', function (this: FastifyReply, read: { body: string, eventCursor: string }) {
    return this.header('x-event-cursor', read.eventCursor).sendRawJson(read.body)
  })
}, { name: 'raw-json' })
