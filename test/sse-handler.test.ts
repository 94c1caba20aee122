import Fastify, { type FastifyRequest } from 'fastify'
import t from 'tap'
import { registerSse } from '../plugins/app/events.ts'

// @fastify/sse wraps the handler of a route that may stream; one that
// streams for some requests only (config.eventStream) runs its own handler
// for the others, with no SSE context (plugins/app/events.ts).

t.test('a route that streams only when asked runs the wrapper for those requests alone', async (t) => {
  const app = Fastify()
  t.teardown(() => app.close())
  await registerSse(app)
  const streams = (request: FastifyRequest) => (request.query as { live?: string }).live === 'sse'
  const handler = async (request: FastifyRequest, reply: { sse?: unknown }) => ({ context: reply.sse !== undefined && reply.sse !== null })
  app.get('/sometimes', { sse: { kind: 'manual' }, config: { eventStream: streams } }, handler)
  app.get('/always', { sse: { kind: 'manual' } }, handler)
  app.get('/never', handler)
  const context = async (url: string) => (await app.inject({ url })).json<{ context: boolean }>().context
  t.equal(await context('/sometimes'), false, 'a request that does not stream: the declared handler')
  t.equal(await context('/sometimes?live=sse'), true, 'one that does: the wrapper\'s context')
  t.equal(await context('/always'), true, 'a route that says nothing: always wrapped')
  t.equal(await context('/never'), false)
})
