import type { FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { createHash, timingSafeEqual } from 'node:crypto'
import { listOf } from '../../config.js'
import { ApiError } from '../../errors.js'

const digest = (token: string) => createHash('sha256').update(token).digest()

/** The route whose clients cannot send headers (a browser EventSource): it also takes ?access_token=. */
const QUERY_TOKEN_ROUTE = '/api/events/stream'

const isProtected = (route: string | undefined) => route !== undefined && (route.startsWith('/api/') || route === '/metrics')

function presentedToken (request: FastifyRequest): string | undefined {
  const header = request.headers.authorization
  if (header !== undefined) {
    const match = /^Bearer[ ]+(\S+)\s*$/i.exec(header)
    return match?.[1]
  }
  if (request.routeOptions.url === QUERY_TOKEN_ROUTE) {
    const token = (request.query as { access_token?: unknown }).access_token
    return typeof token === 'string' && token !== '' ? token : undefined
  }
  return undefined
}

/**
 * Optional bearer-token authentication, off unless API_TOKENS lists tokens
 * (comma-separated). Then every /api route and /metrics need one of them;
 * /health, /ready and the docs stay open. Tokens are compared through
 * their SHA-256 digests in constant time, against every configured token.
 */
export default fp(async function authPlugin (app) {
  const accepted = listOf(app.config.API_TOKENS).map(digest)
  if (accepted.length === 0) return
  const unauthorized = new ApiError('unauthorized', 'a valid bearer token is required')
  app.addHook('onRequest', async (request, reply) => {
    // A CORS preflight carries no credentials by design.
    if (request.method === 'OPTIONS' || !isProtected(request.routeOptions.url)) return
    const token = presentedToken(request)
    let valid = false
    if (token !== undefined) {
      const presented = digest(token)
      for (const candidate of accepted) valid = timingSafeEqual(presented, candidate) || valid
    }
    if (!valid) {
      reply.header('www-authenticate', 'Bearer realm="ocp-api"')
      throw unauthorized
    }
  })
}, { name: 'auth', decorators: { fastify: ['config'] } })
