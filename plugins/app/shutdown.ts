import fp from 'fastify-plugin'
import { ApiError } from '../../errors.js'

/**
 * While the application closes, a request that still arrives on an open
 * keep-alive connection gets 503 `unavailable` (the envelope, not Fastify's
 * own 503 body), and the connection is closed so the client goes elsewhere.
 */
export default fp(async function shutdownPlugin (app) {
  let closing = false
  app.addHook('preClose', async () => { closing = true })
  const goingAway = new ApiError('unavailable', 'the service is shutting down, retry on another instance')
  app.addHook('onRequest', (_request, reply, done) => {
    if (!closing) { done(); return }
    reply.header('connection', 'close')
    done(goingAway)
  })
}, { name: 'shutdown' })
