import { EventSource } from 'eventsource'
import t, { type Test } from 'tap'
import { ApiError, createClient, type Event, type StreamStatus } from '../client/src/index.ts'
import type { Config } from '../config.ts'
import { serve as serveApp } from './helpers/app.ts'
import { startIssuer } from './helpers/issuer.ts'
import { insertGraph, makeRun } from './helpers/fixtures.ts'
import { insertEvents, take } from './helpers/sse.ts'
import { sleep, waitUntil } from './helpers/wait.ts'

// ocp-api-client with authentication on: the token as a header only (set,
// changed or provided at run time), stream tokens for streams (a URL for an
// EventSource; watch's streamTokens, which fetches a fresh one when a
// reconnect's is refused), and what GET /api/auth says.

const TOKEN = 'client-auth-secret'

t.before(() => insertGraph({ runs: [makeRun({ run_id: 'run-ca1', status: 'running' }), makeRun({ run_id: 'run-ca2', status: 'done' })] }))

/** This file's application, listening. */
const serve = (t: Test, overrides: Partial<Config> = {}) => serveApp(t, { EVENTS_POLL_INTERVAL_MS: 50, SSE_RETRY_MS: 100, API_TOKENS: TOKEN, ...overrides })

interface Recorded { url: string, authorization?: string }

/** A fetch that records each request (its URL and Authorization header); `answer` may answer instead of the service, or rewrite its answer. */
function recordingFetch (answer?: (url: string, response: () => Promise<Response>) => Promise<Response | undefined> | Response | undefined) {
  const requests: Recorded[] = []
  const fetcher = async (input: string | URL | Request, init?: RequestInit) => {
    const headers = new Headers(init?.headers)
    requests.push({ url: String(input), ...(headers.has('authorization') ? { authorization: headers.get('authorization')! } : {}) })
    const real = () => fetch(input, init)
    return await answer?.(String(input), real) ?? real()
  }
  return { fetcher: fetcher as typeof fetch, requests }
}

const streams = (requests: Recorded[]) => requests.filter((request) => request.url.includes('/api/events/stream'))
const grants = (requests: Recorded[]) => requests.filter((request) => request.url.includes('/api/stream-token'))

t.test('auth(): what the service says, without a token', async (t) => {
  const open = await serve(t, { API_TOKENS: '' })
  t.same(await createClient({ url: open.url }).auth(), { required: false, sign_in: null }, 'authentication off')
  const guarded = await serve(t)
  t.same(await createClient({ url: guarded.url }).auth(), { required: true, sign_in: null }, 'static tokens: required, no identity provider to sign in with')
  const issuer = await startIssuer(t)
  const withIssuer = await serve(t, { API_TOKENS: '', AUTH_ISSUERS: JSON.stringify([{ issuer: issuer.url, audience: 'ocp-api', ui_client_id: 'ocp-ui' }]) })
  const { fetcher, requests } = recordingFetch()
  t.same(await createClient({ url: withIssuer.url, token: 'any', fetch: fetcher }).auth(), {
    required: true,
    sign_in: { issuer: issuer.url, authorization_endpoint: `${issuer.url}/authorize`, token_endpoint: `${issuer.url}/token`, client_id: 'ocp-ui', scope: 'openid' }
  }, 'an issuer with ui_client_id: where a page signs in')
  t.equal(requests[0]!.authorization, undefined, 'asked without the token')
})

t.test('the token goes as a header, never in a URL; setToken and a token function change it at run time', async (t) => {
  const { url } = await serve(t)
  const { fetcher, requests } = recordingFetch()
  const client = createClient({ url, fetch: fetcher })
  t.match(await client.runs().catch((error: unknown) => error), { status: 401, code: 'unauthorized', terminal: true }, 'no token: 401, for good')
  client.setToken(TOKEN)
  t.equal((await client.run('run-ca1')).run.run.run_id, 'run-ca1', 'after setToken: read')
  t.equal(requests.at(-1)!.authorization, `Bearer ${TOKEN}`)
  client.setToken(undefined)
  t.match(await client.run('run-ca1').catch((error: unknown) => error), { status: 401 }, 'signed out: refused again')
  t.notOk(requests.some((request) => request.url.includes(TOKEN)), 'the token never in a URL')

  const plain = createClient({ url, token: TOKEN })
  t.match(plain.streamUrl({ run_id: 'run-ca1' }, 5), /\/api\/events\/stream\?run_id=run-ca1&after_event_id=5$/, 'the stream URL does not carry the client\'s token')
  t.match(plain.streamUrl({}, undefined, 'st-1'), /\/api\/events\/stream\?stream_token=st-1$/, 'but a stream token when given')
  t.equal((await fetch(`${url}/api/events/stream?access_token=${TOKEN}`)).status, 401, 'the service refuses a long-lived token in the URL')

  let calls = 0
  const provided = createClient({ url, token: async () => { calls++; return TOKEN } })
  await provided.runs()
  await provided.run('run-ca2')
  t.equal(calls, 2, 'a token function is asked before each request')
  t.match(await createClient({ url, token: () => undefined }).runs().catch((error: unknown) => error), { status: 401 }, 'and may give none')
  t.match(await createClient({ url, token: '' }).runs().catch((error: unknown) => error), { status: 401, detail: 'a bearer token is required' }, 'an empty token is none')
})

t.test('setToken drops the bodies kept for If-None-Match: another caller\'s answer is never reused', async (t) => {
  const { url } = await serve(t)
  const { fetcher } = recordingFetch()
  const sent: Array<string | null> = []
  const client = createClient({ url, token: TOKEN, fetch: async (input, init) => { sent.push(new Headers(init?.headers).get('if-none-match')); return fetcher(input, init) } })
  await client.run('run-ca1')
  await client.run('run-ca1')
  t.type(sent[1], 'string', 'the same token: revalidated')
  client.setToken(`${TOKEN}`)
  await client.run('run-ca1')
  t.equal(sent[2], null, 'after setToken: read afresh')
})

t.test('streamToken and signedStreamUrl: a short-lived token scoped to the stream, which an EventSource opens', async (t) => {
  const { url } = await serve(t)
  const client = createClient({ url, token: TOKEN })
  const before = Date.now()
  const grant = await client.streamToken({ run_id: 'run-ca1' })
  t.type(grant.token, 'string')
  t.not(grant.token, TOKEN)
  t.same(grant.scope, { run_id: 'run-ca1' })
  t.ok(Date.parse(grant.expires_at) > before && Date.parse(grant.expires_at) <= Date.now() + 86_400_000, `expires at ${grant.expires_at}`)
  t.same((await client.streamToken()).scope, {}, 'no filter: every stream')
  t.match(await createClient({ url }).streamToken({ run_id: 'run-ca1' }).catch((error: unknown) => error), { status: 401 }, 'asked for without a token: 401')

  const [base] = await insertEvents({ run_id: 'run-ca1', event_type: 'before' })
  const signed = await client.signedStreamUrl({ run_id: 'run-ca1' }, base)
  t.match(signed, /\/api\/events\/stream\?run_id=run-ca1&after_event_id=\d+&stream_token=[^&]+$/)
  t.notOk(signed.includes(TOKEN), 'without the long-lived token')
  const source = new EventSource(signed)
  t.teardown(() => source.close())
  const received: number[] = []
  source.onmessage = (message) => received.push((JSON.parse(message.data) as Event).event_id)
  const [other, mine] = await insertEvents({ run_id: 'run-ca2' }, { run_id: 'run-ca1' })
  await waitUntil(() => received.length >= 1, 'the EventSource\'s event')
  t.same(received, [mine], 'the run\'s event, not the other run\'s')
  t.ok(other)

  const elsewhere = await fetch(client.streamUrl({ run_id: 'run-ca2' }, base, grant.token))
  t.equal(elsewhere.status, 401, 'a run\'s stream token does not open another run\'s stream')
  const open = createClient({ url: (await serve(t, { API_TOKENS: '' })).url })
  t.match(await open.signedStreamUrl({ run_id: 'run-ca1' }), /\/api\/events\/stream\?run_id=run-ca1$/, 'no token (a service that needs none): the plain URL')
})

t.test('watch({ streamTokens: true }): the stream opens with a scoped stream token and no Authorization header; reconnects reuse it', async (t) => {
  const { url } = await serve(t)
  let refuseNext = 1
  const { fetcher, requests } = recordingFetch((requestUrl) => {
    // The first stream: a 503, so that the watch reconnects.
    if (requestUrl.includes('/api/events/stream') && refuseNext-- > 0) return new Response('{"error":{"code":"unavailable","message":"busy"}}', { status: 503 })
    return undefined
  })
  const client = createClient({ url, token: TOKEN, fetch: fetcher })
  const [base] = await insertEvents({ run_id: 'run-ca1' })
  const statuses: StreamStatus[] = []
  const events = client.watch({ run_id: 'run-ca1' }, { after: base!, streamTokens: true, onStatus: (status) => statuses.push(status), maxDelayMs: 100 })
  const next = take(events, 1)
  await waitUntil(() => statuses.some((status) => status.state === 'live'), 'the stream to open')
  const [id] = await insertEvents({ run_id: 'run-ca1' })
  t.same(await next, [id])
  t.equal(grants(requests).length, 1, 'one stream token, for both attempts')
  t.match(grants(requests)[0], { url: /\/api\/stream-token\?run_id=run-ca1$/, authorization: `Bearer ${TOKEN}` }, 'asked for with the token, for the watch\'s filter')
  t.equal(streams(requests).length, 2)
  for (const stream of streams(requests)) {
    t.match(stream.url, /[?&]stream_token=[^&]+/)
    t.equal(stream.authorization, undefined, 'no Authorization header on the stream')
    t.notOk(stream.url.includes(TOKEN))
  }

  // The client's option is the default; without a token there is nothing to stand in for.
  const { url: openUrl } = await serve(t, { API_TOKENS: '' })
  const { fetcher: openFetcher, requests: openRequests } = recordingFetch()
  const [openBase] = await insertEvents({ run_id: 'run-ca2' })
  const openWatch = createClient({ url: openUrl, fetch: openFetcher, streamTokens: true }).watch({ run_id: 'run-ca2' }, { after: openBase! })
  const openNext = take(openWatch, 1)
  await waitUntil(() => streams(openRequests).length === 1, 'the stream')
  await sleep(100)
  const [openId] = await insertEvents({ run_id: 'run-ca2' })
  t.same(await openNext, [openId])
  t.equal(grants(openRequests).length, 0, 'no stream token without a token')
  t.notMatch(streams(openRequests)[0]!.url, /stream_token/)
})

t.test('watch with stream tokens: a refused stream token (401) gets a fresh one at once; two refusals in a row end it', async (t) => {
  const { url } = await serve(t)
  let spoil = 1
  const { fetcher, requests } = recordingFetch(async (requestUrl, real) => {
    if (!requestUrl.includes('/api/stream-token') || spoil-- <= 0) return undefined
    // A token the service will refuse (as it refuses an expired one), said to be good for an hour.
    const grant = await (await real()).json() as { scope: unknown }
    return Response.json({ token: 'spoiled.stream.token', expires_at: new Date(Date.now() + 3_600_000).toISOString(), scope: grant.scope })
  })
  const client = createClient({ url, token: TOKEN, fetch: fetcher, streamTokens: true })
  const [base] = await insertEvents({ run_id: 'run-ca1' })
  const statuses: StreamStatus[] = []
  const next = take(client.watch({ run_id: 'run-ca1' }, { after: base!, onStatus: (status) => statuses.push(status) }), 1)
  await waitUntil(() => statuses.some((status) => status.state === 'live'), 'the stream to open')
  const [id] = await insertEvents({ run_id: 'run-ca1' })
  t.same(await next, [id], 'the event, after one refusal')
  t.equal(grants(requests).length, 2, 'a second stream token after the first was refused')
  t.equal(streams(requests).length, 2)
  t.notOk(statuses.some((status) => status.state === 'retrying'), 'at once, not after a backoff')

  const { fetcher: spoiling, requests: spoiled } = recordingFetch(async (requestUrl, real) => {
    if (!requestUrl.includes('/api/stream-token')) return undefined
    await real()
    return Response.json({ token: 'spoiled.stream.token', expires_at: new Date(Date.now() + 3_600_000).toISOString(), scope: {} })
  })
  const refused = await take(createClient({ url, token: TOKEN, fetch: spoiling }).watch({}, { after: base!, streamTokens: true }), 1).catch((error: unknown) => error)
  t.ok(refused instanceof ApiError)
  t.match(refused, { status: 401, code: 'unauthorized', terminal: true })
  t.equal(streams(spoiled).length, 2, 'two refusals in a row, then it ends')

  const withoutAccess = await take(createClient({ url, token: 'wrong', streamTokens: true }).watch({}, { after: base! }), 1).catch((error: unknown) => error)
  t.match(withoutAccess, { status: 401, code: 'unauthorized' }, 'a token refused when asking for a stream token: 401, at once')
})

t.test('watch with stream tokens: a stream token expired by a reconnect is replaced, and no event is missed', async (t) => {
  // Stream tokens live 10 s here (the shortest allowed), with no clock tolerance.
  const { url } = await serve(t, { STREAM_TOKEN_TTL_S: 10, AUTH_CLOCK_TOLERANCE_S: 0 })
  let cut: (() => void) | undefined
  const { fetcher, requests } = recordingFetch(async (requestUrl, real) => {
    if (requestUrl.includes('/api/stream-token')) {
      // Said to be good for an hour, so that the client keeps it past its real expiry.
      const grant = await (await real()).json() as Record<string, unknown>
      return Response.json({ ...grant, expires_at: new Date(Date.now() + 3_600_000).toISOString() })
    }
    if (!requestUrl.includes('/api/events/stream')) return undefined
    const response = await real()
    if (!response.ok || cut !== undefined) return response
    // The first stream: one the test can cut, as a proxy's timeout would.
    const controller = new AbortController()
    cut = () => controller.abort()
    const reader = response.body!.getReader()
    const body = new ReadableStream<Uint8Array>({
      async pull (sink) {
        const chunk = await Promise.race([reader.read(), new Promise<{ done: true }>((resolve) => controller.signal.addEventListener('abort', () => resolve({ done: true })))])
        if (chunk.done) { await reader.cancel().catch(() => {}); sink.close() } else sink.enqueue(chunk.value)
      }
    })
    return new Response(body, { status: response.status, headers: response.headers })
  })
  const client = createClient({ url, token: TOKEN, fetch: fetcher, streamTokens: true })
  const [base] = await insertEvents({ run_id: 'run-ca1' })
  const received: number[] = []
  const controller = new AbortController()
  const watching = (async () => { for await (const event of client.watch({ run_id: 'run-ca1' }, { after: base!, signal: controller.signal })) received.push(event.event_id) })()
  t.teardown(() => controller.abort())
  await waitUntil(() => cut !== undefined, 'the stream')
  const [first] = await insertEvents({ run_id: 'run-ca1' })
  await waitUntil(() => received.length === 1, 'the first event')
  await sleep(11_000) // past the stream token's expiry: the open stream stays open
  const [during] = await insertEvents({ run_id: 'run-ca1' })
  await waitUntil(() => received.length === 2, 'an event on the stream opened before the token expired')
  cut!()
  const [gap] = await insertEvents({ run_id: 'run-ca1' })
  await waitUntil(() => received.length === 3, 'the event written while it reconnected', 60_000)
  t.same(received, [first, during, gap], 'each event once, in order')
  const reconnects = streams(requests).slice(1)
  t.equal(reconnects.length, 2, 'the reconnect with the expired token, then with a fresh one')
  t.equal(grants(requests).length, 2, 'a fresh stream token after the refusal')
  const refusedAnswer = await fetch(reconnects[0]!.url)
  t.equal(refusedAnswer.status, 401)
  t.match((await refusedAnswer.json() as { error: { message: string } }).error.message, /expired/, 'the service says the stream token expired')
  controller.abort()
  await watching
})

t.test('a JWT of a configured issuer: reads, and a watch with stream tokens', async (t) => {
  const issuer = await startIssuer(t)
  const { url } = await serve(t, { API_TOKENS: '', AUTH_ISSUERS: JSON.stringify([{ issuer: issuer.url, audience: 'ocp-api' }]) })
  const jwt = await issuer.sign()
  const { fetcher, requests } = recordingFetch()
  const client = createClient({ url, token: jwt, fetch: fetcher, streamTokens: true })
  t.equal((await client.run('run-ca1')).run.run.run_id, 'run-ca1')
  const [base] = await insertEvents({ run_id: 'run-ca1' })
  const statuses: StreamStatus[] = []
  const next = take(client.watch({ run_id: 'run-ca1' }, { after: base!, onStatus: (status) => statuses.push(status) }), 1)
  await waitUntil(() => statuses.some((status) => status.state === 'live'), 'the stream to open')
  const [id] = await insertEvents({ run_id: 'run-ca1' })
  t.same(await next, [id])
  t.notOk(requests.some((request) => request.url.includes(jwt)), 'the JWT never in a URL')
  const expired = await createClient({ url, token: await issuer.sign({}, { expiresIn: -3600 }) }).runs().catch((error: unknown) => error)
  t.match(expired, { status: 401, code: 'unauthorized', detail: /expired/ }, 'an expired JWT: 401, saying so')
})
