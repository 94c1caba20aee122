import { exportJWK, generateKeyPair, SignJWT, type CryptoKey, type JWK, type JWTPayload } from 'jose'
import { randomBytes } from 'node:crypto'
import { createServer, type IncomingMessage } from 'node:http'

/**
 * A local OpenID Connect issuer for the tests (no network): discovery, a
 * JWKS with the current key (and the previous one until it is dropped), a
 * sign-in (authorization code with PKCE, answered at once for `user`) and
 * its token endpoint, and a way to sign any token, good or bad.
 */
export interface TestIssuer {
  /** The issuer identifier, as the tokens' `iss` and the discovery document say. */
  url: string
  /** Signs `claims` with the current key (by default: this issuer, `audience`, 5 minutes). */
  sign: (claims?: JWTPayload, options?: SignOptions) => Promise<string>
  /** A new current key; the old one stays in the JWKS unless `drop`. */
  rotate: (options?: { drop?: boolean }) => Promise<void>
  /** How many times the JWKS was fetched. */
  jwksFetches: () => number
  /** Holds the JWKS's answers (a slow identity provider) until the function returned is called. */
  holdKeys: () => () => void
  /** The claims the sign-in puts in its tokens (change them to test refusals). */
  user: JWTPayload
  /** Set: the discovery document answers 503. */
  unavailable: boolean
  /** Fields of the discovery document replaced (a field set to null is left out). */
  discovery: Record<string, unknown>
}

export interface SignOptions {
  /** Seconds from now; negative for a token already expired. */
  expiresIn?: number
  /** Seconds from now before which the token is not valid. */
  notBefore?: number
  /** Signs with a key the JWKS never published (same kid). */
  unknownKey?: boolean
  /** A kid the JWKS does not list. */
  kid?: string
  /** Without `exp`. */
  noExpiry?: boolean
  /** Without `kid` (the verifier picks the key by its algorithm). */
  noKid?: boolean
}

export const TEST_AUDIENCE = 'ocp-api'

interface KeyPair { kid: string, privateKey: CryptoKey, jwk: JWK }

async function newKey (kid = randomBytes(6).toString('hex')): Promise<KeyPair> {
  const { privateKey, publicKey } = await generateKeyPair('RS256', { extractable: true })
  return { kid, privateKey, jwk: { ...await exportJWK(publicKey), kid, alg: 'RS256', use: 'sig' } }
}

async function body (request: IncomingMessage): Promise<string> {
  let text = ''
  for await (const chunk of request) text += chunk
  return text
}

/** `t`: what closes the issuer when done (a tap Test; a benchmark passes its own). */
export async function startIssuer (t: { teardown: (fn: () => void) => void }, options: { path?: string } = {}): Promise<TestIssuer> {
  let keys = [await newKey()]
  let fetches = 0
  let keysHeld: Promise<void> | undefined
  const codes = new Map<string, { challenge: string, clientId: string, redirect: string, nonce: string | null }>()
  const user: JWTPayload = { sub: 'ada', email: 'ada@example.com' }
  const state = { unavailable: false, discovery: {} as Record<string, unknown> }
  const server = createServer((request, response) => {
    void (async () => {
      const url = new URL(request.url!, issuerUrl)
      const json = (status: number, value: unknown) => response.writeHead(status, { 'content-type': 'application/json', 'access-control-allow-origin': '*' }).end(JSON.stringify(value))
      if (url.pathname === `${path}/.well-known/openid-configuration`) {
        if (state.unavailable) return json(503, { error: 'unavailable' })
        return json(200, Object.fromEntries(Object.entries({
          issuer: issuerUrl,
          jwks_uri: `${issuerUrl}/jwks`,
          authorization_endpoint: `${issuerUrl}/authorize`,
          token_endpoint: `${issuerUrl}/token`,
          response_types_supported: ['code'],
          code_challenge_methods_supported: ['S256'],
          id_token_signing_alg_values_supported: ['RS256'],
          ...state.discovery
        }).filter(([, value]) => value !== null)))
      }
      if (url.pathname === `${path}/jwks`) {
        fetches++
        await keysHeld
        return json(200, { keys: keys.map((key) => key.jwk) })
      }
      if (url.pathname === `${path}/authorize`) {
        // The user is signed in at once: back to the application with a code.
        const code = randomBytes(12).toString('hex')
        const redirect = url.searchParams.get('redirect_uri')!
        codes.set(code, { challenge: url.searchParams.get('code_challenge') ?? '', clientId: url.searchParams.get('client_id') ?? '', redirect, nonce: url.searchParams.get('nonce') })
        const back = new URL(redirect)
        back.searchParams.set('code', code)
        back.searchParams.set('state', url.searchParams.get('state') ?? '')
        return response.writeHead(302, { location: back.href }).end()
      }
      if (url.pathname === `${path}/token` && request.method === 'POST') {
        const form = new URLSearchParams(await body(request))
        const grant = codes.get(form.get('code') ?? '')
        codes.delete(form.get('code') ?? '')
        const { createHash } = await import('node:crypto')
        const verifier = form.get('code_verifier') ?? ''
        if (grant === undefined || createHash('sha256').update(verifier).digest('base64url') !== grant.challenge || form.get('redirect_uri') !== grant.redirect) {
          return json(400, { error: 'invalid_grant' })
        }
        const token = await sign({ ...user, aud: grant.clientId === '' ? TEST_AUDIENCE : [TEST_AUDIENCE, grant.clientId], ...(grant.nonce === null ? {} : { nonce: grant.nonce }) })
        return json(200, { access_token: token, id_token: token, token_type: 'Bearer', expires_in: 300 })
      }
      if (request.method === 'OPTIONS') {
        return response.writeHead(204, { 'access-control-allow-origin': '*', 'access-control-allow-headers': '*', 'access-control-allow-methods': 'GET, POST' }).end()
      }
      json(404, { error: 'not_found' })
    })()
  })
  const path = options.path ?? ''
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => { server.closeAllConnections(); server.close() })
  const issuerUrl = `http://127.0.0.1:${(server.address() as { port: number }).port}${path}`

  async function sign (claims: JWTPayload = {}, signOptions: SignOptions = {}): Promise<string> {
    const current = keys[0]!
    const key = signOptions.unknownKey === true ? (await newKey(current.kid)).privateKey : current.privateKey
    const now = Math.floor(Date.now() / 1000)
    const jwt = new SignJWT({ iss: issuerUrl, aud: TEST_AUDIENCE, sub: 'tester', iat: now, ...(signOptions.noExpiry === true ? {} : { exp: now + (signOptions.expiresIn ?? 300) }), ...(signOptions.notBefore === undefined ? {} : { nbf: now + signOptions.notBefore }), ...claims })
      .setProtectedHeader({ alg: 'RS256', ...(signOptions.noKid === true ? {} : { kid: signOptions.kid ?? current.kid }), typ: 'JWT' })
    return jwt.sign(key)
  }

  return Object.assign(state, {
    url: issuerUrl,
    sign,
    async rotate (rotateOptions: { drop?: boolean } = {}) {
      const next = await newKey()
      keys = rotateOptions.drop === true ? [next] : [next, ...keys]
    },
    jwksFetches: () => fetches,
    holdKeys () {
      let release!: () => void
      keysHeld = new Promise<void>((resolve) => { release = resolve })
      return () => { keysHeld = undefined; release() }
    },
    user
  })
}

/** An unsigned token (`alg: none`), which must never be accepted. */
export function unsignedToken (claims: JWTPayload): string {
  const part = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64url')
  return `${part({ alg: 'none', typ: 'JWT' })}.${part(claims)}.`
}
