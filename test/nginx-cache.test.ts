import t from 'tap'
import { testDatabaseUrl } from './helpers/database.ts'
import { requestsOnRoute } from './helpers/metrics.ts'
import { startNginx } from './helpers/nginx.ts'
import { startReplicas } from './helpers/replicas.ts'
import { insertEvents } from './helpers/sse.ts'

// The shipped nginx config (deploy/nginx) as a shared cache in front of three
// replicas: 300 concurrent readers of the same immutable page of events cost
// at most 3 database reads (one, with proxy_cache_lock), later readers none;
// state reads are never served from it.

const REPLICAS = 3
const READERS = 300

t.test('300 concurrent readers of one immutable page behind nginx: at most 3 database reads', async (t) => {
  const databaseUrl = await testDatabaseUrl()
  const replicas = await startReplicas(t, databaseUrl, REPLICAS)
  const lb = await startNginx(t, replicas.map((replica) => replica.port))

  /** Requests the replicas answered on `route`: each is one read of the database. */
  const reads = async (route: string) => {
    let total = 0
    for (const replica of replicas) total += requestsOnRoute(await (await fetch(`http://127.0.0.1:${replica.port}/metrics`)).text(), route)
    return total
  }

  const ids = await insertEvents(...Array.from({ length: 20 }, (_, i) => ({ event_type: `cached-${i}` })))
  const page = `${lb}/api/events?after_event_id=${ids[0]! - 1}&limit=20`
  const before = await reads('/api/events')
  const answersOf = await Promise.all(Array.from({ length: READERS }, async () => {
    const res = await fetch(page)
    return { status: res.status, body: await res.text(), cacheControl: res.headers.get('cache-control'), etag: res.headers.get('etag') }
  }))
  t.ok(answersOf.every((answer) => answer.status === 200), 'every reader got 200')
  t.equal(new Set(answersOf.map((answer) => answer.body)).size, 1, 'the same body')
  t.equal(JSON.parse(answersOf[0]!.body).events.length, 20, 'a full page')
  t.equal(answersOf[0]!.cacheControl, 'public, max-age=31536000, immutable')
  const cost = await reads('/api/events') - before
  t.ok(cost >= 1 && cost <= 3, `${READERS} concurrent readers cost ${cost} database reads (at most 3)`)

  // Later readers: served from the cache, and a tag they hold answers 304 there.
  await Promise.all(Array.from({ length: 50 }, () => fetch(page).then((res) => res.arrayBuffer())))
  const revalidated = await fetch(page, { headers: { 'if-none-match': answersOf[0]!.etag! } })
  t.equal(revalidated.status, 304, 'nginx answers If-None-Match from its copy')
  t.equal(revalidated.headers.get('x-cache-status'), 'HIT')
  t.equal(await reads('/api/events') - before, cost, 'no further database read')

  // One copy serves every encoding: a client that accepts none gets the same page, from the cache.
  const plain = await fetch(page, { headers: { 'accept-encoding': 'identity' } })
  t.equal(plain.headers.get('x-cache-status'), 'HIT', 'another encoding, the same cached copy')
  t.equal(await plain.text(), answersOf[0]!.body)
  t.equal(await reads('/api/events') - before, cost, 'still no further database read')

  // A request with credentials never reads the shared copy.
  const withToken = await fetch(page, { headers: { authorization: 'Bearer anyone' } })
  t.equal(withToken.headers.get('x-cache-status'), 'BYPASS')
  await withToken.arrayBuffer()

  // State reads are no-cache: every one reaches a replica.
  const stateBefore = await reads('/api/runs')
  for (let i = 0; i < 5; i++) t.equal((await fetch(`${lb}/api/runs`).then(async (res) => { await res.arrayBuffer(); return res.headers.get('cache-control') })), 'no-cache')
  t.equal(await reads('/api/runs') - stateBefore, 5, 'state reads are never served from the cache')
})
