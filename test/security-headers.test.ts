import helmet, { type FastifyHelmetOptions } from '@fastify/helmet'
import Fastify from 'fastify'
import t from 'tap'
import { helmetOptions, securityHeaders } from '../plugins/external/helmet.js'
import { build } from './helpers/app.js'

// The security headers are helmet's, computed once (plugins/external/helmet.ts).

t.test('the security headers are exactly those @fastify/helmet sets with the same options', async (t) => {
  const reference = Fastify()
  t.teardown(() => reference.close())
  // The same options: TypeScript sees helmet's ESM declarations here and its CommonJS ones through @fastify/helmet, as two types.
  await reference.register(helmet, helmetOptions as unknown as FastifyHelmetOptions)
  reference.get('/', async () => 'ok')
  const fastifysOwn = new Set(['content-type', 'content-length', 'date', 'connection', 'keep-alive'])
  const expected = Object.fromEntries(Object.entries((await reference.inject('/')).headers).filter(([name]) => !fastifysOwn.has(name)))
  t.ok(Object.keys(expected).length >= 10, 'helmet sets its headers')
  t.same(securityHeaders(), expected)
})

t.test('every response carries them: success, error, unknown route, docs', async (t) => {
  const app = await build(t)
  const headers = securityHeaders()
  for (const url of ['/health', '/api/runs', '/api/runs/nope', '/nowhere', '/openapi.json']) {
    const response = await app.inject(url)
    for (const [name, value] of Object.entries(headers)) t.equal(response.headers[name], value, `${url}: ${name}`)
  }
})
