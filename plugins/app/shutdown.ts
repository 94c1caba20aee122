import fp from 'fastify-plugin'
import { shuttingDown } from '../../errors.ts'

/**
 * While the application closes, a request that still arrives on an open
 * keep-alive connection gets 503 `unavailable` (the envelope, not Fastify's
 * own 503 body), and the connection is closed so the client goes elsewhere;
 * so is the connection of a request in flight, once it is answered.
 * Plugins that end work at the close depend on this one, so that this
 * refusal begins before their preClose hooks: nothing new opens meanwhile.
 */
export default fp(async function shutdownPlugin (app) {
  let closing = false
  app.addHook('preClose', async () => { closing = true })
  app.addHook('onRequest', (_request, _reply, done) => {
    if (!closing) { done(); return }
    done(shuttingDown)
  })
  // Every answer while closing (the refusal above, and that of a request in
  // flight when the close began) closes its connection: Node closes only the
  // connections idle at that moment, and the close would otherwise wait for
  // a keep-alive client to hang up (up to Fastify's keepAliveTimeout, 72 s).
  app.addHook('onSend', (_request, reply, payload, done) => {
    if (closing) reply.header('connection', 'close')
    done(null, payload)
  })
}, { name: 'shutdown' })
