import { pino } from 'pino'
import t from 'tap'
import { requestLogger } from '../plugins/app/request-log.ts'
import { pathOf, withoutCredentials } from '../plugins/app/auth/url-credentials.ts'
import { redactedUrl } from '../plugins/app/db.ts'
import { buildApp } from '../app.ts'
import { build, testConfig } from './helpers/app.ts'
import { startIssuer, TEST_AUDIENCE } from './helpers/issuer.ts'
import { insertEvents, openStream } from './helpers/sse.ts'
import { waitUntil } from './helpers/wait.ts'

// Each request's logger is made when a line first goes through it (plugins/app/request-log.ts).

function capture (level: string) {
  const lines: Array<Record<string, unknown>> = []
  const parent = pino({ level }, { write: (line: string) => { lines.push(JSON.parse(line)) } })
  let children = 0
  const child = parent.child
  parent.child = function (this: pino.Logger, ...args: Parameters<typeof child>) { children++; return child.apply(this, args) } as typeof child
  return { parent, lines, children: () => children }
}

t.test('a line at a level that is off makes no child; one that is on makes it once, with the bindings', async (t) => {
  const { parent, lines, children } = capture('warn')
  const log = requestLogger(parent, { reqId: 'r-1' }, {})
  log.info('not written')
  log.debug('not written')
  log.trace('not written')
  log.silent('never written')
  t.equal(children(), 0, 'nothing made')
  t.equal(log.level, 'warn')
  t.notOk((log as unknown as pino.Logger).isLevelEnabled('info'))
  log.warn('first')
  log.error({ n: 2 }, 'second')
  log.fatal('third')
  t.equal(children(), 1, 'made once')
  t.same(lines.map((line) => [line.msg, line.reqId]), [['first', 'r-1'], ['second', 'r-1'], ['third', 'r-1']])
  t.equal(lines[1]!.n, 2)
})

t.test('its level can be raised for one request; its children carry both bindings', async (t) => {
  const { parent, lines } = capture('warn')
  const log = requestLogger(parent, { reqId: 'r-2' }, {})
  log.level = 'debug'
  t.equal(log.level, 'debug')
  t.equal(parent.level, 'warn', 'the parent keeps its level')
  log.debug('now written')
  log.child({ part: 'x' }).info('from a child')
  t.same(lines.map((line) => [line.msg, line.reqId, line.part]), [['now written', 'r-2', undefined], ['from a child', 'r-2', 'x']])
})

t.test('a route\'s own log level makes the child at once, at that level', async (t) => {
  const { parent, lines, children } = capture('warn')
  const log = requestLogger(parent, { reqId: 'r-3' }, { level: 'info' })
  t.equal(children(), 1)
  log.info('written at the route\'s level')
  t.equal(lines.length, 1)
})

t.test('in the application: a warning of a request carries its id', async (t) => {
  const lines: Array<{ msg: string, reqId?: string, level: number }> = []
  const app = await buildApp(await testConfig(), { logger: { level: 'warn', stream: { write: (line: string) => { lines.push(JSON.parse(line)) } } } })
  t.teardown(() => app.close())
  app.get('/test/warn', async (request) => {
    request.log.info('off at warn')
    request.log.warn('a warning')
    return { ok: true }
  })
  await app.inject({ url: '/test/warn', headers: { 'x-request-id': 'warn-1' } })
  t.same(lines.filter((line) => line.reqId === 'warn-1').map((line) => line.msg), ['a warning'])
})

t.test('no credential reaches a log line, in any spelling the query parser accepts; nor a database password', async (t) => {
  const raw: string[] = []
  const stream = { write: (line: string) => { raw.push(line) } }
  const database = new URL((await testConfig()).DATABASE_URL!)
  database.password = 'db-secret-0'
  database.searchParams.set('password', 'db-secret-1')
  database.searchParams.set('sslpassword', 'db-secret-2')
  const app = await build(t, { API_TOKENS: 'sekret-token', AUTH_ALLOW_TOKEN_IN_URL: true, DATABASE_URL: database.href }, { logger: { level: 'info', stream } })
  const { token: streamToken } = (await app.inject({ url: '/api/stream-token', headers: { authorization: 'Bearer sekret-token' } })).json()
  // Spellings the parser reads as the credential: the service accepts them.
  for (const name of ['stream_token', 'stream%5Ftoken', '%73tream_token', 'stream%5ftoken']) {
    t.equal((await app.inject({ method: 'HEAD', url: `/api/streams/events?${name}=${streamToken}` })).statusCode, 200, `${name} opens the stream`)
  }
  t.equal((await app.inject({ method: 'HEAD', url: '/api/streams/events?access%5Ftoken=sekret-token' })).statusCode, 200, 'access%5Ftoken (AUTH_ALLOW_TOKEN_IN_URL)')
  // And those it does not, which a parser in front might.
  await app.inject({ url: '/api/events?a=1;stream_token=semicolon-secret' })
  await app.inject({ url: '/api/events?Stream_Token=case-secret&limit=1' })
  const text = raw.join('')
  for (const secret of ['sekret-token', streamToken.split('.')[2], 'semicolon-secret', 'case-secret', 'db-secret-0', 'db-secret-1', 'db-secret-2']) {
    t.notOk(text.includes(secret), `${secret.slice(0, 12)}... is in no log line`)
  }
  const urls = raw.map((line) => JSON.parse(line)).filter((line) => line.msg === 'request').map((line) => line.url)
  t.ok(urls.includes('/api/streams/events?%73tream_token=[redacted]'), 'the parameter\'s name stays, as written')
  t.ok(urls.includes('/api/events?a=1;stream_token=[redacted]'))
  t.match(text, /"database":"postgres:\/\/postgres:\*\*\*@[^"]*password=\*\*\*&sslpassword=\*\*\*"/, 'the database URL is logged with every password starred')
})

t.test('withoutCredentials and pathOf: the query\'s credentials, whatever their spelling', async (t) => {
  t.equal(withoutCredentials('/api/runs'), '/api/runs', 'no query')
  t.equal(withoutCredentials('/s?stream+token=x&%zz=y&stream_token&access_token=z#f'), '/s?stream+token=x&%zz=y&stream_token&access_token=[redacted]', 'malformed escapes and names without a value stay')
  t.equal(pathOf('/api/streams/events?stream_token=x'), '/api/streams/events')
  t.equal(pathOf('/api/runs'), '/api/runs')
  t.equal(redactedUrl('postgres://ocp@db/ocp?sslmode=require'), 'postgres://ocp@db/ocp?sslmode=require', 'nothing to star')
})

t.test('an audit trail: each line names its principal; a stream\'s line comes when it ends, whoever ends it, with the events it sent', async (t) => {
  const lines: Array<Record<string, unknown>> = []
  const stream = { write: (line: string) => { lines.push(JSON.parse(line)) } }
  const issuer = await startIssuer(t)
  const app = await build(t, {
    API_TOKENS: 'ci:ci-secret,bare-secret',
    AUTH_ISSUERS: JSON.stringify([{ issuer: issuer.url, audience: TEST_AUDIENCE }]),
    EVENTS_POLL_INTERVAL_MS: 20,
    DURABLE_STREAMS_LONG_POLL_MS: 100,
    DURABLE_STREAMS_SSE_MAX_MS: 300
  }, { logger: { level: 'info', stream } })
  await app.listen({ port: 0, host: '127.0.0.1' })
  const base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`
  const lineOf = (id: string) => lines.find((line) => line.msg === 'request' && line.reqId === id)
  const get = (url: string, id: string, token?: string) => fetch(`${base}${url}`, { headers: { 'x-request-id': id, ...(token === undefined ? {} : { authorization: `Bearer ${token}` }) } })

  await (await get('/api/runs', 'named', 'ci-secret')).text()
  await (await get('/api/runs', 'bare', 'bare-secret')).text()
  await (await get('/api/runs', 'jwt', await issuer.sign({ sub: 'ada' }))).text()
  await (await get('/api/runs', 'nobody')).text()
  t.match(lineOf('named'), { principal: 'token ci', credential: 'static', statusCode: 200 }, 'a static token by its name')
  t.match(lineOf('bare'), { principal: 'token token-2', credential: 'static' }, 'an unnamed one by its place in API_TOKENS')
  t.match(lineOf('jwt'), { principal: `${issuer.url} ada`, credential: 'jwt' }, 'a JWT by its issuer and subject')
  t.match(lineOf('nobody'), { statusCode: 401 })
  t.notOk('principal' in lineOf('nobody')!, 'a refused request proved no one')

  const { token } = await (await get('/api/stream-token', 'token', 'ci-secret')).json() as { token: string }
  const [first] = await insertEvents({ event_type: 'audit' })
  const hungUp = await openStream(base, `/api/events/stream?after_event_id=${first! - 1}&stream_token=${token}`, { 'x-request-id': 'hung-up' })
  await insertEvents({ event_type: 'audit' })
  await hungUp.waitFor((s) => s.events().length === 2)
  t.notOk(lineOf('hung-up'), 'no line while the stream is open')
  hungUp.close()
  await waitUntil(() => lineOf('hung-up') !== undefined, 'the hung-up stream\'s line')
  t.match(lineOf('hung-up'), { principal: 'token ci', credential: 'stream', route: '/api/events/stream', statusCode: 200, eventsSent: 2, hungUp: true }, 'a stream its client ended: whose, how many events')
  t.type(lineOf('hung-up')!.responseTimeMs, 'number')

  await (await get('/api/streams/events?offset=now&live=sse', 'ended', 'ci-secret')).text()
  await waitUntil(() => lineOf('ended') !== undefined, 'the ended stream\'s line')
  t.match(lineOf('ended'), { principal: 'token ci', eventsSent: 0, hungUp: false }, 'a Durable Streams SSE stream the service ended (DURABLE_STREAMS_SSE_MAX_MS)')

  await (await get('/api/streams/events?offset=now&live=long-poll', 'long-poll', 'ci-secret')).text()
  await waitUntil(() => lineOf('long-poll') !== undefined, 'the long-poll\'s line')
  t.match(lineOf('long-poll'), { statusCode: 204, eventsSent: 0, hungUp: false }, 'a long-poll answered')
  await (await get('/api/streams/events?offset=-1', 'catch-up', 'ci-secret')).text()
  await waitUntil(() => lineOf('catch-up') !== undefined, 'the catch-up\'s line')
  t.match(lineOf('catch-up'), { statusCode: 200, hungUp: false }, 'a catch-up read: one line too')
  t.equal(lines.filter((line) => line.reqId === 'hung-up' && line.msg === 'request').length, 1, 'one line per stream')
})

t.test('API_TOKENS: name:token, or a bare token named by its place', async (t) => {
  const { namedTokens, StaticTokens } = await import('../plugins/app/auth/static-tokens.ts')
  const tokens = namedTokens(['ci:abc', 'plain', 'has a space:x', 'x:'])
  t.same(tokens, [{ name: 'ci', token: 'abc' }, { name: 'token-2', token: 'plain' }, { name: 'token-3', token: 'has a space:x' }, { name: 'token-4', token: 'x:' }])
  const matcher = new StaticTokens(tokens)
  t.equal(matcher.matches('abc'), 'ci')
  t.equal(matcher.matches('ci:abc'), undefined, 'the name is not part of the token')
  t.equal(matcher.matches('nope'), undefined)
})

t.test('callerOf: a JWT without a subject is its issuer alone', async (t) => {
  const { callerOf } = await import('../plugins/app/auth/index.ts')
  t.equal(callerOf({ kind: 'jwt', issuer: 'https://issuer.example', subject: undefined, expires: 0 }), 'https://issuer.example')
  t.equal(callerOf({ kind: 'jwt', issuer: 'https://issuer.example', subject: 'ada', expires: 0 }), 'https://issuer.example ada')
})
