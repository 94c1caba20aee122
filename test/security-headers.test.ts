import helmet, { type FastifyHelmetOptions } from '@fastify/helmet'
import Fastify from 'fastify'
import { createHash } from 'node:crypto'
import t from 'tap'
import { API_CONTENT_SECURITY_POLICY, apiSecurityHeaders, DOCS_INLINE_STYLE_HASHES, helmetOptions, securityHeaders, servesPages } from '../plugins/external/helmet.ts'
import { build } from './helpers/app.ts'

// The security headers: the API's on every answer, helmet's (computed once) on pages (plugins/external/helmet.ts).

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

t.test('every answer of the API carries the API\'s: success, error, unknown route, probes, metrics, the OpenAPI document', async (t) => {
  const app = await build(t)
  const helmets = securityHeaders()
  const api = apiSecurityHeaders(helmets)
  t.same(Object.keys(api).sort(), ['content-security-policy', 'x-content-type-options'])
  t.equal(api['content-security-policy'], API_CONTENT_SECURITY_POLICY, 'a policy for data: nothing loads, nothing frames')
  t.equal(api['x-content-type-options'], helmets['x-content-type-options'], 'helmet\'s nosniff')
  const pageOnly = Object.keys(helmets).filter((name) => !(name in api))
  t.ok(pageOnly.length >= 8, 'helmet\'s other headers')
  for (const url of ['/health', '/ready', '/metrics', '/api/runs', '/api/runs/nope', '/api/events?limit=1', '/nowhere', '/openapi.json', '/api/events/stream?after_event_id=abc']) {
    const response = await app.inject(url)
    for (const [name, value] of Object.entries(api)) t.equal(response.headers[name], value, `${url}: ${name}`)
    for (const name of pageOnly) t.notOk(name in response.headers, `${url}: no ${name}`)
  }
  t.match((await app.inject('/api/runs')).headers['content-security-policy'], /default-src 'none'; frame-ancestors 'none'/, 'no loading, no framing')
})

t.test('pages (the web UI, /docs) carry helmet\'s whole set', async (t) => {
  const app = await build(t)
  const headers = securityHeaders()
  for (const url of ['/', '/ui/style.css', '/docs/', '/docs/static/swagger-initializer.js']) {
    const response = await app.inject(url)
    for (const [name, value] of Object.entries(headers)) t.equal(response.headers[name], value, `${url}: ${name}`)
  }
  // A HEAD of a page too (Fastify adds it as a route of its own).
  t.equal((await app.inject({ method: 'HEAD', url: '/' })).headers['x-frame-options'], headers['x-frame-options'])
})

t.test('the pages\' policy allows no inline code but swagger-ui\'s inline styles, by their hashes', async (t) => {
  const app = await build(t)
  const policy = securityHeaders()['content-security-policy']!
  t.notMatch(policy, /unsafe-inline/)
  // The <style> elements swagger-ui draws (its logo's), as its files write them.
  const inlineStyles: string[] = []
  for (const file of ['swagger-ui-bundle.js', 'swagger-ui-standalone-preset.js']) {
    const source = (await app.inject(`/docs/static/${file}`)).body
    for (const [, text] of source.matchAll(/createElement\("style",null,("(?:[^"\\]|\\.)*")\)/g)) inlineStyles.push(JSON.parse(text!) as string)
  }
  t.ok(inlineStyles.length > 0, 'swagger-ui draws inline styles')
  const hashes = inlineStyles.map((text) => `'sha256-${createHash('sha256').update(text).digest('base64')}'`)
  t.same(hashes, DOCS_INLINE_STYLE_HASHES, 'DOCS_INLINE_STYLE_HASHES are theirs')
  t.ok(policy.includes(`style-src 'self' ${DOCS_INLINE_STYLE_HASHES.join(' ')};`), 'and the policy allows them')
})

t.test('which routes serve pages', async (t) => {
  for (const url of ['/', '/ui/style.css', '/ui/build/*', '/docs', '/docs/static/*']) t.ok(servesPages(url), url)
  for (const url of ['/api/runs', '/api/events/stream', '/api/streams/runs/:run_id', '/health', '/ready', '/metrics', '/openapi.json']) t.notOk(servesPages(url), url)
})
