import { sql } from 'kysely'
import { connect } from 'node:net'
import t from 'tap'
import type { LogState } from '../events/statements.ts'
import { ACCEPTS, eventIdErrorsNamed } from '../errors.ts'
import { encodeOffset } from '../events/durable/offsets.ts'
import { assertPositionKept } from '../events/reader.ts'
import { MAX_ID_LENGTH } from '../schemas/api.ts'
import { build } from './helpers/app.ts'
import { assertSchema } from './helpers/contract.ts'
import { insertGraph, makeRun, writer } from './helpers/fixtures.ts'
import { insertEvents, openStream } from './helpers/sse.ts'
import { waitUntil } from './helpers/wait.ts'

// No input reaching a path or query parameter produces a 500 (docs/reference.md, "Errors").

t.before(() => insertGraph({ runs: [makeRun({ run_id: 'a/b' }), makeRun({ run_id: 'émoji-🚀' }), makeRun({ run_id: "x' OR '1'='1" })] }))

const routes = (id: string) => [`/api/runs/${id}`, `/api/runs/${id}/tasks`, `/api/runs/${id}/blocked`, `/api/threads/${id}`]

t.test('hostile ids answer 400 or 404 with the envelope, never 500', async (t) => {
  const app = await build(t)
  const ids = [
    '%00', 'a%00b', '%zz', '%', '%C3%28', '%ED%A0%80', '%FF%FE', 'x'.repeat(10_000), '%F0%9F%9A%80',
    encodeURIComponent("'; drop table runs; --"), encodeURIComponent('1 OR 1=1'), encodeURIComponent('${jndi}'), // eslint-disable-line no-template-curly-in-string -- a hostile id, not a template
    '..%2F..%2Fetc%2Fpasswd', encodeURIComponent('{"a":1}'), '%E2%80%AE', encodeURIComponent('\u0001\u001f\u007f'),
    encodeURIComponent('\\'), 'a%2Fb%2Fc'
  ]
  for (const id of ids) {
    for (const url of routes(id)) {
      const res = await app.inject(url)
      const name = `${url.slice(0, 60)} -> ${res.statusCode}`
      t.ok([400, 404].includes(res.statusCode), name)
      t.match(res.headers['content-type'], /^application\/json/, name)
      assertSchema(t, 'ErrorEnvelope', res.json(), name)
      t.equal(res.json().error.code, res.statusCode === 400 ? 'bad_request' : 'not_found', name)
      t.notMatch(res.body, /select|stack|at .*\.ts|syntax/i, 'no SQL or stack in the message')
    }
  }
})

t.test('NUL and bad percent-encoding are 400 bad_request', async (t) => {
  const app = await build(t)
  for (const url of ['/api/runs/a%00b', '/api/runs/%zz', '/api/threads/%C3%28', '/api/runs/%']) {
    const res = await app.inject(url)
    t.equal(res.statusCode, 400, url)
    t.equal(res.json().error.code, 'bad_request', url)
  }
})

t.test('ids that are valid text reach the database: %2F, emoji, SQL text', async (t) => {
  const app = await build(t)
  for (const id of ['a/b', 'émoji-🚀', "x' OR '1'='1"]) {
    const res = await app.inject(`/api/runs/${encodeURIComponent(id)}`)
    t.equal(res.statusCode, 200, id)
    t.equal(res.json().run.run.run_id, id)
  }
  const tasks = await app.inject('/api/runs/a%2Fb/tasks')
  t.same(tasks.json(), { tasks: [] }, '%2F stays inside the id')
})

t.test('an id longer than the routed maximum is 404 without a query', async (t) => {
  const app = await build(t)
  const res = await app.inject(`/api/runs/${'y'.repeat(MAX_ID_LENGTH + 1)}`)
  t.equal(res.statusCode, 404)
  t.equal(res.json().error.code, 'not_found')
})

t.test('unknown routes and methods answer 404 not_found (a write to /api: 405, test/strict-requests.test.ts)', async (t) => {
  const app = await build(t)
  for (const [method, url] of [['GET', '/nope'], ['GET', '/api'], ['GET', '/api/run'], ['GET', '/api/runs/x/y/z'], ['PUT', '/health'], ['POST', '/']] as const) {
    const res = await app.inject({ method, url })
    t.equal(res.statusCode, 404, `${method} ${url}`)
    t.same(res.json(), { error: { code: 'not_found', message: 'route not found' } })
  }
})

t.test('trailing slashes route like their bare paths', async (t) => {
  const app = await build(t)
  t.equal((await app.inject('/api/runs/')).statusCode, 200)
  t.equal((await app.inject('/health/')).statusCode, 200)
})

t.test('a request body on a GET is ignored or refused, never a 500', async (t) => {
  const app = await build(t)
  const res = await app.inject({ method: 'GET', url: '/api/runs', headers: { 'content-type': 'application/x-nope' }, payload: 'zzz' })
  t.ok(res.statusCode < 500)
})

t.test('HTTP-level garbage gets the envelope from the parser hook', async (t) => {
  const app = await build(t)
  await app.listen({ port: 0, host: '127.0.0.1' })
  const { port } = app.server.address() as { port: number }
  const exchange = (raw: string) => new Promise<string>((resolve, reject) => {
    const socket = connect(port, '127.0.0.1', () => socket.end(raw))
    let data = ''
    socket.on('data', (chunk) => { data += chunk.toString() })
    socket.on('end', () => resolve(data))
    socket.on('error', reject)
  })
  const garbage = await exchange('NOT HTTP AT ALL\r\n\r\n')
  t.match(garbage, /^HTTP\/1\.1 400 /)
  t.match(garbage, /\{"error":\{"code":"bad_request","message":"malformed HTTP request"\}\}$/)
  const huge = await exchange(`GET /api/runs?q=${'a'.repeat(70_000)} HTTP/1.1\r\nHost: x\r\n\r\n`)
  t.match(huge, /^HTTP\/1\.1 400 /)
  t.match(huge, /"code":"bad_request"/)
})

// ---- one sentence per parameter (errors.ts, ACCEPTS) ------------------------

/** What a 400 about a parameter must never say: the validator's words. */
const VALIDATOR_WORDS = ['pattern', 'constant', 'querystring/', 'params/', 'headers/', 'must be string', 'must match', 'must NOT', 'anyOf', 'allowed values']

const LIMIT = 'limit must be an integer from 1 to 1000'
const RUN_ID = 'run_id must be a non-empty id with no NUL character'
const THREAD_ID = 'thread_id must be a non-empty id with no NUL character'
const AFTER_EVENT_ID = 'after_event_id must be an event_id: an integer from 0 to 9007199254740991'
const OFFSET = 'offset must be -1 (the oldest event kept), now (the tail), or a Stream-Next-Offset this service sent, and a live read must give one'

/** Each parameter, the one message of its 400s, and requests that get it wrong in every way there is ([url, headers]). */
const wrongParameters: Array<{ name: string, message: string, requests: Array<[string, Record<string, string>?]> }> = [
  {
    name: 'limit',
    message: LIMIT,
    requests: ['0', '5000', '1001', '-1', 'abc', '1.5', '1e3', '', '05', '%2B5', '99999999999999999999', '1&limit=2'].flatMap((value) =>
      ['/api/runs', '/api/runs/run-a/tasks', '/api/events'].map((path): [string] => [`${path}?limit=${value}`]))
  },
  {
    name: 'cursor',
    message: 'cursor must be the page key of a Link: rel="next" URL, unchanged',
    requests: ['', '%00', 'not*base64', 'zzzz', 'e30', 'A'.repeat(600), 'a&cursor=b', Buffer.from('["yesterday","x"]').toString('base64url')].flatMap((value) =>
      ['/api/runs', '/api/runs/run-a/tasks'].map((path): [string] => [`${path}?cursor=${value}`]))
  },
  {
    name: 'status',
    message: 'status must name one or more run statuses, separated by commas',
    requests: ['', ',', ',,', '%00', 'a&status=b'].map((value) => [`/api/runs?status=${value}`])
  },
  {
    name: 'run_id',
    message: RUN_ID,
    requests: [
      ...['', '%00', 'a%00b', 'a&run_id=b'].flatMap((value) => ['/api/events', '/api/events/stream'].map((path): [string] => [`${path}?run_id=${value}`])),
      ...['/api/runs/%00', '/api/runs/a%00b/tasks', '/api/runs/%00/blocked', '/api/streams/runs/%00'].map((url): [string] => [url])
    ]
  },
  {
    name: 'thread_id',
    message: THREAD_ID,
    requests: [
      ...['', '%00', 'a&thread_id=b'].flatMap((value) => ['/api/events', '/api/events/stream'].map((path): [string] => [`${path}?thread_id=${value}`])),
      ...['/api/threads/%00', '/api/streams/threads/a%00b'].map((url): [string] => [url])
    ]
  },
  {
    name: 'after_event_id',
    message: AFTER_EVENT_ID,
    requests: ['', 'abc', '-1', '1.5', '1e3', ' 1', '0x10', '%00', '99999999999999999', '9999999999999999', '1&after_event_id=2'].flatMap((value) =>
      ['/api/events', '/api/events/stream'].map((path): [string] => [`${path}?after_event_id=${value}`]))
  },
  {
    name: 'Last-Event-ID',
    message: 'Last-Event-ID must be an event_id: an integer from 0 to 9007199254740991',
    requests: ['abc', '-1', '1.5', '12345678901234567', '9999999999999999', '7 8'].map((value) => ['/api/events/stream?after_event_id=1', { 'last-event-id': value }])
  },
  {
    name: 'access_token',
    message: 'access_token must be one bearer token',
    requests: [['/api/events/stream?access_token=a&access_token=b']]
  },
  {
    name: 'offset',
    message: OFFSET,
    requests: [
      ...['xyz', 'zzzzzzzzzzz', '-2', '', 'NOW', '0000000000a%00', '-1&offset=now'].flatMap((value) =>
        ['/api/streams/events', '/api/streams/runs/run-a', '/api/streams/threads/no-such-thread'].map((path): [string] => [`${path}?offset=${value}`])),
      ['/api/streams/events?live=long-poll'], ['/api/streams/events?live=sse'], ['/api/streams/runs/run-a?live=sse']
    ]
  },
  {
    name: 'live',
    message: 'live must be long-poll or sse',
    requests: ['sse2', 'poll', '', 'SSE', 'sse&live=sse'].map((value) => [`/api/streams/events?offset=-1&live=${value}`])
  },
  {
    name: 'cursor',
    message: 'cursor must be a Stream-Cursor this service sent',
    requests: ['abc', '', '-1', '1234567890123456', '1&cursor=2'].map((value) => [`/api/streams/events?offset=now&live=long-poll&cursor=${value}`])
  }
]

t.test('every 400 about a parameter says one sentence: its name and what it accepts, however it is wrong', async (t) => {
  const app = await build(t)
  for (const { name, message, requests } of wrongParameters) {
    t.ok(message.includes(name), `${name}: the sentence names it`)
    for (const word of VALIDATOR_WORDS) t.notOk(message.includes(word), `${name}: no "${word}"`)
    const messages = new Set<string>()
    for (const [url, headers = {}] of requests) {
      const res = await app.inject({ url, headers })
      const what = `${url.slice(0, 80)} ${JSON.stringify(headers)}`
      t.equal(res.statusCode, 400, what)
      t.equal(res.json().error.code, 'bad_request', what)
      t.equal(res.headers['cache-control'], 'no-store', what)
      messages.add(res.json().error.message)
    }
    t.same([...messages], [message], `${name}: the same message for ${requests.length} ways of getting it wrong`)
  }
})

t.test('every parameter the routes validate carries its sentence, naming it (the OpenAPI document shows them all)', async (t) => {
  const app = await build(t)
  const doc = (await app.inject('/openapi.json')).json() as { paths: Record<string, Record<string, { parameters?: Array<{ name: string, in: string, schema: Record<string, unknown> }> }>> }
  const parameters = Object.values(doc.paths).flatMap((methods) => Object.values(methods).flatMap((operation) => operation.parameters ?? []))
  t.ok(parameters.length > 40)
  for (const { name, in: where, schema } of parameters) {
    const sentence = schema[ACCEPTS]
    t.type(sentence, 'string', `${where} ${name}`)
    // A path's runID is the API's run_id.
    const spoken = where === 'path' ? name.replace(/ID$/, '_id') : name
    t.match(sentence, new RegExp(`^${spoken}\\b`, 'i'), `${where} ${name}: named first`)
    for (const word of VALIDATOR_WORDS) t.notOk((sentence as string).includes(word), `${where} ${name}: no "${word}"`)
  }
})

t.test('a cursor beyond the last event_id ever handed out is a 400 saying so; one merely ahead of the settled position waits', async (t) => {
  const db = await writer()
  const drawnNow = async () => Number((await sql<{ drawn: string }>`select (case when is_called then last_value else last_value - 1 end)::text as drawn from events_event_id_seq`.execute(db)).rows[0]!.drawn)
  const settledNow = async () => Number((await sql<{ settled: string }>`select settled::text from event_log_state`.execute(db)).rows[0]!.settled)
  const [written] = await insertEvents({ run_id: 'a/b' })
  // The keeper ticks once at start, then not for a minute unless a reader waits on a hole.
  const app = await build(t, { EVENTS_KEEPER_INTERVAL_MS: 60_000, EVENTS_POLL_INTERVAL_MS: 50 })
  await app.listen({ port: 0, host: '127.0.0.1' })
  const url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`
  await waitUntil(async () => await settledNow() >= written!, 'the keeper\'s first tick')
  // Ids drawn and never used: beyond the settled position until the keeper's next tick, not beyond the sequence.
  await sql`select nextval('events_event_id_seq') from generate_series(1, 2)`.execute(db)
  const drawn = await drawnNow()
  t.equal(drawn, written! + 2)

  const ahead = await app.inject(`/api/events?after_event_id=${drawn}`)
  t.equal(ahead.statusCode, 200, 'a cursor ahead of the settled position, within the sequence: a page')
  t.equal(ahead.headers['x-event-cursor'], String(drawn), 'kept as the place to resume')
  t.ok(await settledNow() < drawn, 'while the settled position was below it')

  const beyond = drawn + 1
  const lastId = `is beyond the last event_id handed out (${drawn}): resume from an event_id or X-Event-Cursor this service sent`
  const lastOffset = `is beyond the last offset handed out (${encodeOffset(drawn)}): pass -1, now, or a Stream-Next-Offset this service sent`
  const refusals: Array<[string, Record<string, string>, string]> = [
    [`/api/events?after_event_id=${beyond}`, {}, `after_event_id ${beyond} ${lastId}`],
    ['/api/events?after_event_id=99999999', {}, `after_event_id 99999999 ${lastId}`],
    [`/api/events/stream?after_event_id=${beyond}`, {}, `after_event_id ${beyond} ${lastId}`],
    ['/api/events/stream?after_event_id=1', { 'last-event-id': String(beyond) }, `Last-Event-ID ${beyond} ${lastId}`],
    ...['', '&live=long-poll', '&live=sse'].flatMap((live) => ['/api/streams/events', '/api/streams/runs/a%2Fb'].map((path): [string, Record<string, string>, string] =>
      [`${path}?offset=${encodeOffset(beyond)}${live}`, {}, `offset ${encodeOffset(beyond)} ${lastOffset}`]))
  ]
  for (const [path, headers, message] of refusals) {
    const res = await fetch(`${url}${path}`, { headers })
    t.equal(res.status, 400, `${path} ${JSON.stringify(headers)}`)
    t.same(await res.json(), { error: { code: 'bad_request', message } })
  }

  // Merely ahead: the stream and the long-poll wait, and get the next event.
  const stream = await openStream(url, `/api/events/stream?after_event_id=${drawn}`)
  t.teardown(stream.close)
  t.equal(stream.status, 200)
  const longPoll = fetch(`${url}/api/streams/events?offset=${encodeOffset(drawn)}&live=long-poll`)
  await waitUntil(() => app.events.durable.waiting === 1, 'the long-poll to wait')
  const [next] = await insertEvents({ run_id: 'a/b' })
  t.equal(next, drawn + 1)
  await stream.waitFor((s) => s.events().length === 1)
  t.same(stream.events().map((event) => event.event_id), [next], 'the stream gets it')
  const polled = await longPoll
  t.equal(polled.status, 200)
  t.same((await polled.json() as Array<{ event_id: number }>).map((event) => event.event_id), [next], 'and so does the long-poll')
})

t.test('where the sequence cannot tell, or a failover is not recorded yet, a cursor ahead is never refused as beyond', async (t) => {
  const state = { floor: 0, reissued: [], lossPending: false, settled: 10, drawn: 12 } as unknown as LogState
  t.throws(() => assertPositionKept(eventIdErrorsNamed('after_event_id'), 13, state), { code: 'bad_request', eventIdName: 'after_event_id', position: 13, last: 12 })
  t.doesNotThrow(() => assertPositionKept(eventIdErrorsNamed('after_event_id'), 12, state), 'within the sequence: it waits')
  t.doesNotThrow(() => assertPositionKept(eventIdErrorsNamed('after_event_id'), 2 ** 52, { ...state, drawn: Infinity }), 'a hot standby (its sequence may lag the primary\'s): it waits')
  t.throws(() => assertPositionKept(eventIdErrorsNamed('after_event_id'), 13, { ...state, lossPending: true }), { code: 'unavailable' },
    'a standby just promoted (its sequence may not have reached what the old primary handed out): retry, not 400')
})
