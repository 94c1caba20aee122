import { once } from 'node:events'
import { connect } from 'node:net'
import { brotliDecompressSync, gunzipSync } from 'node:zlib'
import type { LightMyRequestResponse } from 'fastify'
import t from 'tap'
import { buildApp } from '../app.ts'
import { START_GRACE_MS } from '../plugins/external/under-pressure.ts'
import { build, holdClose, keptAliveConnection, testConfig } from './helpers/app.ts'
import { insertGraph, lockTable, makeRun, makeTask } from './helpers/fixtures.ts'
import { openStream } from './helpers/sse.ts'
import { waitUntil } from './helpers/wait.ts'

// The operations kit: request ids and logs, readiness, metrics, auth, CORS,
// compression, load shedding, shutdown.

t.before(() => insertGraph({
  runs: Array.from({ length: 12 }, (_, i) => makeRun({ run_id: `run-ops-${i}`, summary: 'x'.repeat(200) })),
  tasks: [makeTask({ run_id: 'run-ops-0', task_id: 'task-ops' })]
}))

interface LogLine { msg: string, reqId?: string, url?: string, statusCode?: number, method?: string, route?: string, responseTimeMs?: number }

function captureLogs () {
  const lines: LogLine[] = []
  const raw: string[] = []
  return { lines, raw, stream: { write: (line: string) => { raw.push(line); lines.push(JSON.parse(line)) } } }
}

t.test('request ids: an incoming X-Request-Id is honoured and echoed, else one is made', async (t) => {
  const app = await build(t)
  const given = await app.inject({ url: '/api/runs', headers: { 'x-request-id': 'trace-abc.123' } })
  t.equal(given.headers['x-request-id'], 'trace-abc.123')
  const made = await app.inject('/api/runs')
  const UUID_V4 = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/
  t.match(made.headers['x-request-id'], UUID_V4, 'a version 4 UUID')
  const more = await Promise.all(Array.from({ length: 100 }, () => app.inject('/health')))
  t.equal(new Set([made, ...more].map((response) => response.headers['x-request-id'])).size, 101, 'each request its own')
  const hostile = await app.inject({ url: '/api/runs', headers: { 'x-request-id': 'evil\u0001id with spaces' } })
  t.match(hostile.headers['x-request-id'], /^[0-9a-f-]{36}$/, 'a malformed id is replaced, not echoed')
  const long = await app.inject({ url: '/health', headers: { 'x-request-id': 'a'.repeat(129) } })
  t.not(long.headers['x-request-id'], 'a'.repeat(129))
  const error = await app.inject({ url: '/api/runs/nope', headers: { 'x-request-id': 'on-errors-too' } })
  t.equal(error.headers['x-request-id'], 'on-errors-too')
})

t.test('logs: one JSON line per request with its id; no token or authorization is ever logged', async (t) => {
  const { lines, raw, stream } = captureLogs()
  const app = await build(t, { API_TOKENS: 'sekret-token' }, { logger: { level: 'info', stream } })
  await app.inject({ url: '/api/runs', headers: { 'x-request-id': 'req-1', authorization: 'Bearer sekret-token' } })
  await app.inject({ url: '/api/runs/nope', headers: { 'x-request-id': 'req-2', authorization: 'Bearer sekret-token' } })
  await app.inject({ url: '/api/events?access_token=sekret-token&limit=1', headers: { 'x-request-id': 'req-3' } })
  const { token: streamToken } = (await app.inject({ url: '/api/stream-token', headers: { authorization: 'Bearer sekret-token' } })).json()
  await app.inject({ method: 'HEAD', url: `/api/streams/events?stream_token=${streamToken}`, headers: { 'x-request-id': 'req-5' } })
  const requests = lines.filter((line) => line.msg === 'request')
  t.same(requests.map((line) => line.reqId).filter((id) => id !== undefined && id.startsWith('req-')), ['req-1', 'req-2', 'req-3', 'req-5'], 'one line per request')
  t.match(requests[0], { method: 'GET', url: '/api/runs', route: '/api/runs', statusCode: 200 })
  t.type(requests[0]!.responseTimeMs, 'number')
  t.equal(requests[1]!.statusCode, 404)
  t.equal(requests[2]!.url, '/api/events?access_token=[redacted]&limit=1')
  t.equal(requests.find((line) => line.reqId === 'req-5')!.url, '/api/streams/events?stream_token=[redacted]')
  t.notMatch(raw.join('\n'), /sekret-token/, 'the token appears in no log line')
  t.notOk(raw.join('\n').includes(streamToken.split('.')[2]), 'nor a stream token\'s signature')
  t.equal(lines.filter((line) => line.reqId === 'req-1').length, 1, 'nothing else is logged for a plain request')
})

t.test('/ready: 200 when the database answers, 503 when not; /health stays 200', async (t) => {
  const app = await build(t)
  const ready = await app.inject('/ready')
  t.equal(ready.statusCode, 200)
  t.same(ready.json(), { status: 'ready' })
  const down = await build(t, { DATABASE_URL: 'postgres://postgres@127.0.0.1:1/none', DB_CONNECT_TIMEOUT_MS: 300 })
  const notReady = await down.inject('/ready')
  t.equal(notReady.statusCode, 503)
  t.equal(notReady.json().error.code, 'unavailable')
  t.equal((await down.inject('/health')).statusCode, 200)
})

t.test('/metrics before the poller has read anything: no lag, head 0', async (t) => {
  const app = await build(t, { EVENTS_POLL_INTERVAL_MS: 60_000 })
  const text = (await app.inject('/metrics')).body
  t.match(text, /^event_poller_lag_seconds -1$/m)
  t.match(text, /^event_poller_head 0$/m)
  t.match(text, /^event_settle_wait_seconds 0$/m)
})

t.test('/metrics: requests by route and status, the pool, streams, the poller', async (t) => {
  const app = await build(t, { EVENTS_POLL_INTERVAL_MS: 20 })
  await app.inject('/api/runs')
  await app.inject('/api/runs')
  await app.inject('/api/runs/run-ops-0')
  await app.inject('/api/runs/nope')
  await app.inject('/no/such/route')
  await app.inject('/openapi.json') // a route added before the application's plugins
  const together = await Promise.all([app.inject('/api/runs/run-ops-1'), app.inject('/api/runs/run-ops-1')])
  t.same(together.map((res) => res.statusCode), [200, 200])
  await waitUntil(() => app.events.hub.lastPollAt > 0, 'the poller\'s first read') // else the lag is -1
  const res = await app.inject('/metrics')
  t.equal(res.statusCode, 200)
  t.match(res.headers['content-type'], /^text\/plain/)
  const text = res.body
  t.match(text, /http_requests_total\{method="GET",route="\/api\/runs",status_code="200"\} 2/)
  t.match(text, /http_requests_total\{method="GET",route="\/api\/runs\/:runID",status_code="200"\} 3/)
  t.match(text, /http_requests_total\{method="GET",route="\/api\/runs\/:runID",status_code="404"\} 1/)
  t.match(text, /http_requests_total\{method="GET",route="unmatched",status_code="404"\} 1/)
  t.match(text, /http_requests_total\{method="GET",route="\/openapi.json",status_code="200"\} 1/)
  t.match(text, /http_request_duration_seconds_bucket\{le="0\.1",method="GET",route="\/api\/runs",status_code="200"\} \d/)
  t.match(text, /db_pool_connections\{state="total"\} \d/)
  t.match(text, /db_pool_connections\{state="idle"\} \d/)
  t.match(text, /db_pool_connections\{state="waiting"\} 0/)
  t.match(text, /db_pipelined_connections\{state="open"\} [1-4]\n/, "the API's reads went to pipelined connections")
  t.match(text, /db_pipelined_connections\{state="in_flight"\} 0\n/)
  t.match(text, /db_reads_total\{statement="own"\} 5\n/, 'the list twice, the run, the unknown run, the run read twice at once')
  t.match(text, /db_reads_total\{statement="shared"\} 1\n/, 'the second of the two arriving together')
  t.match(text, /event_streams_open 0/)
  const lag = Number(/^event_poller_lag_seconds (\S+)$/m.exec(text)?.[1])
  t.ok(lag >= 0 && lag < 1, `poller lag ${lag} s`)
  t.match(text, /event_poller_head \d+/)
  t.match(text, /process_resident_memory_bytes \d+/)
})

t.test('auth: off by default; with API_TOKENS, /api and /metrics need a bearer token', async (t) => {
  const open = await build(t)
  t.equal((await open.inject('/api/runs')).statusCode, 200, 'no token needed when none is configured')

  const app = await build(t, { API_TOKENS: 'token-alpha, token-beta' })
  await app.listen({ port: 0, host: '127.0.0.1' })
  const { port } = app.server.address() as { port: number }
  for (const headers of [{}, { authorization: 'Bearer wrong' }, { authorization: 'Basic dG9rZW4tYWxwaGE=' }, { authorization: 'Bearer' }, { authorization: 'token-alpha' }]) {
    for (const url of ['/api/runs', '/api/runs/run-ops-0', '/api/events', '/metrics']) {
      const res = await app.inject({ url, headers })
      t.equal(res.statusCode, 401, `${url} ${JSON.stringify(headers)}`)
      t.equal(res.json().error.code, 'unauthorized')
      t.match(res.headers['www-authenticate'], 'authorization' in headers ? /^Bearer realm="ocp-api", error="invalid_token", error_description="[^"]+"$/ : /^Bearer realm="ocp-api"$/)
    }
  }
  for (const token of ['token-alpha', 'token-beta']) {
    t.equal((await app.inject({ url: '/api/runs', headers: { authorization: `Bearer ${token}` } })).statusCode, 200, token)
    t.equal((await app.inject({ url: '/metrics', headers: { authorization: `bearer ${token}` } })).statusCode, 200)
  }
  for (const url of ['/health', '/ready', '/docs/', '/openapi.json', '/api/auth']) {
    t.equal((await app.inject(url)).statusCode, 200, `${url} stays open`)
  }
  t.equal((await app.inject('/api/runs?access_token=token-alpha')).statusCode, 401, 'a token in the URL opens no read')

  const base = `http://127.0.0.1:${port}`
  const refused = await openStream(base, '/api/events/stream')
  t.equal(refused.status, 401)
  await refused.ended
  const byQuery = await openStream(base, '/api/events/stream?access_token=token-beta')
  t.equal(byQuery.status, 401, 'a long-lived token in a stream\'s URL is refused by default')
  await byQuery.ended
  const byHeader = await openStream(base, '/api/events/stream', { authorization: 'Bearer token-alpha' })
  t.equal(byHeader.status, 200)
  byHeader.close()

  const lenient = await build(t, { API_TOKENS: 'token-alpha', AUTH_ALLOW_TOKEN_IN_URL: true })
  await lenient.listen({ port: 0, host: '127.0.0.1' })
  const lenientBase = `http://127.0.0.1:${(lenient.server.address() as { port: number }).port}`
  const allowed = await openStream(lenientBase, '/api/events/stream?access_token=token-alpha')
  t.equal(allowed.status, 200, 'AUTH_ALLOW_TOKEN_IN_URL: the stream takes its token in the query')
  allowed.close()
  const badQuery = await openStream(lenientBase, '/api/events/stream?access_token=nope')
  t.equal(badQuery.status, 401)
  await badQuery.ended
  t.equal((await lenient.inject('/api/runs?access_token=token-alpha')).statusCode, 401, 'and only the stream routes do')
})

t.test('CORS: off by default; an allowlisted origin gets its headers and the preflight', async (t) => {
  const closed = await build(t)
  const plain = await closed.inject({ url: '/api/runs', headers: { origin: 'https://ui.example' } })
  t.notOk(plain.headers['access-control-allow-origin'], 'no CORS unless configured')

  const app = await build(t, { CORS_ORIGINS: 'https://ui.example, https://other.example' })
  const preflight = await app.inject({
    method: 'OPTIONS',
    url: '/api/events/stream',
    headers: { origin: 'https://ui.example', 'access-control-request-method': 'GET', 'access-control-request-headers': 'last-event-id' }
  })
  t.equal(preflight.statusCode, 204)
  t.equal(preflight.headers['access-control-allow-origin'], 'https://ui.example')
  t.match(preflight.headers['access-control-allow-headers'], /Last-Event-ID/i)
  const allowed = await app.inject({ url: '/api/runs', headers: { origin: 'https://other.example' } })
  t.equal(allowed.headers['access-control-allow-origin'], 'https://other.example')
  t.match(allowed.headers['access-control-expose-headers'], /X-Event-Cursor/)
  const other = await app.inject({ url: '/api/runs', headers: { origin: 'https://evil.example' } })
  t.notOk(other.headers['access-control-allow-origin'], 'an origin not listed gets nothing')

  const any = await build(t, { CORS_ORIGINS: '*' })
  t.equal((await any.inject({ url: '/api/runs', headers: { origin: 'https://x.example' } })).headers['access-control-allow-origin'], '*')
})

t.test('compression: gzip and brotli for JSON above the threshold, never for the stream', async (t) => {
  const app = await build(t)
  const plain = await app.inject('/api/runs')
  t.ok(plain.rawPayload.length > 1024, 'the run list is above the 1 kB threshold')
  const gzip = await app.inject({ url: '/api/runs', headers: { 'accept-encoding': 'gzip' } })
  t.equal(gzip.headers['content-encoding'], 'gzip')
  t.same(JSON.parse(gunzipSync(gzip.rawPayload).toString()), plain.json())
  const brotli = await app.inject({ url: '/api/runs', headers: { 'accept-encoding': 'br' } })
  t.equal(brotli.headers['content-encoding'], 'br')
  t.same(JSON.parse(brotliDecompressSync(brotli.rawPayload).toString()), plain.json())
  t.equal(brotli.headers['x-event-cursor'], plain.headers['x-event-cursor'], 'headers survive compression')
  const small = await app.inject({ url: '/health', headers: { 'accept-encoding': 'gzip' } })
  t.notOk(small.headers['content-encoding'], 'small bodies are sent as they are')

  await app.listen({ port: 0, host: '127.0.0.1' })
  const { port } = app.server.address() as { port: number }
  const stream = await openStream(`http://127.0.0.1:${port}`, '/api/events/stream?after_event_id=0', { 'accept-encoding': 'gzip, br' })
  t.equal(stream.status, 200)
  t.notOk(stream.headers['content-encoding'], 'the event stream is never compressed')
  t.equal(stream.headers['content-type'], 'text/event-stream')
  stream.close()
})

t.test('load shedding: a saturated event loop answers 503 at once; liveness still answers', async (t) => {
  // under-pressure samples the mean event-loop delay every 250 ms: a 1 s
  // block raises the mean of the sample that records it well past 20 ms.
  // That is the first sample after the block, or, when the sampler's timer
  // runs before the delay histogram's, the one after: wait for it.
  const app = await build(t, { MAX_EVENT_LOOP_DELAY_MS: 20, DURABLE_STREAMS_LONG_POLL_MS: 100 })
  await insertGraph({ runs: [makeRun({ run_id: 'shed-long-poll' })] })
  // The start's grace, which the first request begins, is over.
  await app.inject('/health')
  await new Promise((resolve) => setTimeout(resolve, START_GRACE_MS))
  const until = Date.now() + 1000
  while (Date.now() < until) { /* block the event loop, as a stuck request would */ }
  let shed!: LightMyRequestResponse
  await waitUntil(async () => (shed = await app.inject('/api/runs')).statusCode !== 200, 'a request to be shed')
  t.equal(shed.statusCode, 503)
  t.same(shed.json(), { error: { code: 'unavailable', message: 'the service is overloaded, try again shortly' } })
  t.equal(shed.headers['retry-after'], '2')
  t.equal((await app.inject('/health')).statusCode, 200, '/health is never shed')
  // A Durable Streams long-poll waits in memory: not shed for event-loop delay.
  const [catchUp, longPoll] = await Promise.all([
    app.inject('/api/streams/runs/shed-long-poll?offset=now'),
    app.inject('/api/streams/runs/shed-long-poll?offset=now&live=long-poll')
  ])
  t.equal(catchUp.statusCode, 503, 'a catch-up read is shed')
  t.not(longPoll.statusCode, 503, 'a long-poll of the same stream is not')
})

t.test('load shedding: a slow start is not load (the first requests after it are served)', async (t) => {
  // A start whose last step blocks the event loop for a second, as compiling
  // does on a busy machine: the sample that records the block (under-pressure
  // samples every 250 ms) is the start's, and the first request that meets it
  // is served. That sample lasts until the next one: on a loaded machine the
  // wait for it can miss it, so start again, a few times, until it is met.
  const statuses = new Set<number>()
  let servedUnderStartDelay = false
  for (let start = 0; start < 5 && !servedUnderStartDelay; start++) {
    const app = await buildApp(await testConfig({ MAX_EVENT_LOOP_DELAY_MS: 20 }))
    app.addHook('onReady', async () => {
      const until = Date.now() + 1000
      while (Date.now() < until) { /* compiling */ }
    })
    await app.ready()
    const sampleWindowEnds = Date.now() + 1000
    while (Date.now() < sampleWindowEnds && app.memoryUsage().eventLoopDelay <= 20) await new Promise((resolve) => setTimeout(resolve, 5))
    const delayed = app.memoryUsage().eventLoopDelay > 20
    const { statusCode } = await app.inject('/api/runs')
    statuses.add(statusCode)
    servedUnderStartDelay = delayed && statusCode === 200
    await app.close()
  }
  t.same([...statuses], [200], 'the first request after the start is served')
  t.ok(servedUnderStartDelay, 'served while the sampled delay was the start\'s')
})

t.test('shutdown: late requests get the envelope, streams end, in-flight requests finish and their connections close', async (t) => {
  const app = await build(t, { EVENTS_POLL_INTERVAL_MS: 20, DB_STATEMENT_TIMEOUT_MS: 10_000 })
  await app.listen({ port: 0, host: '127.0.0.1' })
  const { port } = app.server.address() as { port: number }
  const url = `http://127.0.0.1:${port}`
  const stream = await openStream(url, '/api/events/stream')
  const kept = await keptAliveConnection(url)
  // A request held in flight (by a lock) across the start of the shutdown, on a keep-alive connection.
  const release = await lockTable('runs')
  const socket = connect({ port, host: '127.0.0.1' })
  let received = ''
  socket.on('data', (chunk) => { received += chunk.toString() })
  const socketClosed = new Promise((resolve) => socket.on('close', resolve))
  const arrived = once(app.server, 'request')
  socket.write('GET /api/runs/run-ops-0 HTTP/1.1\r\nHost: localhost\r\n\r\n')
  await arrived
  const hold = holdClose(app)
  const closing = app.close()
  await hold.entered
  const late = await kept.late('/api/runs')
  t.equal(late.statusCode, 503, 'a late request on a kept-alive connection was refused')
  t.equal(late.headers.connection, 'close')
  t.equal(late.body, '{"error":{"code":"unavailable","message":"the service is shutting down, retry on another instance"}}')
  hold.release()
  await stream.ended
  t.pass('the open stream was ended')
  await release()
  await socketClosed
  await closing
  t.match(received, /^HTTP\/1\.1 200 /, 'the in-flight request finished normally')
  t.match(received, /\r\nconnection: close\r\n/i, 'its connection closed after it, so the close waits for no client')
  t.match(received, /"run_id": "run-ops-0"/)
})
