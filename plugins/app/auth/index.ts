import type { FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { decodeJwt } from 'jose'
import { sql } from 'kysely'
import { authenticationOn, issuersOf, listOf } from '../../../config.ts'
import { badRequest, UnauthorizedError } from '../../../errors.ts'
import { JwtIssuers, type JwtIdentity } from './jwt-issuers.ts'
import { namedTokens, StaticTokens } from './static-tokens.ts'
import { scopeCovers, STREAM_TOKEN_ISSUER, StreamTokens, type StreamScope } from './stream-tokens.ts'

/** Who a request proved to be, when authentication is on. */
export type Principal =
  | { kind: 'static', name: string }
  | ({ kind: 'jwt' } & JwtIdentity)
  | { kind: 'stream', scope: StreamScope, caller: string | undefined }

/**
 * Who is calling, as the logs name it and the limits per caller count it:
 * a static token by its name (`token ci`), a JWT by its issuer and subject
 * (`https://issuer sub`), a stream token as whoever asked for it.
 */
export function callerOf (principal: Principal): string {
  if (principal.kind === 'static') return `token ${principal.name}`
  if (principal.kind === 'jwt') return `${principal.issuer} ${principal.subject ?? ''}`.trimEnd()
  /* c8 ignore next: a stream token made before tokens named their caller (they live minutes), or by hand with STREAM_TOKEN_SECRET */
  return principal.caller ?? 'stream token'
}

/**
 * Who a request is as the limits per caller count it (docs/operating.md,
 * "Limits per caller"): its principal (callerOf), or, with authentication
 * off, its client's address (X-Forwarded-For believed only from
 * TRUSTED_PROXIES).
 */
export const requestCaller = (request: FastifyRequest): string => request.principal === undefined ? request.ip : callerOf(request.principal)

declare module 'fastify' {
  interface FastifyInstance {
    /** Signs the stream tokens of GET /api/stream-token. */
    streamTokens: StreamTokens
    /** The identity providers whose tokens are accepted (AUTH_ISSUERS). */
    jwtIssuers: JwtIssuers
  }
  interface FastifyRequest {
    /** Who the request proved to be; undefined when authentication is off, or the route is open. */
    principal: Principal | undefined
  }
  interface FastifyContextConfig {
    /**
     * A stream route's filters, as a stream token's scope must cover them:
     * such a route takes a stream token (`stream_token`, or the header).
     */
    streamScope?: (request: FastifyRequest) => StreamScope
    /** Open even when authentication is on (GET /api/auth: how to sign in). */
    public?: boolean
  }
}

const isProtected = (request: FastifyRequest) => {
  const route = request.routeOptions.url
  return route !== undefined && (route.startsWith('/api/') || route === '/metrics') && request.routeOptions.config.public !== true
}

/** A query parameter given once, as a string; twice or more is no credential. */
function queryValue (request: FastifyRequest, name: string): string | undefined {
  const value = (request.query as Record<string, unknown> | undefined)?.[name]
  return typeof value === 'string' && value !== '' ? value : undefined
}

/** How many Authorization headers a request carries (Node's `headers` keeps only the first). */
function authorizationHeaders (request: FastifyRequest): number {
  const raw = request.raw.rawHeaders
  let count = 0
  for (let i = 0; i < raw.length; i += 2) if (raw[i]!.toLowerCase() === 'authorization') count++
  return count
}

/**
 * Authentication, off unless API_TOKENS or AUTH_ISSUERS is set. Then every
 * /api route (but GET /api/auth and /api/auth/sign-out) and /metrics need a token in the
 * Authorization header: one of API_TOKENS, or a JWT of an identity
 * provider of AUTH_ISSUERS. The stream routes also take a stream token
 * (GET /api/stream-token) whose scope covers them, in the header or as
 * `stream_token` in the URL; a long-lived token in a URL (`access_token`)
 * is refused unless AUTH_ALLOW_TOKEN_IN_URL says otherwise. /health,
 * /ready, the docs and the UI's files stay open. docs/authentication.md.
 */
export default fp(async function authPlugin (app) {
  const config = app.config
  const staticTokens = new StaticTokens(namedTokens(listOf(config.API_TOKENS)))
  const issuers = new JwtIssuers(issuersOf(config), config.AUTH_CLOCK_TOLERANCE_S)
  const secret = config.STREAM_TOKEN_SECRET
  const streamTokens = new StreamTokens(
    async () => secret ?? (await sql<{ secret: string }>`select stream_token_key() as secret`.execute(app.db)).rows[0]!.secret,
    config.STREAM_TOKEN_TTL_S
  )
  app.decorate('streamTokens', streamTokens)
  app.decorate('jwtIssuers', issuers)
  app.decorateRequest('principal', undefined)
  if (!authenticationOn(config)) return
  issuers.warmUp()

  async function authenticate (request: FastifyRequest): Promise<Principal> {
    const streamScope = request.routeOptions.config.streamScope
    const header = request.headers.authorization
    let token: string | undefined
    let fromStreamParameter = false
    if (header !== undefined) {
      // Node reads the first of two, a proxy in front may read the last: they would disagree on who calls.
      if (authorizationHeaders(request) > 1) throw badRequest('the request carries two Authorization headers: send one')
      token = /^Bearer[ ]+(\S+)\s*$/i.exec(header)?.[1]
      if (token === undefined) throw new UnauthorizedError('the Authorization header must be Bearer and a token', true)
    } else if (streamScope !== undefined && (token = queryValue(request, 'stream_token')) !== undefined) {
      fromStreamParameter = true
    } else if (streamScope !== undefined && (token = queryValue(request, 'access_token')) !== undefined) {
      if (!config.AUTH_ALLOW_TOKEN_IN_URL) {
        throw new UnauthorizedError('a long-lived token in the URL (access_token) is refused: send it in the Authorization header, or open the ' +
          'stream with a stream token (GET /api/stream-token) as stream_token', true)
      }
    } else {
      throw new UnauthorizedError('a bearer token is required', false)
    }
    const name = fromStreamParameter ? undefined : staticTokens.matches(token)
    if (name !== undefined) return { kind: 'static', name }
    // A client's next requests with a token already verified: a lookup, not a decoding.
    const remembered = fromStreamParameter ? undefined : issuers.remembered(token)
    if (remembered !== undefined) return { kind: 'jwt', ...remembered }
    let iss: unknown
    try {
      iss = decodeJwt(token).iss
    } catch {
      throw new UnauthorizedError(fromStreamParameter
        ? 'stream_token is not a stream token (get one from GET /api/stream-token)'
        : 'the token is not one this service accepts', true)
    }
    if (iss === STREAM_TOKEN_ISSUER) {
      if (streamScope === undefined) throw new UnauthorizedError('a stream token opens only the stream routes it was made for', true)
      const { scope, caller } = await streamTokens.verify(token)
      if (!scopeCovers(scope, streamScope(request))) throw new UnauthorizedError('the stream token is for another stream', true)
      return { kind: 'stream', scope, caller }
    }
    if (fromStreamParameter) throw new UnauthorizedError('stream_token is not a stream token (get one from GET /api/stream-token)', true)
    if (typeof iss !== 'string' || !issuers.has(iss)) throw new UnauthorizedError('the token\'s issuer is not accepted', true)
    return { kind: 'jwt', ...await issuers.verify(token, iss) }
  }

  app.addHook('onRequest', async (request, reply) => {
    // A CORS preflight carries no credentials by design.
    if (request.method === 'OPTIONS' || !isProtected(request)) return
    try {
      request.principal = await authenticate(request)
    } catch (error) {
      if (error instanceof UnauthorizedError) reply.header('www-authenticate', error.challenge)
      throw error
    }
  })
}, { name: 'auth', dependencies: ['db'], decorators: { fastify: ['config'] } })
