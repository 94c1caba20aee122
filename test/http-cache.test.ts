import t from 'tap'
import { cacheControls, noneMatchHits } from '../plugins/app/http-cache.ts'
import { build } from './helpers/app.ts'
import { insertGraph, makeRun, makeTask, makeThread, writer } from './helpers/fixtures.ts'
import { insertEvents } from './helpers/sse.ts'

// HTTP caching (docs/reference.md, "HTTP caching"): strong ETags and If-None-Match on every
// JSON read, Cache-Control by kind, errors no-store, nothing public with
// API_TOKENS.

const run = makeRun({ run_id: 'cache-run', goal: 'Cache me' })
const task = makeTask({ run_id: 'cache-run', task_id: 'cache-task', status: 'running' })
const thread = makeThread({ run_id: 'cache-run', task_id: 'cache-task', thread_id: 'cache-thread' })

t.before(() => insertGraph({ runs: [run], tasks: [task], threads: [thread] }))

const READS = ['/api/runs', '/api/runs/cache-run', '/api/runs/cache-run/tasks', '/api/runs/cache-run/blocked', '/api/threads/cache-thread']

t.test('every state read: a strong ETag, no-cache, 304 with no body on If-None-Match, 200 with a new tag once it changed', async (t) => {
  const app = await build(t)
  for (const url of READS) {
    const first = await app.inject(url)
    t.equal(first.statusCode, 200, url)
    const tag = first.headers.etag as string
    t.match(tag, /^"[A-Za-z0-9_-]{22}"$/, `${url}: a strong tag`)
    t.equal(first.headers['cache-control'], 'no-cache', url)
    t.notOk(first.headers.vary, `${url}: nothing varies without tokens`)
    const again = await app.inject({ url, headers: { 'if-none-match': tag } })
    t.equal(again.statusCode, 304, `${url}: 304`)
    t.equal(again.body, '', `${url}: no body`)
    t.equal(again.headers.etag, tag, `${url}: the same tag`)
    t.equal(again.headers['cache-control'], 'no-cache')
    t.ok(again.headers['x-event-cursor'], 'the position it was read at')
    const head = await app.inject({ method: 'HEAD', url, headers: { 'if-none-match': tag } })
    t.equal(head.statusCode, 304, `${url}: HEAD too`)
  }
  const before = (await app.inject('/api/runs/cache-run')).headers.etag as string
  const db = await writer()
  await db.updateTable('runs').set({ summary: 'changed' }).where('run_id', '=', 'cache-run').execute()
  const changed = await app.inject({ url: '/api/runs/cache-run', headers: { 'if-none-match': before } })
  t.equal(changed.statusCode, 200, 'changed: the new body')
  t.not(changed.headers.etag, before, 'with a new tag')
  t.match(changed.body, /"summary": ?"changed"/)
})

t.test('If-None-Match as RFC 9110 reads it: lists, *, weak tags weakly, anything malformed ignored, never an error', async (t) => {
  const app = await build(t)
  const { etag } = (await app.inject('/api/runs/cache-run')).headers
  const tag = etag as string
  const cases: Array<[string, number]> = [
    [tag, 304],
    [`W/${tag}`, 304],
    [`"other", ${tag}`, 304],
    [`"other",W/${tag} , "more"`, 304],
    [`, ${tag},,`, 304],
    ['*', 304],
    [' * ', 304],
    ['"other"', 200],
    [tag.slice(1, -1), 200],
    [`${tag}x`, 200],
    [`"a"b, ${tag}`, 200],
    ['W/', 200],
    ['"', 200],
    ['', 200],
    ['\u00ff\u0001garbage', 200],
    ['x'.repeat(8000), 200]
  ]
  for (const [field, status] of cases) {
    const res = await app.inject({ url: '/api/runs/cache-run', headers: { 'if-none-match': field } })
    t.equal(res.statusCode, status, JSON.stringify(field).slice(0, 60))
  }
  t.equal(noneMatchHits(undefined, tag), false)
  t.equal(noneMatchHits('"a", "b"', '"b"'), true)
})

t.test('errors are no-store', async (t) => {
  const app = await build(t)
  for (const url of ['/api/runs/nope', '/api/threads/nope', '/api/runs?limit=x', '/api/events?after_event_id=x', '/api/nothing-here', '/api/runs/%E0%A4%A']) {
    const res = await app.inject({ url, headers: { 'if-none-match': '*' } })
    t.ok(res.statusCode >= 400, `${url}: ${res.statusCode}`)
    t.equal(res.headers['cache-control'], 'no-store', url)
    t.notOk(res.headers.etag, `${url}: no tag`)
  }
})

t.test('events pages: a full page after a cursor is immutable, any other page 5 s', async (t) => {
  const app = await build(t)
  const [first, second, third] = await insertEvents({ event_type: 'a' }, { event_type: 'b' }, { event_type: 'c' })
  const full = await app.inject(`/api/events?after_event_id=${first! - 1}&limit=2`)
  t.equal(full.statusCode, 200)
  t.equal(full.json().events.length, 2)
  t.equal(full.headers['cache-control'], 'public, max-age=31536000, immutable')
  t.equal((await app.inject({ url: `/api/events?after_event_id=${first! - 1}&limit=2`, headers: { 'if-none-match': full.headers.etag as string } })).statusCode, 304)

  const partial = await app.inject(`/api/events?after_event_id=${second}&limit=2`)
  t.equal(partial.json().events.length, 1, 'the last one alone: the page may still grow')
  t.equal(partial.headers['cache-control'], 'public, max-age=5')
  const fromFloor = await app.inject('/api/events?limit=1')
  t.equal(fromFloor.json().events.length, 1)
  t.equal(fromFloor.headers['cache-control'], 'public, max-age=5', 'from the floor, which moves: never immutable')
  const empty = await app.inject(`/api/events?after_event_id=${third}`)
  t.equal(empty.headers['cache-control'], 'public, max-age=5')
})

t.test('with API_TOKENS nothing is public, and answers vary by Authorization', async (t) => {
  const app = await build(t, { API_TOKENS: 'secret' })
  const headers = { authorization: 'Bearer secret' }
  const [first] = await insertEvents({ event_type: 'x' })
  const state = await app.inject({ url: '/api/runs/cache-run', headers })
  t.equal(state.headers['cache-control'], 'private, no-cache')
  t.match(state.headers.vary, /Authorization/)
  const page = await app.inject({ url: `/api/events?after_event_id=${first! - 1}&limit=1`, headers })
  t.equal(page.headers['cache-control'], 'private, max-age=31536000, immutable')
  t.match(page.headers.vary, /Authorization/)
  const refused = await app.inject({ url: '/api/runs/cache-run', headers: { 'if-none-match': state.headers.etag as string } })
  t.equal(refused.statusCode, 401, 'a tag is no credential')
  t.equal(refused.headers['cache-control'], 'no-store')
  t.same(Object.values(cacheControls(true)).filter((value) => value.includes('public')), [])
})

t.test('with CORS, Vary keeps Origin', async (t) => {
  const app = await build(t, { API_TOKENS: 'secret', CORS_ORIGINS: 'https://ui.example' })
  const res = await app.inject({ url: '/api/runs/cache-run', headers: { authorization: 'Bearer secret', origin: 'https://ui.example' } })
  t.match(res.headers.vary, /Origin/)
  t.match(res.headers.vary, /Authorization/)
  t.match(res.headers['access-control-expose-headers'], /ETag/, 'a UI on another origin can read the tag')
  const preflight = await app.inject({ method: 'OPTIONS', url: '/api/runs/cache-run', headers: { origin: 'https://ui.example', 'access-control-request-method': 'GET', 'access-control-request-headers': 'if-none-match' } })
  t.match(preflight.headers['access-control-allow-headers'], /If-None-Match/, 'and send it back')
})

t.test('a compressed body carries the tag of its JSON, and revalidates the same', async (t) => {
  const app = await build(t, { COMPRESS_MIN_BYTES: 0 })
  const plain = await app.inject('/api/runs')
  const gzipped = await app.inject({ url: '/api/runs', headers: { 'accept-encoding': 'gzip' } })
  t.equal(gzipped.headers['content-encoding'], 'gzip')
  t.equal(gzipped.headers.etag, plain.headers.etag)
  const again = await app.inject({ url: '/api/runs', headers: { 'accept-encoding': 'gzip', 'if-none-match': plain.headers.etag as string } })
  t.equal(again.statusCode, 304)
  t.equal(again.rawPayload.length, 0)
})

t.test('OpenAPI documents If-None-Match, 304 and the caching headers on every JSON read', async (t) => {
  const app = await build(t)
  const doc = (await app.inject('/openapi.json')).json()
  const reads = ['/api/runs', '/api/runs/{runID}', '/api/runs/{runID}/tasks', '/api/runs/{runID}/blocked', '/api/threads/{threadID}', '/api/events']
  for (const path of reads) {
    const operation = doc.paths[path].get
    t.ok(operation.parameters.some((parameter: { in: string, name: string }) => parameter.in === 'header' && parameter.name === 'if-none-match'), `${path}: If-None-Match`)
    t.ok(operation.responses['304'], `${path}: 304`)
    t.notOk(operation.responses['304'].content, `${path}: 304 has no body`)
    t.same(Object.keys(operation.responses['200'].headers).sort(), ['cache-control', 'etag', 'x-event-cursor'], `${path}: the headers of its 200`)
    t.ok(operation.responses['200'].content['application/json'].schema, `${path}: its body schema is still there`)
  }
  t.match(doc.paths['/api/events'].get.responses['200'].headers['cache-control'].description, /immutable/)
})
