import { connect } from 'node:net'
import t from 'tap'
import { MAX_ID_LENGTH } from '../schemas/api.js'
import { build } from './helpers/app.js'
import { assertSchema } from './helpers/contract.js'
import { insertGraph, makeRun } from './helpers/fixtures.js'

// No input reaching a path or query parameter produces a 500 (CONTRACT section 4).

t.before(() => insertGraph({ runs: [makeRun({ run_id: 'a/b' }), makeRun({ run_id: 'émoji-🚀' }), makeRun({ run_id: "x' OR '1'='1" })] }))

const routes = (id: string) => [`/api/runs/${id}`, `/api/runs/${id}/tasks`, `/api/runs/${id}/blocked`, `/api/threads/${id}`]

t.test('hostile ids answer 400 or 404 with the envelope, never 500', async (t) => {
  const app = await build(t)
  const ids = [
    '%00', 'a%00b', '%zz', '%', '%C3%28', '%ED%A0%80', '%FF%FE', 'x'.repeat(10_000), '%F0%9F%9A%80',
    encodeURIComponent("'; drop table runs; --"), encodeURIComponent('1 OR 1=1'), encodeURIComponent('${jndi}'),
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

t.test('unknown routes and methods answer 404 not_found', async (t) => {
  const app = await build(t)
  for (const [method, url] of [['GET', '/nope'], ['GET', '/api'], ['GET', '/api/run'], ['GET', '/api/runs/x/y/z'], ['POST', '/api/runs'], ['DELETE', '/api/runs/a%2Fb'], ['PUT', '/health']] as const) {
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
