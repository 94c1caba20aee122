import type { FastifyInstance } from 'fastify'
import { decodeJwt, SignJWT } from 'jose'
import { connect } from 'node:net'
import t, { type Test } from 'tap'
import { JwtIssuers } from '../plugins/app/auth/jwt-issuers.ts'
import { STREAM_TOKEN_ISSUER, StreamTokens } from '../plugins/app/auth/stream-tokens.ts'
import { build, serve } from './helpers/app.ts'
import { insertGraph, makeRun, makeTask, makeThread } from './helpers/fixtures.ts'
import { startIssuer, TEST_AUDIENCE, unsignedToken } from './helpers/issuer.ts'
import { insertEvents } from './helpers/sse.ts'

// Authentication (docs/authentication.md), tried at every door: each
// protected route, the stream and the Durable Streams routes, crossed with
// every way a credential can be missing or wrong; then what opens them.

const STATIC = 'static-token-for-the-doors'
const SECRET = 'a-stream-token-secret-of-at-least-32-characters'

await insertGraph({
  runs: [makeRun({ run_id: 'door-r1' }), makeRun({ run_id: 'door-r2' })],
  tasks: [makeTask({ run_id: 'door-r1', task_id: 'door-task' })],
  threads: [makeThread({ run_id: 'door-r1', task_id: 'door-task', thread_id: 'door-t1' })]
})
await insertEvents({ run_id: 'door-r1', thread_id: 'door-t1' }, { run_id: 'door-r2' })

/** Every protected door, as a request that a good credential opens (200). */
const DOORS: Array<{ method: 'GET' | 'HEAD', url: string, stream?: { run_id?: string, thread_id?: string } }> = [
  { method: 'GET', url: '/api/runs' },
  { method: 'GET', url: '/api/runs/door-r1' },
  { method: 'GET', url: '/api/runs/door-r1/tasks' },
  { method: 'GET', url: '/api/runs/door-r1/tasks/door-task' },
  { method: 'GET', url: '/api/runs/door-r1/blocked' },
  { method: 'GET', url: '/api/threads/door-t1' },
  { method: 'GET', url: '/api/events' },
  { method: 'GET', url: '/api/stream-token?run_id=door-r1' },
  { method: 'GET', url: '/metrics' },
  { method: 'GET', url: '/api/events/stream?run_id=door-r1', stream: { run_id: 'door-r1' } },
  { method: 'GET', url: '/api/streams/events?offset=-1', stream: {} },
  { method: 'GET', url: '/api/streams/runs/door-r1?offset=-1', stream: { run_id: 'door-r1' } },
  { method: 'GET', url: '/api/streams/runs/door-r1?offset=now&live=sse', stream: { run_id: 'door-r1' } },
  { method: 'GET', url: '/api/streams/threads/door-t1?offset=-1&live=long-poll', stream: { thread_id: 'door-t1' } },
  { method: 'HEAD', url: '/api/streams/events', stream: {} },
  { method: 'HEAD', url: '/api/streams/runs/door-r1', stream: { run_id: 'door-r1' } },
  { method: 'HEAD', url: '/api/streams/threads/door-t1', stream: { thread_id: 'door-t1' } }
]

interface Answer { status: number, headers: Headers, body: string }

/** One request to a listening app; a stream's body is not waited for (only its status and headers). */
async function call (base: string, method: string, url: string, headers: Record<string, string> = {}): Promise<Answer> {
  const controller = new AbortController()
  const response = await fetch(`${base}${url}`, { method, headers, signal: controller.signal })
  const streaming = response.status === 200 && (/event-stream/.test(response.headers.get('content-type') ?? '') || /live=long-poll/.test(url))
  const body = streaming ? '' : await response.text()
  controller.abort()
  return { status: response.status, headers: response.headers, body }
}

async function listening (t: Test, overrides: Parameters<typeof build>[1]): Promise<{ app: FastifyInstance, base: string }> {
  const { app, url } = await serve(t, { STREAM_TOKEN_SECRET: SECRET, DURABLE_STREAMS_LONG_POLL_MS: 200, ...overrides })
  return { app, base: url }
}

/** A stream token signed with the test's key, with any claims (an expired one, say). */
async function forgedStreamToken (claims: Record<string, unknown>, expiresIn: number, secret = SECRET): Promise<string> {
  const now = Math.floor(Date.now() / 1000)
  return new SignJWT(claims).setProtectedHeader({ alg: 'HS256' }).setIssuer(STREAM_TOKEN_ISSUER).setAudience('urn:ocp-api:streams')
    .setIssuedAt(now).setExpirationTime(now + expiresIn).sign(new TextEncoder().encode(secret))
}

const issuersConfig = (...issuers: object[]) => JSON.stringify(issuers)

t.test('every door: each way in that must fail answers 401 with the envelope and a challenge, never a 500', async (t) => {
  const issuer = await startIssuer(t)
  const stranger = await startIssuer(t)
  const { app, base } = await listening(t, { API_TOKENS: STATIC, AUTH_ISSUERS: issuersConfig({ issuer: issuer.url, audience: TEST_AUDIENCE }) })

  // The list above is every door: each GET and HEAD of /api in the OpenAPI document (and /metrics).
  const document = JSON.parse((await app.inject('/openapi.json')).body) as { paths: Record<string, Record<string, unknown>> }
  const documented = Object.entries(document.paths).flatMap(([path, operations]) => Object.keys(operations).filter((method) => method === 'get' || method === 'head')
    .map((method) => `${method.toUpperCase()} ${path}`)).filter((door) => door !== 'GET /api/auth' && door !== 'GET /api/auth/sign-out' && /\/api\/|\/metrics/.test(door)).sort()
  const listed = [...new Set(DOORS.filter((door) => door.method === 'GET').map((door) => `${door.method} ${door.url.split('?')[0]!.replace('door-r1', '{runID}').replace('door-task', '{taskID}').replace('door-t1', '{threadID}')}`))].sort()
  t.same(listed, documented, 'the doors tried are all the protected routes (and the HEAD of each Durable Streams route)')

  const anotherRun = await app.streamTokens.sign({ run_id: 'door-r2' })
  const wrongs: Array<{ name: string, headers?: Record<string, string>, query?: string, presented: boolean, streamOnly?: boolean }> = [
    { name: 'no token', presented: false },
    { name: 'a malformed header', headers: { authorization: 'Bearer' }, presented: true },
    { name: 'another scheme', headers: { authorization: `Basic ${Buffer.from(`x:${STATIC}`).toString('base64')}` }, presented: true },
    { name: 'an unknown static token', headers: { authorization: 'Bearer not-a-token-we-know' }, presented: true },
    { name: 'a malformed JWT', headers: { authorization: 'Bearer eyJhbGciOiJSUzI1NiJ9.e30.bad' }, presented: true },
    { name: 'an expired JWT', headers: { authorization: `Bearer ${await issuer.sign({}, { expiresIn: -120 })}` }, presented: true },
    { name: 'a JWT not valid yet', headers: { authorization: `Bearer ${await issuer.sign({}, { notBefore: 600 })}` }, presented: true },
    { name: 'a JWT without exp', headers: { authorization: `Bearer ${await issuer.sign({}, { noExpiry: true })}` }, presented: true },
    { name: 'a JWT of another issuer', headers: { authorization: `Bearer ${await stranger.sign()}` }, presented: true },
    { name: 'a JWT naming our issuer, signed by another', headers: { authorization: `Bearer ${await stranger.sign({ iss: issuer.url })}` }, presented: true },
    { name: 'a JWT for another audience', headers: { authorization: `Bearer ${await issuer.sign({ aud: 'someone-else' })}` }, presented: true },
    { name: 'a JWT signed with an unknown key (same kid)', headers: { authorization: `Bearer ${await issuer.sign({}, { unknownKey: true })}` }, presented: true },
    { name: 'a JWT with an unknown kid', headers: { authorization: `Bearer ${await issuer.sign({}, { kid: 'nobody' })}` }, presented: true },
    { name: 'an alg: none token', headers: { authorization: `Bearer ${unsignedToken({ iss: issuer.url, aud: TEST_AUDIENCE, sub: 'x', exp: Math.floor(Date.now() / 1000) + 300 })}` }, presented: true },
    { name: 'a static token in the URL', query: `access_token=${STATIC}`, presented: true, streamOnly: true },
    { name: 'a JWT as stream_token', query: `stream_token=${await issuer.sign()}`, presented: true, streamOnly: true },
    { name: 'a static token as stream_token', query: `stream_token=${STATIC}`, presented: true, streamOnly: true },
    { name: 'a stream token for another run', query: `stream_token=${anotherRun.token}`, presented: true, streamOnly: true },
    { name: 'a stream token for another run, as a header', headers: { authorization: `Bearer ${anotherRun.token}` }, presented: true },
    { name: 'an expired stream token', query: `stream_token=${await forgedStreamToken({ stream: { run_id: 'door-r1' } }, -120)}`, presented: true, streamOnly: true },
    { name: 'a stream token signed with another key', query: `stream_token=${await forgedStreamToken({ stream: {} }, 300, 'x'.repeat(40))}`, presented: true, streamOnly: true }
  ]
  for (const wrong of wrongs) {
    for (const door of DOORS) {
      // A credential that only stream routes read is no credential elsewhere: there the request simply has none.
      const presented = wrong.presented && (door.stream !== undefined || wrong.streamOnly !== true)
      const url = wrong.query === undefined ? door.url : `${door.url}${door.url.includes('?') ? '&' : '?'}${wrong.query}`
      const answer = await call(base, door.method, url, wrong.headers)
      const label = `${wrong.name}: ${door.method} ${door.url}`
      t.equal(answer.status, 401, label)
      if (door.method === 'GET') t.match(JSON.parse(answer.body), { error: { code: 'unauthorized', message: String } }, `${label}: the envelope`)
      t.match(answer.headers.get('www-authenticate'), presented ? /^Bearer realm="ocp-api", error="invalid_token", error_description="[^"]+"$/ : /^Bearer realm="ocp-api"$/, `${label}: the challenge`)
      t.equal(answer.headers.get('cache-control'), 'no-store', `${label}: never cached`)
    }
  }
})

t.test('the refusals say what is wrong, in plain words', async (t) => {
  const issuer = await startIssuer(t)
  const { app, base } = await listening(t, { API_TOKENS: STATIC, AUTH_ISSUERS: issuersConfig({ issuer: issuer.url, audience: TEST_AUDIENCE }) })
  const message = async (url: string, headers: Record<string, string> = {}) => (JSON.parse((await call(base, 'GET', url, headers)).body) as { error: { message: string } }).error.message
  const bearer = (token: string) => ({ authorization: `Bearer ${token}` })
  t.equal(await message('/api/runs'), 'a bearer token is required')
  t.equal(await message('/api/runs', bearer(await issuer.sign({}, { expiresIn: -120 }))), 'the token has expired')
  t.equal(await message('/api/runs', bearer(await issuer.sign({ aud: 'x' }))), 'the token\'s audience is not accepted')
  t.equal(await message('/api/runs', bearer(await issuer.sign({ iss: 'https://elsewhere.example' }))), 'the token\'s issuer is not accepted')
  t.equal(await message('/api/runs', bearer(await issuer.sign({}, { unknownKey: true }))), 'the token\'s signature does not verify')
  t.equal(await message('/api/runs', bearer(await issuer.sign({}, { kid: 'nobody' }))), 'the token is signed with a key its issuer does not publish')
  t.equal(await message('/api/runs', bearer(unsignedToken({ iss: issuer.url, aud: TEST_AUDIENCE }))), 'the token\'s signature algorithm is not accepted')
  t.equal(await message('/api/events/stream?access_token=x'), 'a long-lived token in the URL (access_token) is refused: send it in the Authorization header, or open the stream with a stream token (GET /api/stream-token) as stream_token')
  const run = (await app.streamTokens.sign({ run_id: 'door-r1' })).token
  t.equal(await message('/api/streams/runs/door-r2?offset=-1&stream_token=' + run), 'the stream token is for another stream')
  t.equal(await message('/api/runs', bearer(run)), 'a stream token opens only the stream routes it was made for')
  t.equal(await message('/api/stream-token', bearer(run)), 'a stream token opens only the stream routes it was made for', 'a stream token cannot ask for another')
  t.equal(await message(`/api/events/stream?stream_token=${await forgedStreamToken({ stream: {} }, -120)}`), 'the stream token has expired: get a new one from GET /api/stream-token')
  t.equal(await message(`/api/events/stream?stream_token=${await forgedStreamToken({}, 300)}`), 'the stream token names no scope')
})

t.test('what opens the doors: a static token, a JWT of the issuer, a stream token within its scope', async (t) => {
  const issuer = await startIssuer(t)
  const { app, base } = await listening(t, { API_TOKENS: STATIC, AUTH_ISSUERS: issuersConfig({ issuer: issuer.url, audience: ['other', TEST_AUDIENCE] }) })
  const jwt = await issuer.sign()
  for (const door of DOORS) {
    for (const [name, headers] of [['static', { authorization: `Bearer ${STATIC}` }], ['jwt', { authorization: `bearer ${jwt}` }]] as const) {
      const answer = await call(base, door.method, door.url, headers)
      t.equal(answer.status, 200, `${name}: ${door.method} ${door.url}`)
    }
    if (door.stream === undefined) continue
    const scoped = await app.streamTokens.sign(door.stream)
    const everything = await app.streamTokens.sign({})
    for (const token of [scoped.token, everything.token]) {
      t.equal((await call(base, door.method, `${door.url}${door.url.includes('?') ? '&' : '?'}stream_token=${token}`)).status, 200, `stream token ${JSON.stringify(door.stream)}: ${door.method} ${door.url}`)
    }
    t.equal((await call(base, door.method, door.url, { authorization: `Bearer ${scoped.token}` })).status, 200, `stream token as a header: ${door.url}`)
  }
  // A run's token also opens that run's stream narrowed to one of its threads; a thread's token not the run's.
  const runToken = (await app.streamTokens.sign({ run_id: 'door-r1' })).token
  t.equal((await call(base, 'GET', `/api/events/stream?run_id=door-r1&thread_id=door-t1&stream_token=${runToken}`)).status, 200)
  const threadToken = (await app.streamTokens.sign({ thread_id: 'door-t1' })).token
  t.equal((await call(base, 'GET', `/api/events/stream?run_id=door-r1&stream_token=${threadToken}`)).status, 401)
  t.equal((await call(base, 'GET', `/api/events/stream?stream_token=${runToken}`)).status, 401, 'a run\'s token does not open every event')
  t.equal((await call(base, 'GET', `/api/events/stream?run_id=door-r1&run_id=door-r1&stream_token=${runToken}`)).status, 401, 'a filter given twice matches no scope')

  // Every credential used above, in no metric's labels (routes are labelled by their pattern).
  const metrics = (await call(base, 'GET', '/metrics', { authorization: `Bearer ${STATIC}` })).body
  t.match(metrics, /http_requests_total\{[^}]*route="\/api\/events\/stream"/, 'the stream\'s requests are counted by route')
  for (const secret of [STATIC, jwt.split('.')[2]!, runToken.split('.')[2]!, threadToken.split('.')[2]!]) t.notOk(metrics.includes(secret), 'no credential in /metrics')
})

t.test('GET /api/stream-token: the scope asked for, a short life, never cached; GET /api/auth says how to sign in', async (t) => {
  const issuer = await startIssuer(t)
  const { base } = await listening(t, { API_TOKENS: STATIC, STREAM_TOKEN_TTL_S: 120, AUTH_ISSUERS: issuersConfig({ issuer: issuer.url, audience: TEST_AUDIENCE, ui_client_id: 'ocp-ui' }) })
  const answer = await call(base, 'GET', '/api/stream-token?thread_id=door-t1', { authorization: `Bearer ${STATIC}` })
  t.equal(answer.headers.get('cache-control'), 'no-store')
  const body = JSON.parse(answer.body) as { token: string, expires_at: string, scope: object }
  t.same(body.scope, { thread_id: 'door-t1' })
  const life = Date.parse(body.expires_at) - Date.now()
  t.ok(life > 110_000 && life <= 120_000, `lives STREAM_TOKEN_TTL_S (${life} ms)`)
  t.same(JSON.parse((await call(base, 'GET', '/api/stream-token')).body).error.code, 'unauthorized')

  const auth = await call(base, 'GET', '/api/auth')
  t.equal(auth.status, 200, '/api/auth needs no token')
  t.same(JSON.parse(auth.body), { required: true, sign_in: { issuer: issuer.url, authorization_endpoint: `${issuer.url}/authorize`, token_endpoint: `${issuer.url}/token`, client_id: 'ocp-ui', scope: 'openid' } })
  const open = await listening(t, {})
  t.same(JSON.parse((await call(open.base, 'GET', '/api/auth')).body), { required: false, sign_in: null })
  const token = JSON.parse((await call(open.base, 'GET', '/api/stream-token')).body) as { token: string }
  t.equal((await call(open.base, 'GET', `/api/streams/events?offset=-1&stream_token=${token.token}`)).status, 200, 'without authentication, a stream token is simply not needed')
})

t.test('GET /api/auth/sign-out: open, and has the browser clear the origin\'s cache and storage, unless another site asks', async (t) => {
  const app = await build(t, { API_TOKENS: STATIC })
  const answer = await app.inject({ url: '/api/auth/sign-out', headers: { 'sec-fetch-site': 'same-origin' } })
  t.equal(answer.statusCode, 204, 'no token needed')
  t.equal(answer.headers['clear-site-data'], '"cache", "storage"')
  t.equal(answer.headers['cache-control'], 'no-store')
  t.equal((await app.inject('/api/auth/sign-out')).headers['clear-site-data'], '"cache", "storage"', 'a client that says nothing of its site (curl)')
  for (const site of ['cross-site', 'same-site']) {
    const foreign = await app.inject({ url: '/api/auth/sign-out', headers: { 'sec-fetch-site': site } })
    t.equal(foreign.statusCode, 204)
    t.equal(foreign.headers['clear-site-data'], undefined, `${site}: nothing cleared`)
  }
})

t.test('without STREAM_TOKEN_SECRET every replica signs with the key the database holds', async (t) => {
  const one = await build(t, { API_TOKENS: STATIC })
  const two = await build(t, { API_TOKENS: STATIC })
  const token = (await one.inject({ url: '/api/stream-token?run_id=door-r1', headers: { authorization: `Bearer ${STATIC}` } })).json().token
  t.equal((await two.inject({ url: `/api/streams/runs/door-r1?offset=-1&stream_token=${token}` })).statusCode, 200, 'a token one replica made opens a stream on another')
  const other = await build(t, { API_TOKENS: STATIC, STREAM_TOKEN_SECRET: SECRET })
  t.equal((await other.inject({ url: `/api/streams/runs/door-r1?offset=-1&stream_token=${token}` })).statusCode, 401, 'not on one with a key of its own')
})

t.test('a stream stays open past its token\'s expiry; a reconnect then is refused', async (t) => {
  const { base } = await listening(t, { API_TOKENS: STATIC, AUTH_CLOCK_TOLERANCE_S: 0, EVENTS_POLL_INTERVAL_MS: 20 })
  const token = await forgedStreamToken({ stream: { run_id: 'door-r1' } }, 2)
  const controller = new AbortController()
  t.teardown(() => controller.abort())
  const response = await fetch(`${base}/api/events/stream?run_id=door-r1&stream_token=${token}`, { signal: controller.signal })
  t.equal(response.status, 200)
  const reader = response.body!.getReader()
  await new Promise((resolve) => setTimeout(resolve, 2500))
  const [id] = await insertEvents({ run_id: 'door-r1', summary: 'after the expiry' })
  let text = ''
  while (!text.includes(`id: ${id}`)) text += new TextDecoder().decode((await reader.read()).value)
  t.pass('the event after the token expired arrived on the stream it opened')
  const again = await call(base, 'GET', `/api/events/stream?run_id=door-r1&stream_token=${token}`)
  t.equal(again.status, 401)
  t.match(JSON.parse(again.body).error.message, /expired/)
})

t.test('CI tokens: an issuer\'s claims must match its rules', async (t) => {
  const ci = await startIssuer(t, { path: '/ci' })
  const { base } = await listening(t, {
    AUTH_ISSUERS: issuersConfig({ issuer: ci.url, audience: 'https://ocp.example', claims: { repository: 'acme/app', ref: ['refs/heads/main', 'refs/tags/v1'] } })
  })
  const read = async (claims: object) => (await call(base, 'GET', '/api/runs', { authorization: `Bearer ${await ci.sign({ aud: 'https://ocp.example', ...claims })}` })).status
  t.equal(await read({ repository: 'acme/app', ref: 'refs/heads/main' }), 200)
  t.equal(await read({ repository: 'acme/app', ref: 'refs/tags/v1' }), 200)
  t.equal(await read({ repository: 'acme/app', ref: 'refs/heads/feature' }), 401, 'another branch')
  t.equal(await read({ repository: 'evil/app', ref: 'refs/heads/main' }), 401, 'another repository')
  t.equal(await read({ ref: 'refs/heads/main' }), 401, 'no repository claim')
  t.equal(await read({ repository: ['acme/app'], ref: 'refs/heads/main' }), 401, 'a claim of another type')
})

t.test('keys: a rotated key is fetched once for its new kid; unknown kids are rate-limited; jwks_uri without discovery', async (t) => {
  const issuer = await startIssuer(t)
  // Long enough that the two unknown kids checked right after a fetch are inside it on a busy machine too.
  const cooldownMs = 1500
  const issuers = new JwtIssuers([{ issuer: issuer.url, audience: TEST_AUDIENCE }], 0, { jwksCooldownMs: cooldownMs })
  const verify = async (token: string) => issuers.verify(token, issuer.url).then(() => 'ok', (error: Error) => error.message)
  t.equal(await verify(await issuer.sign()), 'ok')
  const fetched = issuer.jwksFetches()
  t.equal(await verify(await issuer.sign({ sub: 'again' })), 'ok', 'a second token of a known key')
  t.equal(issuer.jwksFetches(), fetched, 'needs no fetch')
  await new Promise((resolve) => setTimeout(resolve, cooldownMs + 50))
  await issuer.rotate({ drop: true })
  t.equal(await verify(await issuer.sign({ sub: 'rotated' })), 'ok', 'a token of the new key')
  t.equal(issuer.jwksFetches(), fetched + 1, 'fetched the keys once for it')
  t.equal(await verify(await issuer.sign({}, { kid: 'unknown-1' })), 'the token is signed with a key its issuer does not publish')
  t.equal(await verify(await issuer.sign({}, { kid: 'unknown-2' })), 'the token is signed with a key its issuer does not publish')
  t.equal(issuer.jwksFetches(), fetched + 1, 'unknown kids right after a fetch fetch nothing (the cooldown)')
  await new Promise((resolve) => setTimeout(resolve, cooldownMs + 50))
  t.equal(await verify(await issuer.sign({}, { kid: 'unknown-3' })), 'the token is signed with a key its issuer does not publish')
  t.equal(issuer.jwksFetches(), fetched + 2, 'after the cooldown, one fetch')
  t.equal(await verify(await issuer.sign({ sub: 'old key' }, { unknownKey: true })), 'the token\'s signature does not verify', 'a key that is gone no longer verifies')

  const direct = await startIssuer(t)
  const byUri = await listening(t, { AUTH_ISSUERS: issuersConfig({ issuer: direct.url, audience: TEST_AUDIENCE, jwks_uri: `${direct.url}/jwks`, algorithms: ['RS256'] }) })
  t.equal((await call(byUri.base, 'GET', '/api/runs', { authorization: `Bearer ${await direct.sign()}` })).status, 200, 'keys from jwks_uri')
})

t.test('JwtIssuers: a token remembered until it expires, the memory bounded, discovery retried and checked', async (t) => {
  const issuer = await startIssuer(t)
  const verify = async (issuers: JwtIssuers, token: string) => issuers.verify(token, issuer.url).then(() => 'ok', (error: Error) => error.message)
  const issuers = new JwtIssuers([{ issuer: issuer.url, audience: TEST_AUDIENCE }], 0, { maxVerified: 1 })
  // exp is in whole seconds from an iat rounded down: 3 s leaves it at least 2 s to pass the checks below.
  const short = await issuer.sign({ sub: 'short' }, { expiresIn: 3 })
  t.equal(await verify(issuers, short), 'ok')
  const fetched = issuer.jwksFetches()
  t.equal(await verify(issuers, short), 'ok', 'again: remembered')
  t.equal(issuer.jwksFetches(), fetched)
  t.equal(await verify(issuers, await issuer.sign({ sub: 'other' })), 'ok', 'a second token: the first is forgotten (maxVerified 1)')
  t.equal(await verify(issuers, short), 'ok', 'checked again')
  // Just past its exp, the instant both the memory and jose call it expired.
  await new Promise((resolve) => setTimeout(resolve, decodeJwt(short).exp! * 1000 - Date.now() + 50))
  t.equal(await verify(issuers, short), 'the token has expired', 'remembered, but not past its expiry')
  t.equal(await verify(issuers, short), 'the token has expired', 'and then checked afresh')

  const malformed = `${Buffer.from(JSON.stringify({ typ: 'JWT' })).toString('base64url')}.${Buffer.from(JSON.stringify({ iss: issuer.url })).toString('base64url')}.c2ln`
  t.equal(await verify(issuers, malformed), 'the token is malformed', 'no alg')

  issuer.unavailable = true
  // Long enough that the two checks "not again at once" fit in it on a busy machine too.
  const discoveryRetryMs = 1000
  const retrying = new JwtIssuers([{ issuer: issuer.url, audience: TEST_AUDIENCE, ui_client_id: 'ui' }], 0, { discoveryRetryMs })
  const token = await issuer.sign()
  t.match(await verify(retrying, token), /could not be reached/, 'discovery answered 503')
  issuer.unavailable = false
  t.match(await verify(retrying, token), /could not be reached/, 'not asked again at once')
  await t.rejects(retrying.signIn(), { code: 'unavailable' }, 'nor for the sign-in')
  await new Promise((resolve) => setTimeout(resolve, discoveryRetryMs + 50))
  t.equal(await verify(retrying, token), 'ok', 'asked again after discoveryRetryMs')
  t.match(await retrying.signIn(), { client_id: 'ui' })

  const mismatched = new JwtIssuers([{ issuer: `${issuer.url}/`, audience: TEST_AUDIENCE }], 0)
  t.match(await mismatched.verify(await issuer.sign({ iss: `${issuer.url}/` }), `${issuer.url}/`).catch((error: Error) => error.message), /could not be reached/, 'a document naming another issuer is not trusted')
  issuer.discovery = { jwks_uri: null }
  const keyless = new JwtIssuers([{ issuer: issuer.url, audience: TEST_AUDIENCE }], 0)
  t.match(await verify(keyless, token), /could not be reached/, 'a document without jwks_uri')
  issuer.discovery = { authorization_endpoint: null }
  t.equal(await new JwtIssuers([{ issuer: issuer.url, audience: TEST_AUDIENCE, ui_client_id: 'ui' }], 0).signIn(), null, 'no sign-in without an authorization endpoint')
  t.equal(await new JwtIssuers([{ issuer: issuer.url, audience: TEST_AUDIENCE }], 0).signIn(), null, 'nor without ui_client_id')
})

t.test('a stream token opens nothing after its expires_at, whatever AUTH_CLOCK_TOLERANCE_S (our own clock)', async (t) => {
  const app = await build(t, { API_TOKENS: STATIC, STREAM_TOKEN_SECRET: SECRET, AUTH_CLOCK_TOLERANCE_S: 30 })
  const expired = await forgedStreamToken({ stream: {} }, -1)
  const answer = await app.inject({ url: `/api/streams/events?offset=-1&stream_token=${expired}` })
  t.equal(answer.statusCode, 401, 'a second past it, within the tolerance other issuers get')
  t.match(answer.json().error.message, /expired/)
})

t.test('a remembered verdict lasts rememberMs at most, and ends when its key leaves the issuer\'s keys', async (t) => {
  const issuer = await startIssuer(t)
  const cooldownMs = 200
  const verify = async (issuers: JwtIssuers, token: string) => issuers.verify(token, issuer.url).then(() => 'ok', (error: Error) => error.message)
  const issuers = new JwtIssuers([{ issuer: issuer.url, audience: TEST_AUDIENCE }], 0, { jwksCooldownMs: cooldownMs })
  const one = await issuer.sign({ sub: 'one' })
  const two = await issuer.sign({ sub: 'two' })
  const keyless = await issuer.sign({ sub: 'no kid' }, { noKid: true })
  for (const token of [one, two, keyless]) t.equal(await verify(issuers, token), 'ok')
  const fetched = issuer.jwksFetches()
  t.equal(await verify(issuers, one), 'ok', 'remembered')
  t.equal(issuer.jwksFetches(), fetched, 'with no fetch')
  await issuer.rotate({ drop: true })
  t.equal(await verify(issuers, one), 'ok', 'the keys not fetched again yet: still remembered')
  await new Promise((resolve) => setTimeout(resolve, cooldownMs + 50))
  t.equal(await verify(issuers, await issuer.sign({ sub: 'new key' })), 'ok', 'a token of the new key fetches the keys again')
  t.equal(await verify(issuers, one), 'the token is signed with a key its issuer does not publish', 'its key gone: forgotten, and refused')
  t.equal(await verify(issuers, two), 'the token is signed with a key its issuer does not publish', 'every token of that key')
  t.equal(await verify(issuers, keyless), 'the token\'s signature does not verify', 'a token without a kid: checked again once the keys changed')

  const rememberMs = 300
  const brief = new JwtIssuers([{ issuer: issuer.url, audience: TEST_AUDIENCE }], 0, { jwksCooldownMs: cooldownMs, rememberMs })
  const three = await issuer.sign({ sub: 'three' })
  t.equal(await verify(brief, three), 'ok')
  await issuer.rotate({ drop: true })
  await new Promise((resolve) => setTimeout(resolve, rememberMs + 50))
  t.equal(await verify(brief, three), 'the token is signed with a key its issuer does not publish', 'past rememberMs: checked again, with keys fetched again')
})

t.test('a JWT issued in the future (beyond AUTH_CLOCK_TOLERANCE_S) is refused', async (t) => {
  const issuer = await startIssuer(t)
  const { base } = await listening(t, { AUTH_ISSUERS: issuersConfig({ issuer: issuer.url, audience: TEST_AUDIENCE }), AUTH_CLOCK_TOLERANCE_S: 30 })
  const now = Math.floor(Date.now() / 1000)
  const future = await call(base, 'GET', '/api/runs', { authorization: `Bearer ${await issuer.sign({ iat: now + 120 })}` })
  t.equal(future.status, 401)
  t.match(JSON.parse(future.body).error.message, /issued in the future/)
  t.equal((await call(base, 'GET', '/api/runs', { authorization: `Bearer ${await issuer.sign({ iat: now + 10 })}` })).status, 200, 'within the tolerance: a clock a little ahead')
  t.equal((await call(base, 'GET', '/api/runs', { authorization: `Bearer ${await issuer.sign({ iat: undefined })}` })).status, 200, 'no iat at all: nothing to check')
})

t.test('two Authorization headers are a 400 (a proxy in front may read the other one)', async (t) => {
  const { base } = await listening(t, { API_TOKENS: STATIC })
  const { hostname, port } = new URL(base)
  const raw = await new Promise<string>((resolve, reject) => {
    const socket = connect(Number(port), hostname, () => {
      socket.end(`GET /api/runs HTTP/1.1\r\nHost: ${hostname}\r\nAuthorization: Bearer ${STATIC}\r\nAuthorization: Bearer something-else\r\nConnection: close\r\n\r\n`)
    })
    let text = ''
    socket.on('data', (chunk) => { text += chunk })
    socket.on('end', () => resolve(text))
    socket.on('error', reject)
  })
  t.match(raw, /^HTTP\/1\.1 400 /)
  t.match(raw, /"code":"bad_request","message":"the request carries two Authorization headers: send one"/)
  t.equal((await call(base, 'GET', '/api/runs', { authorization: `Bearer ${STATIC}` })).status, 200, 'one is fine')
})

t.test('StreamTokens: a key that could not be read is read again', async (t) => {
  let reads = 0
  const tokens = new StreamTokens(async () => { if (++reads === 1) throw new Error('database down'); return SECRET }, 60)
  await t.rejects(tokens.sign({}), /database down/)
  const { token } = await tokens.sign({ run_id: 'r' })
  t.same(await tokens.verify(token), { scope: { run_id: 'r' }, caller: undefined })
  t.same(await tokens.verify((await tokens.sign({}, 'token ci')).token), { scope: {}, caller: 'token ci' }, 'who asked, as its subject')
  t.equal(reads, 2)
})

t.test('an identity provider that cannot be reached: 503 with the envelope, and a later token works', async (t) => {
  const { base } = await listening(t, { AUTH_ISSUERS: issuersConfig({ issuer: 'http://127.0.0.1:1/nobody', audience: TEST_AUDIENCE }) })
  const token = unsignedToken({ iss: 'http://127.0.0.1:1/nobody', aud: TEST_AUDIENCE })
  // Signed or not, nothing can be checked without the keys: the answer is "try again", not "your token is bad".
  const answer = await call(base, 'GET', '/api/runs', { authorization: `Bearer ${token.replace(/\.$/, '.c2ln')}` })
  t.equal(answer.status, 503)
  t.match(JSON.parse(answer.body), { error: { code: 'unavailable', message: /identity provider http:\/\/127\.0\.0\.1:1\/nobody could not be reached/ } })
  const stream = await fetch(`${base}/api/events/stream`, { headers: { authorization: `Bearer ${token.replace(/\.$/, '.c2ln')}` } })
  t.equal(stream.status, 200, 'on the stream: a retry, as for any transient refusal')
  t.match(await stream.text(), /^retry: \d+\n: unavailable: the identity provider/)
})

t.test('configuration: AUTH_ISSUERS is checked at start and says what is wrong', async (t) => {
  const { loadConfig } = await import('../config.ts')
  t.throws(() => loadConfig({ AUTH_ISSUERS: 'not json' }), /AUTH_ISSUERS is not JSON/)
  t.throws(() => loadConfig({ AUTH_ISSUERS: '[{"issuer": "ftp://x", "audience": "a"}]' }), /AUTH_ISSUERS\[0\]\/issuer/)
  t.throws(() => loadConfig({ AUTH_ISSUERS: '[{"issuer": "https://x"}]' }), /AUTH_ISSUERS\[0\]/)
  t.throws(() => loadConfig({ AUTH_ISSUERS: '[{"issuer": "https://x", "audience": "a", "algorithms": ["none"]}]' }), /AUTH_ISSUERS\[0\]\/algorithms/)
  t.throws(() => loadConfig({ STREAM_TOKEN_SECRET: 'short' }), /STREAM_TOKEN_SECRET/)
  t.equal(loadConfig({ AUTH_ISSUERS: '{"issuer": "https://x", "audience": "a"}' }).AUTH_ISSUERS.length > 0, true, 'one issuer may be given without the array')
  t.throws(() => loadConfig({ AUTH_ISSUERS: '[{"issuer": "http://id.example", "audience": "a"}]' }), /AUTH_ISSUERS\[0\]\.issuer must be https/, 'plain http to another host')
  t.throws(() => loadConfig({ AUTH_ISSUERS: '[{"issuer": "https://id.example", "audience": "a", "jwks_uri": "http://id.example/keys"}]' }), /AUTH_ISSUERS\[0\]\.jwks_uri must be https/)
  t.throws(() => loadConfig({ AUTH_ISSUERS: '[{"issuer": "http://", "audience": "a"}]' }), /AUTH_ISSUERS\[0\]\.issuer is not a URL/)
  for (const loopback of ['http://localhost:8080', 'http://127.0.0.1:1/x', 'http://[::1]:9']) {
    t.doesNotThrow(() => loadConfig({ AUTH_ISSUERS: JSON.stringify({ issuer: loopback, audience: 'a', jwks_uri: `${loopback}/keys` }) }), `plain http on loopback: ${loopback}`)
  }
})

t.test('with authentication on, the cacheable answers are private and vary by Authorization', async (t) => {
  const issuer = await startIssuer(t)
  const { base } = await listening(t, { AUTH_ISSUERS: issuersConfig({ issuer: issuer.url, audience: TEST_AUDIENCE }) })
  const answer = await call(base, 'GET', '/api/runs/door-r1', { authorization: `Bearer ${await issuer.sign()}` })
  t.match(answer.headers.get('cache-control'), /^private/)
  t.match(answer.headers.get('vary'), /Authorization/i)
})
