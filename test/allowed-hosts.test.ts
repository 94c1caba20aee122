import { connect } from 'node:net'
import t from 'tap'
import { build, serve } from './helpers/app.ts'

/*
 * DNS rebinding (plugins/app/allowed-hosts.ts): with authentication off, a
 * request is answered only when its Host names the service (loopback's
 * names, HOST's, ALLOWED_HOSTS'), any port; else 421 misdirected_request.
 * The probes are never checked, ALLOWED_HOSTS=* turns the check off, and
 * with authentication on Host is not checked. AUTH_MODE=none says at start
 * that the data is served to anyone.
 */

const rebound = { host: 'attacker.example:8080', origin: 'http://attacker.example:8080' }

t.test('authentication off: loopback\'s names at any port are answered, a foreign Host is refused 421 with the envelope', async (t) => {
  const app = await build(t)
  for (const host of ['localhost', 'localhost:8080', 'LOCALHOST:80', '127.0.0.1:9', '[::1]', '[::1]:8080']) {
    t.equal((await app.inject({ url: '/api/runs', headers: { host } })).statusCode, 200, `Host ${host}: answered`)
  }
  const refused = await app.inject({ url: '/api/runs', headers: rebound })
  t.equal(refused.statusCode, 421, 'a page rebinding its own name to this address: 421 Misdirected Request')
  t.same(refused.json(), { error: { code: 'misdirected_request', message: 'the Host "attacker.example:8080" is not one this service answers to while authentication is off: the operator may add it to ALLOWED_HOSTS' } })
  t.equal(refused.headers['cache-control'], 'no-store', 'kept by no cache')
  for (const host of ['localhost.attacker.example', '127.0.0.1.nip.io', '[::2]:80', '[::1', 'x'.repeat(300)]) {
    t.equal((await app.inject({ url: '/api/runs', headers: { host } })).statusCode, 421, `Host ${host.slice(0, 40)}: refused`)
  }
  t.match((await app.inject({ url: '/api/runs', headers: { host: 'x'.repeat(300) } })).json().error.message, /^the Host "x{100}…" is not one/, 'a long Host is cut short in the message')
  t.equal((await app.inject({ url: '/api/nowhere', headers: rebound })).statusCode, 421, 'an unknown route too, before its 404')
  t.equal((await app.inject({ url: '/', headers: rebound })).statusCode, 421, 'and the web UI')
  t.equal((await app.inject({ url: '/health', headers: rebound })).statusCode, 200, '/health: a probe, never checked')
  t.equal((await app.inject({ url: '/ready', headers: rebound })).statusCode, 200, '/ready too')
})

t.test('authentication off: a request without Host (HTTP/1.0) is refused too', async (t) => {
  const { port } = await serve(t)
  const socket = connect(port, '127.0.0.1')
  let received = ''
  socket.on('data', (chunk) => { received += chunk.toString() })
  const closed = new Promise((resolve) => socket.on('close', resolve))
  socket.write('GET /api/runs HTTP/1.0\r\n\r\n')
  await closed
  t.match(received, /^HTTP\/1\.1 421 /, '421')
  t.match(received, /"code":"misdirected_request","message":"a request without a Host header is not answered while authentication is off"/)
})

t.test('ALLOWED_HOSTS adds names; HOST\'s own is answered; * answers any', async (t) => {
  const listed = await build(t, { ALLOWED_HOSTS: 'api.example, ocp.internal' })
  t.equal((await listed.inject({ url: '/api/runs', headers: { host: 'API.example:443' } })).statusCode, 200, 'a name listed, any port, any case')
  t.equal((await listed.inject({ url: '/api/runs', headers: { host: 'localhost:8080' } })).statusCode, 200, 'loopback\'s still')
  t.equal((await listed.inject({ url: '/api/runs', headers: rebound })).statusCode, 421, 'any other refused')

  const lines: Array<Record<string, unknown>> = []
  const exposed = await build(t, { HOST: '10.1.2.3', AUTH_MODE: 'none' }, { logger: { level: 'warn', stream: { write: (line: string) => { lines.push(JSON.parse(line)) } } } })
  t.equal((await exposed.inject({ url: '/api/runs', headers: { host: '10.1.2.3:8080' } })).statusCode, 200, 'HOST=10.1.2.3: Host 10.1.2.3 is answered')
  t.equal((await exposed.inject({ url: '/api/runs', headers: rebound })).statusCode, 421, 'a foreign one still refused')
  t.match(lines, [{ level: 40, HOST: '10.1.2.3', AUTH_MODE: 'none', msg: 'authentication is off (AUTH_MODE=none): every run, task, thread, message and event is served to anyone who reaches this port' }],
    'AUTH_MODE=none: said loudly at start')

  const any = await build(t, { ALLOWED_HOSTS: '*' })
  t.equal((await any.inject({ url: '/api/runs', headers: rebound })).statusCode, 200, 'ALLOWED_HOSTS=*: no check')
})

t.test('authentication on: Host is not checked (a rebinding page sends no token)', async (t) => {
  const app = await build(t, { API_TOKENS: 'a-static-token-for-hosts' })
  t.equal((await app.inject({ url: '/api/runs', headers: { ...rebound, authorization: 'Bearer a-static-token-for-hosts' } })).statusCode, 200, 'a foreign Host with a token: answered')
  t.equal((await app.inject({ url: '/api/runs', headers: rebound })).statusCode, 401, 'without one: 401, as from anywhere')
})
