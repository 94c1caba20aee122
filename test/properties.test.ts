import fc from 'fast-check'
import { request as httpRequest } from 'node:http'
import t from 'tap'
import { build } from './helpers/app.ts'
import { insertGraph, makeRun, makeThread } from './helpers/fixtures.ts'
import { insertEvents } from './helpers/sse.ts'
import { waitUntil } from './helpers/wait.ts'

// Bad input, generated: every path and query parameter of every route gets
// thousands of hostile values. Every answer is 2xx, 400 or 404 with the
// right envelope; none is a 500; the process stays healthy.
// PROPERTY_RUNS scales it (default 1500 per property; e.g. 20000 by hand).

const RUNS = Number(process.env.PROPERTY_RUNS ?? 1500)

/** Percent-encodes text as UTF-8 bytes (a lone surrogate becomes U+FFFD, as a browser would send it). */
const encode = (text: string) => [...Buffer.from(text, 'utf8')].map((byte) => `%${byte.toString(16).padStart(2, '0').toUpperCase()}`).join('')

const hostileText = [
  '', ' ', '\u0000', 'a\u0000b', '\u0001\u001f\u007f', '\r\n', '\t', "' OR '1'='1", '"; drop table runs; --', '1; select pg_sleep(10)',
  '{"a":', '[1,2', 'null', 'true', '${jndi:ldap://x}', '<script>alert(1)</script>', '../../etc/passwd', '\\', '%', '💥', '\uFEFF', // eslint-disable-line no-template-curly-in-string -- a hostile text, not a template
  '\uD800', '\uDFFF', '\u202E', 'Ω'.repeat(2000), 'x'.repeat(65_536), '9'.repeat(400), '-1', '0', '1e309', 'NaN', 'Infinity',
  '18446744073709551616', '9007199254740993', '0x1F', '1.5', ' 7', '7 '
]
/** Raw pieces spliced into URLs as they are: malformed percent-encoding, invalid UTF-8, separators. */
const rawPieces = ['%', '%z', '%zz', '%0', '%C3%28', '%ED%A0%80', '%F0%28%8C%BC', '%FF', '%C0%AF', '%2F', '%00', '%25', '/', '//', '?', '#', '&', '=', ';', '+']

const text = fc.oneof(
  { weight: 3, arbitrary: fc.string({ unit: 'binary', maxLength: 40 }) },
  { weight: 2, arbitrary: fc.constantFrom(...hostileText) },
  { weight: 1, arbitrary: fc.string({ unit: 'grapheme', minLength: 1, maxLength: 300 }) },
  { weight: 1, arbitrary: fc.oneof(fc.bigInt(), fc.double(), fc.integer()).map(String) }
)
/** A URL piece: the text percent-encoded, raw hostile pieces, or both spliced together. */
const piece = fc.oneof(
  { weight: 3, arbitrary: text.map(encode) },
  { weight: 1, arbitrary: fc.constantFrom(...rawPieces) },
  { weight: 1, arbitrary: fc.tuple(text.map(encode), fc.constantFrom(...rawPieces), text.map(encode)).map((parts) => parts.join('')) },
  { weight: 1, arbitrary: fc.constantFrom('run-p', 'thread-p', '1', '0', '100') }
)
const parameterNames = ['after_event_id', 'run_id', 'thread_id', 'limit', 'cursor', 'access_token', 'x', '']
const query = fc.array(fc.tuple(fc.constantFrom(...parameterNames), piece), { maxLength: 6 })
  .map((pairs) => pairs.length === 0 ? '' : `?${pairs.map(([name, value]) => `${name}=${value}`).join('&')}`)

const routes = [
  (id: string) => `/api/runs/${id}`,
  (id: string) => `/api/runs/${id}/tasks`,
  (id: string) => `/api/runs/${id}/blocked`,
  (id: string) => `/api/threads/${id}`,
  () => '/api/runs',
  () => '/api/events',
  () => '/health',
  () => '/ready'
]
const url = fc.tuple(fc.nat({ max: routes.length - 1 }), piece, query).map(([route, id, search]) => `${routes[route]!(id)}${search}`)

const codeFor: Record<number, string> = { 400: 'bad_request', 404: 'not_found' }

t.before(async () => {
  await insertGraph({ runs: [makeRun({ run_id: 'run-p' })], threads: [makeThread({ run_id: 'run-p', task_id: 't', thread_id: 'thread-p' })] })
  await insertEvents({ run_id: 'run-p' }, { thread_id: 'thread-p' })
})

t.test('every route, every parameter: 2xx, 400 or 404 with the envelope, never 500', async (t) => {
  const app = await build(t)
  let tried = 0
  const statuses = new Map<number, number>()
  await fc.assert(fc.asyncProperty(url, async (target) => {
    tried++
    const res = await app.inject({ method: 'GET', url: target })
    statuses.set(res.statusCode, (statuses.get(res.statusCode) ?? 0) + 1)
    if (res.statusCode === 200) return
    if (!(res.statusCode in codeFor)) throw new Error(`${res.statusCode} for ${target.slice(0, 200)}: ${res.body.slice(0, 200)}`)
    const body = res.json()
    if (body?.error?.code !== codeFor[res.statusCode] || typeof body.error.message !== 'string' || Object.keys(body).length !== 1) {
      throw new Error(`bad envelope for ${target.slice(0, 200)}: ${res.body.slice(0, 200)}`)
    }
  }), { numRuns: RUNS })
  t.comment(`${tried} generated requests: ${[...statuses].map(([status, count]) => `${count} x ${status}`).join(', ')}`)
  t.ok(tried >= RUNS)
  t.same((await app.inject('/health')).json(), { status: 'ok' }, 'the process is healthy afterwards')
  t.equal((await app.inject('/api/runs/run-p')).statusCode, 200, 'and still serves')
})

t.test('the event stream over real HTTP: 200 with a stream, or 400 with the envelope', async (t) => {
  const app = await build(t)
  await app.listen({ port: 0, host: '127.0.0.1' })
  const { port } = app.server.address() as { port: number }
  // (Node's client cannot send non-ASCII header values; the server's parser is Node's too.)
  const header = fc.oneof(fc.constant(undefined), fc.constantFrom('0', '1', '-1', 'abc', '99999999999999999', ' 5 ', '1.0', '\t2'))
  let tried = 0
  await fc.assert(fc.asyncProperty(query, header, async (search, lastEventId) => {
    tried++
    const { status, type, body } = await new Promise<{ status: number, type: string, body: string }>((resolve, reject) => {
      const headers: Record<string, string> = lastEventId === undefined ? {} : { 'last-event-id': lastEventId }
      const req = httpRequest({ host: '127.0.0.1', port, path: `/api/events/stream${search}`, headers }, (res) => {
        const type = String(res.headers['content-type'])
        if (res.statusCode === 200) {
          req.destroy() // a stream: that is all we need to know
          resolve({ status: 200, type, body: '' })
          return
        }
        let body = ''
        res.on('data', (chunk) => { body += chunk })
        res.on('end', () => resolve({ status: res.statusCode ?? 0, type, body }))
      })
      req.on('error', reject)
      req.end()
    })
    if (status === 200) {
      if (type !== 'text/event-stream') throw new Error(`200 but ${type}`)
      return
    }
    if (status !== 400 || JSON.parse(body).error?.code !== 'bad_request') throw new Error(`${status} for ${search.slice(0, 200)}: ${body.slice(0, 200)}`)
  }), { numRuns: Math.ceil(RUNS / 3) })
  t.comment(`${tried} generated stream requests`)
  // The server learns of each destroyed request's close in its own time.
  await waitUntil(() => app.events.streams.size === 0, 'every stream released')
  t.equal(app.events.streams.size, 0, 'every stream was released')
})

t.test('oversized requests over real HTTP get 400 with the envelope', async (t) => {
  const app = await build(t)
  await app.listen({ port: 0, host: '127.0.0.1' })
  const { port } = app.server.address() as { port: number }
  for (const path of [`/api/runs/${'x'.repeat(70_000)}`, `/api/runs?cursor=${'A'.repeat(70_000)}`, `/api/events?run_id=${'%41'.repeat(30_000)}`]) {
    const { status, body } = await new Promise<{ status: number, body: string }>((resolve) => {
      const req = httpRequest({ host: '127.0.0.1', port, path }, (res) => {
        let body = ''
        res.on('data', (chunk) => { body += chunk })
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }))
      })
      req.end()
    })
    t.equal(status, 400, `${path.length} characters`)
    t.equal(JSON.parse(body).error.code, 'bad_request')
  }
  t.equal((await app.inject('/health')).statusCode, 200)
})
