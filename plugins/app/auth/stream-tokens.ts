import { errors, jwtVerify, SignJWT } from 'jose'
import { UnauthorizedError } from '../../../errors.ts'

/** What a stream token opens: the filters it was made for (none: every stream). */
export interface StreamScope {
  run_id?: string
  thread_id?: string
}

/** A stream token's `iss` and `aud`: no identity provider's (theirs are URLs), so the two never mix. */
export const STREAM_TOKEN_ISSUER = 'urn:ocp-api:stream-token'
const STREAM_TOKEN_AUDIENCE = 'urn:ocp-api:streams'

/**
 * Stream tokens (GET /api/stream-token): short-lived JWTs, signed by this
 * service (HS256, with a key every replica shares), that open only the
 * streams their scope covers. They are what a browser puts in an
 * EventSource's URL, which cannot carry a header: the long-lived
 * credential that asked for one never goes into a URL. They open nothing
 * once `exp` (their `expires_at`) has passed, by this service's clock.
 */
/** How far apart replicas' clocks may be: a token another replica signed may carry an iat this far ahead. */
const REPLICA_CLOCK_SKEW_S = 60

export class StreamTokens {
  private key: Promise<Uint8Array> | undefined

  private readonly loadSecret: () => Promise<string>
  private readonly ttlSeconds: number

  constructor (loadSecret: () => Promise<string>, ttlSeconds: number) {
    this.loadSecret = loadSecret
    this.ttlSeconds = ttlSeconds
  }

  /** The signing key, read once (again after a failure: the database may have been down). */
  private signingKey (): Promise<Uint8Array> {
    this.key ??= this.loadSecret().then((secret) => new TextEncoder().encode(secret), (error: unknown) => {
      this.key = undefined
      throw error
    })
    return this.key
  }

  /** A token for `scope`, naming `caller` (who asked: its `sub`), so that what it opens is counted and logged as theirs. */
  async sign (scope: StreamScope, caller?: string): Promise<{ token: string, expires_at: string, scope: StreamScope }> {
    const now = Math.floor(Date.now() / 1000)
    const expires = now + this.ttlSeconds
    const claims = new SignJWT({ stream: scope })
    if (caller !== undefined) claims.setSubject(caller)
    const token = await claims
      .setProtectedHeader({ alg: 'HS256', typ: 'JWT' })
      .setIssuer(STREAM_TOKEN_ISSUER)
      .setAudience(STREAM_TOKEN_AUDIENCE)
      .setIssuedAt(now)
      .setExpirationTime(expires)
      .sign(await this.signingKey())
    return { token, expires_at: new Date(expires * 1000).toISOString(), scope }
  }

  /** The scope of a valid stream token, and who asked for it; an UnauthorizedError saying what is wrong otherwise. */
  async verify (token: string): Promise<{ scope: StreamScope, caller: string | undefined }> {
    try {
      const { payload } = await jwtVerify<{ stream?: StreamScope }>(token, await this.signingKey(), {
        issuer: STREAM_TOKEN_ISSUER,
        audience: STREAM_TOKEN_AUDIENCE,
        algorithms: ['HS256'],
        // Our clock decides its end: no tolerance past exp (AUTH_CLOCK_TOLERANCE_S is for other issuers' clocks).
        requiredClaims: ['exp', 'iat']
      })
      // Whatever its exp says (a token forged with the key, or signed by a replica with a longer TTL): never older
      // than the TTL. Its iat may be a little ahead of this clock (another replica's, a second boundary apart), no more.
      const age = Math.floor(Date.now() / 1000) - payload.iat!
      if (age > this.ttlSeconds) throw new UnauthorizedError('the stream token has expired: get a new one from GET /api/stream-token', true)
      if (age < -REPLICA_CLOCK_SKEW_S) throw new UnauthorizedError('the stream token was issued in the future', true)
      const scope = payload.stream
      if (typeof scope !== 'object' || scope === null) throw new UnauthorizedError('the stream token names no scope', true)
      return { scope, caller: payload.sub }
    } catch (error) {
      if (error instanceof errors.JWTExpired) throw new UnauthorizedError('the stream token has expired: get a new one from GET /api/stream-token', true)
      if (error instanceof errors.JOSEError) {
        throw new UnauthorizedError('the stream token is not valid (its signature does not verify, or it is malformed)', true)
      }
      throw error
    }
  }
}

/** Whether a token of `scope` opens a stream with these filters: each filter the scope names must be the stream's own. */
export function scopeCovers (scope: StreamScope, filter: StreamScope): boolean {
  return (scope.run_id === undefined || scope.run_id === filter.run_id) &&
    (scope.thread_id === undefined || scope.thread_id === filter.thread_id)
}

/** A query parameter's filter value for a scope check (a parameter given twice matches no scope). */
const filterValue = (value: unknown) => typeof value === 'string' ? value : value === undefined ? undefined : '\u0000'

/** The filters a stream's query parameters give (run_id, thread_id: /api/events/stream), as a scope. */
export function queryScope (query: unknown): StreamScope {
  const { run_id: runId, thread_id: threadId } = query as Record<string, unknown>
  return { run_id: filterValue(runId), thread_id: filterValue(threadId) }
}
