import fp from 'fastify-plugin'

declare module 'fastify' {
  interface FastifyReply {
    /**
     * Sends a body that is already JSON text (built by Postgres, see
     * db/json.ts), bypassing serialization: the route's response schema
     * still documents it, and the contract tests validate it.
     */
    sendRawJson (json: string): FastifyReply
  }
}

export default fp(async function rawJsonPlugin (app) {
  app.decorateReply('sendRawJson', function (this: import('fastify').FastifyReply, json: string) {
    return this.type('application/json; charset=utf-8').send(json)
  })
}, { name: 'raw-json' })
