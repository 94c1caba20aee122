import { createRemoteJWKSet, errors, jwksCache, jwtVerify, type ExportedJWKSCache, type JWKSCacheInput, type JWTPayload } from 'jose'
import type { IssuerConfig } from '../../../config.ts'
import { identityProviderUnavailable, UnauthorizedError } from '../../../errors.ts'

/** What a caller proved with an identity provider's token. */
export interface JwtIdentity {
  issuer: string
  subject: string | undefined
  /** When the token stops being accepted (seconds since the epoch). */
  expires: number
}

/** The algorithms accepted when an issuer's entry names none: the two every provider offers. */
const DEFAULT_ALGORITHMS = ['RS256', 'ES256']
/** How long a request waits on the provider for its discovery document or keys. */
const FETCH_TIMEOUT_MS = 5000
/** The least time between two fetches of an issuer's keys for a key id it did not list (jose's cooldown). */
const JWKS_COOLDOWN_MS = 30_000
/**
 * How long a verdict on a token is remembered at most, and how old an
 * issuer's keys may be when a token is checked (they are fetched again
 * then): a key its issuer removed stops opening anything within this.
 */
const REMEMBER_MS = 5 * 60_000
/** After a failed discovery, the next request tries again only this much later (the provider is not hammered). */
const DISCOVERY_RETRY_MS = 10_000
/** Tokens verified and kept, so that a client's every request does not check a signature again. */
const MAX_VERIFIED = 10_000

/** The waits and bounds above, which tests shorten. */
export interface IssuerTuning {
  jwksCooldownMs?: number
  discoveryRetryMs?: number
  maxVerified?: number
  rememberMs?: number
}

/** A token verified: who it proves, when, and the key that verified it (its id, in the keys as then fetched). */
interface Verdict { identity: JwtIdentity, at: number, issuer: Issuer, kid: string | undefined, keysFetchedAt: number | undefined }

interface Discovery { jwks_uri: string, authorization_endpoint?: string, token_endpoint?: string }

/** One configured identity provider: its discovery, its keys (kept and refreshed by jose), its rules. */
class Issuer {
  private discovery: { promise: Promise<Discovery>, failedAt?: number } | undefined
  private keys: ReturnType<typeof createRemoteJWKSet> | undefined
  /** The keys as jose last fetched them, and when (jose writes it). */
  private readonly fetchedKeys: JWKSCacheInput = {}
  /** Their key ids, and the fetch they are of, for the remembered verdicts' check. */
  private kidsOf: number | undefined
  private kids = new Set<string | undefined>()
  readonly audience: string[]
  readonly algorithms: string[]
  readonly config: IssuerConfig
  private readonly tuning: Required<IssuerTuning>

  constructor (config: IssuerConfig, tuning: Required<IssuerTuning>) {
    this.config = config
    this.tuning = tuning
    this.audience = Array.isArray(config.audience) ? config.audience : [config.audience]
    this.algorithms = config.algorithms ?? DEFAULT_ALGORITHMS
  }

  /** The discovery document (or jwks_uri alone when configured), fetched once, again after a failure. */
  discover (): Promise<Discovery> {
    const { config } = this
    if (this.discovery?.failedAt !== undefined && Date.now() - this.discovery.failedAt >= this.tuning.discoveryRetryMs) this.discovery = undefined
    if (this.discovery === undefined) {
      const current: { promise: Promise<Discovery>, failedAt?: number } = {
        promise: config.jwks_uri !== undefined && config.ui_client_id === undefined
          ? Promise.resolve({ jwks_uri: config.jwks_uri })
          : fetchDiscovery(config.issuer).then((document) => ({ ...document, jwks_uri: config.jwks_uri ?? document.jwks_uri }))
      }
      current.promise.catch(() => { current.failedAt = Date.now() })
      this.discovery = current
    }
    return this.discovery.promise
  }

  async keySet (): Promise<ReturnType<typeof createRemoteJWKSet>> {
    if (this.keys === undefined) {
      const { jwks_uri: jwksUri } = await this.discover()
      this.keys ??= createRemoteJWKSet(new URL(jwksUri), {
        timeoutDuration: FETCH_TIMEOUT_MS, cooldownDuration: this.tuning.jwksCooldownMs, cacheMaxAge: this.tuning.rememberMs, [jwksCache]: this.fetchedKeys
      })
    }
    return this.keys
  }

  /** Whether the keys as last fetched still list `kid` (a token without one: only if they were not fetched again since `fetchedAt`). */
  publishes (kid: string | undefined, fetchedAt: number | undefined): boolean {
    const { uat, jwks } = this.fetchedKeys as Partial<ExportedJWKSCache>
    if (uat === fetchedAt) return true
    if (uat !== this.kidsOf) {
      this.kidsOf = uat
      this.kids = new Set(jwks!.keys.map((key) => key.kid))
    }
    return kid !== undefined && this.kids.has(kid)
  }

  /** When the keys were last fetched, to tell later whether they were fetched again. */
  fetchedAt (): number | undefined {
    return (this.fetchedKeys as Partial<ExportedJWKSCache>).uat
  }
}

async function fetchDiscovery (issuer: string): Promise<Discovery> {
  const url = `${issuer.replace(/\/+$/, '')}/.well-known/openid-configuration`
  const response = await fetch(url, { signal: AbortSignal.timeout(FETCH_TIMEOUT_MS), headers: { accept: 'application/json' } })
  if (!response.ok) throw new Error(`${url} answered ${response.status}`)
  const document = await response.json() as Record<string, unknown>
  // OpenID Connect Discovery 1.0, section 4.3: the document must name the issuer it was fetched for.
  if (document.issuer !== issuer) throw new Error(`${url} names the issuer ${String(document.issuer)}`)
  if (typeof document.jwks_uri !== 'string') throw new Error(`${url} names no jwks_uri`)
  return document as unknown as Discovery
}

/** Why jose refused a token, in the words a client reads. */
function refusal (error: unknown): UnauthorizedError | undefined {
  if (error instanceof errors.JWTExpired) return new UnauthorizedError('the token has expired', true)
  if (error instanceof errors.JWTClaimValidationFailed) {
    // The claims jose checks with the options given (iss picked the issuer: it matches).
    const what: Record<string, string> = { aud: 'the token\'s audience is not accepted', nbf: 'the token is not valid yet', exp: 'the token has no expiry' }
    /* c8 ignore next: jose checks no other claim with these options */
    return new UnauthorizedError(what[error.claim] ?? `the token's ${error.claim} claim is not accepted`, true)
  }
  if (error instanceof errors.JOSEAlgNotAllowed) return new UnauthorizedError('the token\'s signature algorithm is not accepted', true)
  if (error instanceof errors.JWKSNoMatchingKey) return new UnauthorizedError('the token is signed with a key its issuer does not publish', true)
  if (error instanceof errors.JWSSignatureVerificationFailed) return new UnauthorizedError('the token\'s signature does not verify', true)
  if (error instanceof errors.JWSInvalid || error instanceof errors.JWTInvalid ||
    error instanceof errors.JOSENotSupported || error instanceof errors.JWKSMultipleMatchingKeys) {
    return new UnauthorizedError('the token is malformed', true)
  }
  return undefined
}

/**
 * AUTH_ISSUERS: JWTs from identity providers, verified with jose. An
 * issuer's keys come from its JWKS (by discovery, or its jwks_uri), kept
 * and refetched by jose on an unknown key id (at most once every 30 s) and
 * every 5 minutes; exp, nbf, iss and aud are enforced with
 * AUTH_CLOCK_TOLERANCE_S of skew, and an `iat` further in the future is
 * refused; an issuer's `claims` must all match. A verified token is
 * remembered (at most 10,000) until it expires, for 5 minutes at most, and
 * only while its issuer's keys, when fetched again, still list its key id:
 * a client's next requests cost a lookup rather than a signature check,
 * and a key the issuer withdrew stops opening anything.
 */
export class JwtIssuers {
  private readonly issuers: Map<string, Issuer>
  private readonly verified = new Map<string, Verdict>()
  private readonly maxVerified: number
  private readonly rememberMs: number
  private readonly clockToleranceSeconds: number

  constructor (configs: IssuerConfig[], clockToleranceSeconds: number, tuning: IssuerTuning = {}) {
    this.clockToleranceSeconds = clockToleranceSeconds
    const tuned = { jwksCooldownMs: JWKS_COOLDOWN_MS, discoveryRetryMs: DISCOVERY_RETRY_MS, maxVerified: MAX_VERIFIED, rememberMs: REMEMBER_MS, ...tuning }
    this.maxVerified = tuned.maxVerified
    this.rememberMs = tuned.rememberMs
    this.issuers = new Map(configs.map((config) => [config.issuer, new Issuer(config, tuned)]))
  }

  has (issuer: string): boolean {
    return this.issuers.has(issuer)
  }

  /** Starts every issuer's discovery, so that the first token does not wait for it (a failure is retried by that token). */
  warmUp (): void {
    for (const issuer of this.issuers.values()) issuer.discover().catch(() => {})
  }

  /**
   * The identity of a token verified before, without decoding it again
   * (undefined when it was not, or must be checked again: remembered too
   * long, or its key gone from its issuer's keys); an UnauthorizedError
   * once it has expired.
   */
  remembered (token: string): JwtIdentity | undefined {
    const kept = this.verified.get(token)
    if (kept === undefined) return undefined
    const now = Date.now()
    if (kept.identity.expires + this.clockToleranceSeconds <= now / 1000) {
      this.verified.delete(token)
      throw new UnauthorizedError('the token has expired', true)
    }
    if (now - kept.at < this.rememberMs && kept.issuer.publishes(kept.kid, kept.keysFetchedAt)) return kept.identity
    this.verified.delete(token)
    return undefined
  }

  /** The identity a token of `iss` proves; an UnauthorizedError or a 503 (provider unreachable) otherwise. */
  async verify (token: string, iss: string): Promise<JwtIdentity> {
    const kept = this.remembered(token)
    if (kept !== undefined) return kept
    const issuer = this.issuers.get(iss)!
    let payload: JWTPayload
    let kid: string | undefined
    try {
      const keys = await issuer.keySet()
      ;({ payload, protectedHeader: { kid } } = await jwtVerify(token, keys, {
        issuer: iss,
        audience: issuer.audience,
        algorithms: issuer.algorithms,
        requiredClaims: ['exp'],
        clockTolerance: this.clockToleranceSeconds
      }))
    } catch (error) {
      const refused = refusal(error)
      if (refused !== undefined) throw refused
      // The keys or the discovery could not be fetched: nothing says the token is bad.
      throw identityProviderUnavailable(iss)
    }
    // jose checks `iat` only against a maximum age, which issuers' tokens have none of.
    if (payload.iat !== undefined && payload.iat > Date.now() / 1000 + this.clockToleranceSeconds) {
      throw new UnauthorizedError('the token was issued in the future', true)
    }
    for (const [claim, allowed] of Object.entries(issuer.config.claims ?? {})) {
      const value = payload[claim]
      if (typeof value !== 'string' || !(Array.isArray(allowed) ? allowed.includes(value) : allowed === value)) {
        throw new UnauthorizedError(`the token's ${claim} claim is not one this service accepts`, true)
      }
    }
    const identity: JwtIdentity = { issuer: iss, subject: payload.sub, expires: payload.exp! }
    if (this.verified.size >= this.maxVerified) this.verified.delete(this.verified.keys().next().value!)
    this.verified.set(token, { identity, at: Date.now(), issuer, kid, keysFetchedAt: issuer.fetchedAt() })
    return identity
  }

  /** The issuer the web UI signs in with (the first with a ui_client_id), its endpoints from discovery. */
  async signIn (): Promise<{ issuer: string, authorization_endpoint: string, token_endpoint: string, client_id: string, scope: string } | null> {
    const issuer = [...this.issuers.values()].find((candidate) => candidate.config.ui_client_id !== undefined)
    if (issuer === undefined) return null
    let document: Discovery
    try {
      document = await issuer.discover()
    } catch {
      throw identityProviderUnavailable(issuer.config.issuer)
    }
    if (document.authorization_endpoint === undefined || document.token_endpoint === undefined) return null
    return {
      issuer: issuer.config.issuer,
      authorization_endpoint: document.authorization_endpoint,
      token_endpoint: document.token_endpoint,
      client_id: issuer.config.ui_client_id!,
      scope: 'openid'
    }
  }
}
