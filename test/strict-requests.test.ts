import { connect } from 'node:net'
import t from 'tap'
import { build, serve } from './helpers/app.ts'
import { assertSchema } from './helpers/contract.ts'
import { insertGraph, makeRun, makeTask, makeThread } from './helpers/fixtures.ts'
import { insertEvents, openStream } from './helpers/sse.ts'

// No request widens or narrows by mistake (docs/reference.md, "Errors"):
// an unknown query parameter is a 400 naming it, and a write to any /api
// path is a 405, answered before its body is read.

t.before(async () => {
  await insertGraph({
    runs: [makeRun({ run_id: 'strict-r1' }), makeRun({ run_id: 'strict-r2' })],
    tasks: [makeTask({ run_id: 'strict-r1', task_id: 'strict-task' })],
    threads: [makeThread({ run_id: 'strict-r1', task_id: 'strict-task', thread_id: 'strict-t1' })]
  })
  await insertEvents({ run_id: 'strict-r1' }, { run_id: 'strict-r2' })
})

interface Operation { operationId: string, parameters?: Array<{ name: string, in: string }> }

const PATH_VALUES: Record<string, string> = { runID: 'strict-r1', taskID: 'strict-task', threadID: 'strict-t1' }

t.test('every operation refuses a query parameter it does not take, naming it and those it takes', async (t) => {
  const app = await build(t)
  const doc = (await app.inject('/openapi.json')).json() as { paths: Record<string, Record<string, Operation>> }
  let checked = 0
  for (const [path, methods] of Object.entries(doc.paths)) {
    for (const [method, operation] of Object.entries(methods)) {
      const url = path.replace(/\{(\w+)\}/g, (_, name: string) => PATH_VALUES[name]!)
      const accepted = (operation.parameters ?? []).filter((parameter) => parameter.in === 'query').map((parameter) => parameter.name)
      const res = await app.inject({ method: method.toUpperCase() as 'GET', url: `${url}?zz_unknown=1` })
      const label = `${method.toUpperCase()} ${path}`
      if (path.startsWith('/api/streams/')) {
        // The protocol has servers ignore parameters they do not know.
        t.equal(res.statusCode, 200, `${label}: ignored (Durable Streams)`)
        continue
      }
      t.equal(res.statusCode, 400, label)
      if (method === 'head') continue
      const message = accepted.length === 0
        ? 'unknown query parameter "zz_unknown": this route takes no query parameters'
        : `unknown query parameter "zz_unknown": this route accepts ${accepted.join(', ')}`
      t.same(res.json(), { error: { code: 'bad_request', message } }, label)
      t.equal(res.headers['cache-control'], 'no-store', label)
      checked++
    }
  }
  t.ok(checked >= 13, `${checked} operations`)
})

t.test('a misspelt filter on the stream is a 400, not a stream of every run\'s events', async (t) => {
  const { url } = await serve(t)
  const stream = await openStream(url, '/api/events/stream?after_event_id=0&runid=strict-r1')
  await stream.ended
  t.equal(stream.status, 400)
  t.same(JSON.parse(stream.body), {
    error: { code: 'bad_request', message: 'unknown query parameter "runid": this route accepts after_event_id, run_id, thread_id, stream_token, access_token' }
  })
})

t.test('the run list: sort, a repeated unknown, odd names, before a malformed known parameter', async (t) => {
  const app = await build(t)
  const cases: Array<[string, string]> = [
    ['/api/runs?sort=asc', '"sort"'],
    ['/api/runs?limit=5&Status=running', '"Status"'],
    ['/api/runs?sort=a&sort=b', '"sort"'],
    ['/api/runs?limit=0&sort=asc', '"sort"'],
    ['/api/runs?constructor=1', '"constructor"'],
    ['/api/runs?__proto__=1', '"__proto__"'],
    ['/api/runs?a%22b=1', '"a\\"b"'],
    ['/api/runs?=1', '""'],
    [`/api/runs?${'x'.repeat(500)}=1`, `"${'x'.repeat(100)}…"`],
    ['/api/runs/strict-r1?stream_token=abc', '"stream_token"']
  ]
  for (const [url, shown] of cases) {
    const res = await app.inject(url)
    t.equal(res.statusCode, 400, url.slice(0, 60))
    t.equal(res.json().error.code, 'bad_request')
    t.ok(res.json().error.message.startsWith(`unknown query parameter ${shown}: `), `${url.slice(0, 60)}: ${res.json().error.message.slice(0, 60)}`)
  }
  t.equal((await app.inject('/api/runs?status=running&blocked=false&limit=5')).statusCode, 200, 'every parameter it takes')
  t.equal((await app.inject('/api/runs/')).statusCode, 200, 'none at all')
})

t.test('what is outside the API keeps its own rules: the UI\'s files, the docs, the Durable Streams routes', async (t) => {
  const app = await build(t)
  t.equal((await app.inject('/?utm_source=x')).statusCode, 200)
  t.equal((await app.inject('/openapi.json?x=1')).statusCode, 200)
  t.equal((await app.inject('/docs/?x=1')).statusCode, 200)
  const page = await app.inject('/api/streams/runs/strict-r1?offset=-1&foo=bar&baz=qux')
  t.equal(page.statusCode, 200, 'a Durable Streams read ignores what it does not know (the protocol\'s rule)')
  t.equal(page.json().length, 1)
})

t.test('with authentication on, a request without a token gets its 401 first; with one, the 400', async (t) => {
  const app = await build(t, { API_TOKENS: 'strict-token' })
  const anonymous = await app.inject('/api/runs?sort=asc')
  t.equal(anonymous.statusCode, 401, 'nothing about the route before the token')
  const signed = await app.inject({ url: '/api/runs?sort=asc', headers: { authorization: 'Bearer strict-token' } })
  t.equal(signed.statusCode, 400)
  const streamToken = (await app.inject({ url: '/api/stream-token?run_id=strict-r1', headers: { authorization: 'Bearer strict-token' } })).json().token
  const byUrl = await app.inject(`/api/streams/runs/strict-r1?offset=-1&stream_token=${streamToken}`)
  t.equal(byUrl.statusCode, 200, 'a stream token in the URL is one of the stream\'s parameters')
})

const WRITES = ['POST', 'PUT', 'PATCH', 'DELETE'] as const

t.test('a write to any /api path is 405 method_not_allowed with the Allow of what the path serves', async (t) => {
  const app = await build(t)
  const paths: Array<[string, string]> = [
    ['/api/runs', 'GET, HEAD'],
    ['/api/runs/', 'GET, HEAD'],
    ['/api/runs/strict-r1/tasks/strict-task', 'GET, HEAD'],
    ['/api/runs/no-such-run', 'GET, HEAD'],
    ['/api/runs/a%2Fb/blocked?x=1', 'GET, HEAD'],
    ['/api/events/stream', 'GET, HEAD'],
    ['/api/streams/runs/strict-r1', 'GET, HEAD'],
    ['/api/auth', 'GET, HEAD'],
    ['/api', ''],
    ['/api?x=1', ''],
    ['/api/nope', ''],
    ['/api/runs/strict-r1/tasks/strict-task/more', '']
  ]
  for (const [url, allow] of paths) {
    for (const method of WRITES) {
      const res = await app.inject({ method, url })
      const label = `${method} ${url}`
      t.equal(res.statusCode, 405, label)
      t.equal(res.headers.allow, allow, `${label}: Allow`)
      t.equal(res.headers['cache-control'], 'no-store', label)
      assertSchema(t, 'ErrorEnvelope', res.json(), label)
      t.equal(res.json().error.code, 'method_not_allowed', label)
      t.equal(res.json().error.message, allow === ''
        ? `${method} is not allowed: the API is read-only, and no route serves this path`
        : `${method} is not allowed: the API is read-only (this path answers ${allow}); the orchestrator writes the state it serves`, label)
    }
  }
  t.equal((await app.inject({ method: 'PUT', url: '/health' })).statusCode, 404, 'outside /api: no route, 404')
})

t.test('the 405 comes before the body: never 400, 413 or 415 for what it carries, nor a 401', async (t) => {
  const app = await build(t, { API_TOKENS: 'strict-token' })
  const bodies: Array<[string, string | Buffer, string]> = [
    ['malformed JSON', '{"a":', 'application/json'],
    ['an unknown type', 'zzz', 'application/x-nope'],
    ['10 MB', Buffer.alloc(10 * 1024 * 1024, 'a'), 'application/json']
  ]
  for (const [what, payload, type] of bodies) {
    const res = await app.inject({ method: 'POST', url: '/api/runs', payload, headers: { 'content-type': type } })
    t.equal(res.statusCode, 405, what)
    t.equal(res.headers.allow, 'GET, HEAD', what)
  }
})

t.test('a 10 MB body announced on the wire: the 405 arrives while it is still unsent', async (t) => {
  const { url } = await serve(t)
  const socket = connect(Number(new URL(url).port), '127.0.0.1')
  t.teardown(() => socket.destroy())
  let received = ''
  const answered = new Promise<void>((resolve) => {
    socket.on('data', (chunk) => {
      received += chunk.toString()
      if (/\r\n\r\n\{.*\}$/s.test(received)) resolve()
    })
  })
  // The headers and the first kilobyte only: the rest is never sent, so an answer proves the body was not awaited.
  socket.write(`POST /api/runs HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: ${10 * 1024 * 1024}\r\n\r\n${'a'.repeat(1024)}`)
  await answered
  t.match(received, /^HTTP\/1\.1 405 /)
  t.match(received, /\r\nallow: GET, HEAD\r\n/i)
  t.match(received, /"code":"method_not_allowed"/)
})
