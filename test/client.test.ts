import { readFileSync } from 'node:fs'
import { createServer } from 'node:http'
import { sql } from 'kysely'
import t, { type Test } from 'tap'
import type { Static } from 'typebox'
import { generateTypes } from '../client/scripts/generate-types.ts'
import { ApiError, createClient, CursorExpired, MAX_PAGE_LIMIT, type Event, type EventType, type Followed, type RunDetail, type RunDetailEnvelope, type RunList, type StreamStatus } from '../client/src/index.ts'
import { delay } from '../client/src/client.ts'
import { readSse } from '../client/src/sse.ts'
import type * as Schemas from '../schemas/resources.ts'
import type { Config } from '../config.ts'
import { serve as serveApp, untilWindowLearnsFloor } from './helpers/app.ts'
import { insertGraph, makeArtifact, makeAttempt, makeMessage, makeRun, makeTask, makeThread, writer } from './helpers/fixtures.ts'
import { insertEvents, take } from './helpers/sse.ts'
import { freePort, sleep, waitUntil } from './helpers/wait.ts'

// ocp-api-client against the real service: its reads, its errors, its
// stream (resume, backoff, 410), and list-then-watch's guarantee.

// The generated types are the schemas' own (checked by the type checker).
type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false
type Context = { Run: typeof Schemas.Run, Task: typeof Schemas.Task, TaskAttempt: typeof Schemas.TaskAttempt, Message: typeof Schemas.Message, Artifact: typeof Schemas.Artifact, BlockedTask: typeof Schemas.BlockedTask }
const sameRunDetail: Same<RunDetail, Static<typeof Schemas.RunDetail, Context>> = true
const sameEvent: Same<Event, Static<typeof Schemas.Event>> = true
// EventType names the types the service writes, for completion, and takes any other.
const eventTypes: EventType[] = ['run_created', 'run_status', 'an_orchestrators_own']

t.test('client/src/types.ts is what the schemas generate (npm run generate -w client)', async (t) => {
  t.equal(readFileSync(new URL('../client/src/types.ts', import.meta.url), 'utf8'), generateTypes())
  t.ok(sameRunDetail && sameEvent && eventTypes.length === 3)
  t.equal(MAX_PAGE_LIMIT, 1000, 'the page limit, from schemas/api.ts')
})

t.before(() => insertGraph({
  runs: [makeRun({ run_id: 'run-c1', status: 'running' }), makeRun({ run_id: 'run-c2', status: 'done' }), makeRun({ run_id: 'run-c3', status: 'failed' })],
  tasks: [
    makeTask({ run_id: 'run-c1', task_id: 'task-a', status: 'running' }),
    makeTask({ run_id: 'run-c1', task_id: 'task-b', status: 'blocked', latest_attempt_no: 1 }),
    makeTask({ run_id: 'run-c1', task_id: 'task-c', status: 'done' })
  ],
  task_attempts: [makeAttempt({ run_id: 'run-c1', task_id: 'task-b', thread_id: 'thread-c' })],
  threads: [makeThread({ run_id: 'run-c1', task_id: 'task-b', thread_id: 'thread-c' })],
  messages: [makeMessage({ thread_id: 'thread-c', message_id: 'msg-c', kind: 'question' })],
  artifacts: [makeArtifact({ message_id: 'msg-c' })]
}))

/** This file's application, listening. */
const serve = (t: Test, overrides: Partial<Config> = {}, port = 0) => serveApp(t, { EVENTS_POLL_INTERVAL_MS: 50, SSE_RETRY_MS: 100, ...overrides }, port)

/** A fetch that records what was asked, and answers with `answer` when it returns a Response. */
function recordingFetch (answer?: (url: string, init: RequestInit | undefined, calls: number) => Response | undefined) {
  const requests: Array<{ url: string, headers: Record<string, string> }> = []
  const fetcher = async (input: string | URL | Request, init?: RequestInit) => {
    requests.push({ url: String(input), headers: { ...(init?.headers as Record<string, string>) } })
    return answer?.(String(input), init, requests.length) ?? fetch(input, init)
  }
  return { fetcher: fetcher as typeof fetch, requests }
}

t.test('reads: each resolves to the 200 body; runs pages by the Link header; status filters', async (t) => {
  const { url } = await serve(t)
  const client = createClient({ url })
  const all = await client.runs()
  t.same(all.runs.map((item) => item.run.run_id).sort(), ['run-c1', 'run-c2', 'run-c3'])
  const first = await client.runsRead({ limit: 2 })
  t.equal(first.body.runs.length, 2)
  t.type(first.next, 'string', 'the next page\'s cursor, from the Link header')
  t.type(first.eventCursor, 'number', 'the X-Event-Cursor')
  const second = await client.runsRead({ limit: 2, cursor: first.next! })
  t.equal(second.body.runs.length, 1)
  t.equal(second.next, undefined, 'no Link on the last page')
  t.same([...first.body.runs, ...second.body.runs].map((item) => item.run.run_id), all.runs.map((item) => item.run.run_id))

  const detail = await client.run('run-c1')
  t.equal(detail.run.total_tasks, 3)
  t.same((await client.tasks('run-c1', { limit: 1 })).tasks.map((task) => task.task_id), ['task-a'])
  t.same((await client.blocked('run-c1')).blocked.map((item) => item.task.task_id), ['task-b'])
  t.equal((await client.thread('thread-c')).thread.thread.thread_id, 'thread-c')
  const [id, threadEvent] = await insertEvents({ run_id: 'run-c1', event_type: 'client_read' }, { run_id: 'run-c1', thread_id: 'thread-c' })
  const events = await client.events({ after_event_id: id! - 1, run_id: 'run-c1' })
  t.same(events.events.map((event) => event.event_id), [id, threadEvent])
  const byThread = await client.events({ after_event_id: id!, run_id: '', thread_id: 'thread-c' })
  t.same(byThread.events.map((event) => event.event_id), [threadEvent], 'an empty filter is no filter (the service refuses ?run_id=)')
})

t.test('errors: an ApiError with the envelope\'s code, the status and the URL, in one line', async (t) => {
  const { url } = await serve(t, { API_TOKENS: 'secret-token' })
  const refused = await createClient({ url }).runs().catch((error: unknown) => error)
  t.ok(refused instanceof ApiError)
  t.match(refused, { status: 401, code: 'unauthorized', url: `${url}/api/runs` })
  t.notOk((refused as Error).message.includes('\n'), 'one line')
  t.match((refused as Error).message, /HTTP 401 unauthorized, http:\/\/127\.0\.0\.1:\d+\/api\/runs\)$/)

  const client = createClient({ url, token: 'secret-token' })
  t.equal((await client.run('run-c1')).run.run.run_id, 'run-c1', 'the token goes as a bearer header')
  const missing = await client.run('no-such-run').catch((error: unknown) => error)
  t.match(missing, { status: 404, code: 'not_found', transient: false, terminal: true })
  t.same([400, 401, 403, 404, 409, 500, 503].map((status) => new ApiError(status, 'x', 'y', url).terminal), [true, true, true, true, false, false, false], 'terminal: what retrying cannot fix')
  t.match(client.streamUrl({ run_id: 'run-c1' }, 5), /\/api\/events\/stream\?run_id=run-c1&after_event_id=5$/, 'the stream URL never carries the token (test/client-auth.test.ts: stream tokens)')

  const closedPort = await freePort()
  const unreachable = await createClient({ url: `http://127.0.0.1:${closedPort}` }).runs().catch((error: unknown) => error)
  t.match(unreachable, { status: 0, code: 'network', transient: true })
  t.match((unreachable as Error).message, new RegExp(`^cannot reach the service: ECONNREFUSED \\(no answer network, http://127\\.0\\.0\\.1:${closedPort}/api/runs\\)$`))

  const offline = await createClient({ url, fetch: async () => { throw new Error('offline') } }).runs().catch((error: unknown) => error)
  t.match((offline as Error).message, /^cannot reach the service: offline \(no answer network/, 'a failure with no cause')
  const silent = await createClient({ url, fetch: async () => { throw new TypeError('') } }).runs().catch((error: unknown) => error)
  t.match(silent, { detail: 'cannot reach the service: TypeError' }, 'a failure with no message: its name')
  const blank = await createClient({ url, fetch: async () => new Response('{"error":{"code":"internal","message":""}}', { status: 500, statusText: 'Internal Server Error' }) }).runs().catch((error: unknown) => error)
  t.match(blank, { code: 'internal', detail: '500 Internal Server Error', transient: false, terminal: false }, 'an envelope with no message: the status')
  const badPort = await createClient({ url: 'http://127.0.0.1:9' }).runs().catch((error: unknown) => error)
  t.match((badPort as Error).message, /^cannot reach the service: bad port/, 'a cause with no code')
  const bare = await createClient({ url, fetch: async () => new Response('{"runs":[]}', { status: 200 }) }).runsRead()
  t.same(bare, { body: { runs: [] }, unchanged: false }, 'no X-Event-Cursor, no Link: neither is made up')

  const { fetcher } = recordingFetch(() => new Response('<html>Bad Gateway</html>', { status: 502, statusText: 'Bad Gateway' }))
  const proxy = await createClient({ url, fetch: fetcher }).runs().catch((error: unknown) => error)
  t.match(proxy, { status: 502, code: 'http_error', detail: '502 Bad Gateway', transient: true }, 'a proxy\'s page: the status says it')
})

t.test('If-None-Match: the last body and ETag per URL; a 304 or the same bytes is "unchanged", the same object', async (t) => {
  const { url } = await serve(t)
  let etagged = 0
  const { fetcher, requests } = recordingFetch((_url, init, calls) => {
    const headers = init?.headers as Record<string, string>
    if (calls === 1) return undefined
    if (headers['if-none-match'] === '"v1"') return new Response(null, { status: 304, headers: { 'x-event-cursor': '7' } })
    return undefined
  })
  // The first answer gets an ETag added, as the service will send.
  const withEtag: typeof fetch = async (input, init) => {
    const response = await fetcher(input, init)
    if (etagged++ > 0 || response.status !== 200) return response
    const headers = new Headers(response.headers)
    headers.set('etag', '"v1"')
    return new Response(await response.text(), { status: 200, headers })
  }
  const client = createClient({ url, fetch: withEtag, cacheSize: 1 })
  const first = await client.runRead('run-c1')
  t.equal(first.unchanged, false)
  const second = await client.runRead('run-c1')
  t.equal(requests[1]!.headers['if-none-match'], '"v1"', 'sent the ETag back')
  t.equal(second.unchanged, true)
  t.equal(second.body, first.body, 'a 304 is the body read before')
  t.equal(second.eventCursor, 7, 'with the 304\'s cursor')

  await client.runRead('run-c2') // evicts run-c1 (cacheSize 1)
  const third = await client.runRead('run-c1')
  t.notOk('if-none-match' in requests[3]!.headers, 'nothing kept, nothing sent')
  t.equal(third.unchanged, false)
  const fourth = await client.runRead('run-c1')
  t.equal(fourth.unchanged, true, 'without an ETag, the same bytes are unchanged too')
  t.equal(fourth.body, third.body)
})

t.test('readSse: LF, CRLF and CR line ends, multi-line data, comments, ids and retry', async (t) => {
  const text = 'retry: 300\r\n\r\n: keep-alive\n\nid: 1\ndata: {"a":\ndata:1}\n\nid: 2\r\r: c\nid:3\ndata\n\n'
  const bytes = new TextEncoder().encode(text)
  const body = new ReadableStream<Uint8Array>({
    start (controller) {
      for (let i = 0; i < bytes.length; i += 3) controller.enqueue(bytes.slice(i, i + 3)) // split anywhere, CRLF included
      controller.close()
    }
  })
  const blocks = []
  for await (const block of readSse(body)) blocks.push(block)
  t.same(blocks, [{ retry: 300 }, { id: '1', data: '{"a":\n1}' }, { id: '2' }, { id: '3', data: '', comment: 'c' }], 'a comment alone is no block; with fields, the block keeps it')
})

t.test('watch: events in order, once, resuming across a restart of the service', async (t) => {
  const first = await serve(t)
  const client = createClient({ url: first.url })
  const [base] = await insertEvents({ run_id: 'run-c2' })
  const statuses: string[] = []
  const events = client.watch({ run_id: 'run-c2' }, { after: base!, maxDelayMs: 300, onStatus: (status) => statuses.push(status.state) })
  const written = await insertEvents({ run_id: 'run-c2' }, { run_id: 'run-other' }, { run_id: 'run-c2' })
  const received = await take(events, 2)
  t.same(received, [written[0], written[2]], 'the run\'s events, in order')

  const more = client.watch({ run_id: 'run-c2' }, { after: received[1]!, maxDelayMs: 300, onStatus: (status) => statuses.push(status.state) })
  const collected: number[] = []
  const consuming = (async () => { for await (const event of more) { collected.push(event.event_id); if (collected.length === 3) break } })()
  const [a] = await insertEvents({ run_id: 'run-c2' })
  await waitUntil(() => collected.length === 1, 'the first event')
  await first.app.close()
  const [b] = await insertEvents({ run_id: 'run-c2' }) // while the service is down
  await sleep(300)
  await serve(t, {}, first.port)
  const [c] = await insertEvents({ run_id: 'run-c2' })
  await consuming
  t.same(collected, [a, b, c], 'every event once, in order, across the restart')
  t.ok(statuses.includes('retrying'), 'it said it was retrying')
})

t.test('watch without a cursor starts from now, and still resumes from there', async (t) => {
  const { url } = await serve(t)
  const client = createClient({ url })
  const [before] = await insertEvents({ run_id: 'run-c3' })
  const statuses: StreamStatus[] = []
  const events = client.watch({ run_id: 'run-c3' }, { onStatus: (status) => statuses.push(status) })
  const next = events.next()
  await waitUntil(() => statuses.some((status) => status.state === 'live'), 'the stream to open')
  const [after] = await insertEvents({ run_id: 'run-c3' })
  const { value } = await next
  t.equal(value?.event_id, after, `not ${before}, which came before the watch`)
  await events.return()
})

t.test('watch: a 410 cursor_expired throws CursorExpired; a refusal that retrying cannot fix throws ApiError', async (t) => {
  const { app, url } = await serve(t, { API_TOKENS: 'tok' })
  const db = await writer()
  const [old, newer] = await insertEvents({ run_id: 'run-c1' }, { run_id: 'run-c1' })
  await sql`update event_log_state set history_floor = ${newer!}`.execute(db)
  t.teardown(() => sql`update event_log_state set history_floor = 0`.execute(db))
  await untilWindowLearnsFloor(app, newer!)
  const expired = await take(createClient({ url, token: 'tok' }).watch({}, { after: old! }), 1).catch((error: unknown) => error)
  t.ok(expired instanceof CursorExpired)
  t.match(expired, { status: 410, code: 'cursor_expired', cursor: old })
  const refused = await take(createClient({ url, token: 'wrong' }).watch({}, { after: newer! }), 1).catch((error: unknown) => error)
  t.match(refused, { status: 401, code: 'unauthorized' })
})

t.test('watch: a 503, or a 200 stream that ends at once (a refusal sent as a stream), is retried with backoff', async (t) => {
  const { url } = await serve(t)
  const [base, id] = await insertEvents({ run_id: 'run-c1' }, { run_id: 'run-c1' })
  const refusals = [
    () => new Response(JSON.stringify({ error: { code: 'unavailable', message: 'busy' } }), { status: 503 }),
    () => new Response('retry: 50\n: this instance is at its stream limit\n\n', { status: 200, headers: { 'content-type': 'text/event-stream' } })
  ]
  const { fetcher, requests } = recordingFetch((requestUrl) => requestUrl.includes('/stream') ? refusals.shift()?.() : undefined)
  const statuses: StreamStatus[] = []
  const ids = await take(createClient({ url, fetch: fetcher }).watch({ run_id: 'run-c1' }, { after: base!, onStatus: (status) => statuses.push(status) }), 1)
  t.same(ids, [id])
  t.equal(requests.filter((request) => request.url.includes('/stream')).length, 3, 'two refusals, then the stream')
  t.match(statuses.filter((status) => status.state === 'retrying'), [{ error: { status: 503 }, reason: 'busy' }, { delayMs: Number, reason: 'the stream ended: this instance is at its stream limit' }], 'each retry says why')
  t.notOk(statuses.slice(0, statuses.findIndex((status) => status.state === 'retrying' && status.error === undefined)).some((status) => status.state === 'live'), 'a refusal sent as a stream is not live')

  const controller = new AbortController()
  const never = createClient({ url: `http://127.0.0.1:${await freePort()}` }).watch({}, { after: 0, signal: controller.signal, maxDelayMs: 50 })
  setTimeout(() => controller.abort(), 300)
  t.same(await take(never, 1), [], 'an unreachable service: retried until aborted, then the iteration ends')
})

t.test('an unreachable service: followRun and liveRun retry the read, saying why, until stopped', async (t) => {
  const nowhere = createClient({ url: `http://127.0.0.1:${await freePort()}` })
  const statuses: StreamStatus[] = []
  const onStatus = (status: StreamStatus) => statuses.push(status)
  const items: unknown[] = []
  for await (const item of nowhere.followRun('run-c1', { signal: AbortSignal.timeout(300), onStatus })) items.push(item)
  t.same(items, [], 'nothing read, and the iteration ended')
  const live = nowhere.liveRun('run-c1', () => t.fail('no snapshot'), { onStatus, onError: (error) => t.fail(error.message) })
  await waitUntil(() => statuses.length >= 2, 'the live loop retrying too')
  live.close()
  t.match(statuses, Array(statuses.length).fill({ state: 'retrying', reason: /^cannot reach the service: ECONNREFUSED$/, error: { status: 0, transient: true } }))
  await delay(60_000, AbortSignal.abort()) // an aborted signal: at once
})

async function commitTask (runId: string, taskId: string, status: string) {
  const db = await writer()
  await db.transaction().execute(async (trx) => {
    await trx.updateTable('tasks').set({ status, updated_at: new Date() }).where('run_id', '=', runId).where('task_id', '=', taskId).execute()
    await trx.insertInto('events').values({ event_type: `task_${status}`, run_id: runId, task_id: taskId }).execute()
  })
}

/** Waits until nothing new was handed out for `quietMs`. */
async function quiet (count: () => number, quietMs = 500) {
  let seen = -1
  await waitUntil(async () => { const now = count(); if (now === seen) return true; seen = now; await sleep(quietMs); return false }, 'a quiet period', 60_000)
}

t.test('liveRun: whole reads only, coalesced, and after a quiet period the last equals a fresh read', async (t) => {
  const { url } = await serve(t)
  const client = createClient({ url })
  const snapshots: RunDetail[] = []
  const live = client.liveRun('run-c1', (body) => snapshots.push(body.run))
  t.teardown(() => live.close())
  await waitUntil(() => snapshots.length === 1, 'the first snapshot')
  const statuses = ['done', 'failed', 'running', 'blocked', 'done']
  let writes = 0
  for (let round = 0; round < 20; round++) {
    await commitTask('run-c1', ['task-a', 'task-c'][round % 2]!, statuses[round % statuses.length]!)
    writes++
  }
  await quiet(() => snapshots.length)
  t.ok(snapshots.length < writes + 1, `coalesced: ${snapshots.length} snapshots for ${writes} writes`)
  for (const snapshot of snapshots) {
    const counted = Object.values(snapshot.task_counts).reduce((sum, n) => sum + n, 0)
    t.equal(counted, snapshot.tasks.length, 'each snapshot is a whole read: its counts match its tasks')
  }
  t.same(snapshots.at(-1), (await client.run('run-c1')).run, 'the last equals a fresh read')
})

t.test('liveRun: after the history moved past its cursor (410), it reads and subscribes again by itself', async (t) => {
  const first = await serve(t)
  const client = createClient({ url: first.url })
  const snapshots: RunDetail[] = []
  const live = client.liveRun('run-c1', (body) => snapshots.push(body.run), { maxDelayMs: 300 })
  t.teardown(() => live.close())
  await waitUntil(() => snapshots.length === 1, 'the first snapshot')
  await first.app.close()
  await commitTask('run-c1', 'task-a', 'failed') // while it is away, and then the history's floor passes its cursor
  const db = await writer()
  await sql`update event_log_state set history_floor = (select max(event_id) from events)`.execute(db)
  t.teardown(() => sql`update event_log_state set history_floor = 0`.execute(db))
  await serve(t, {}, first.port)
  await waitUntil(() => snapshots.at(-1)?.tasks.find((task) => task.task_id === 'task-a')?.status === 'failed', 'the change made while away', 60_000)
  await commitTask('run-c1', 'task-a', 'running')
  await waitUntil(() => snapshots.at(-1)?.tasks.find((task) => task.task_id === 'task-a')?.status === 'running', 'a change made after it resubscribed')
  t.same(snapshots.at(-1), (await client.run('run-c1')).run)
})

t.test('liveThread and liveRuns; an unknown id or a refused token ends the loop, through onError', async (t) => {
  const { url } = await serve(t)
  const { fetcher: counting, requests: laterRequests } = recordingFetch()
  const client = createClient({ url })
  const threads: unknown[] = []
  const lists: RunList[] = []
  const nexts: Array<string | undefined> = []
  const errors: ApiError[] = []
  const lives = [
    client.liveThread('thread-c', (body) => threads.push(body)),
    client.liveRuns({ limit: 2, status: ['running', 'done', 'failed'] }, (body, read) => { lists.push(body); nexts.push(read.next) }),
    createClient({ url, fetch: counting }).liveRun('run-later', () => {}, { onError: (error) => errors.push(error), maxDelayMs: 100 })
  ]
  t.teardown(() => { for (const live of lives) live.close() })
  await waitUntil(() => threads.length === 1 && lists.length === 1 && errors.length === 1, 'the first snapshots and the error')
  t.equal(lists[0]!.runs.length, 2)
  t.type(nexts[0], 'string')
  t.match(errors[0], { status: 404, code: 'not_found' })
  await sleep(300)
  t.equal(errors.length, 1, 'reported once')
  t.equal(laterRequests.length, 1, 'and never read again')
  const db = await writer()
  await db.transaction().execute(async (trx) => {
    await trx.insertInto('messages').values(makeMessage({ thread_id: 'thread-c', message_id: 'msg-c2' })).execute()
    await trx.insertInto('events').values({ event_type: 'thread_reply', run_id: 'run-c1', thread_id: 'thread-c' }).execute()
  })
  await waitUntil(() => threads.length === 2, 'the thread again')
  const { fetcher } = recordingFetch((requestUrl) => requestUrl.includes('/stream') ? new Response(JSON.stringify({ error: { code: 'unauthorized', message: 'no streams for you' } }), { status: 401 }) : undefined)
  const streamErrors: ApiError[] = []
  const refused = createClient({ url, fetch: fetcher }).liveRun('run-c1', () => {}, { onError: (error) => streamErrors.push(error), maxDelayMs: 100 })
  t.teardown(() => refused.close())
  await waitUntil(() => streamErrors.length >= 1, 'the stream\'s refusal')
  t.match(streamErrors[0], { status: 401, detail: 'no streams for you' }, 'a stream refused for good ends the loop')
  const tokenErrors: ApiError[] = []
  const refusedRead = createClient({ url, fetch: async (input, init) => String(input).includes('/api/runs') ? new Response('{"error":{"code":"forbidden","message":"not yours"}}', { status: 403 }) : fetch(input, init) })
    .liveRuns({}, () => {}, { onError: (error) => tokenErrors.push(error) })
  t.teardown(() => refusedRead.close())
  await waitUntil(() => tokenErrors.length === 1, 'the 403')
  t.match(tokenErrors[0], { status: 403, detail: 'not yours' })
  await insertGraph({ runs: [makeRun({ run_id: 'run-c4', status: 'running' })] })
  await insertEvents({ run_id: 'run-c4' })
  await waitUntil(() => lists.at(-1)!.runs[0]!.run.run_id === 'run-c4', 'the new run at the top of the list')
})

t.test('watch({ after: 0 }): from the oldest event kept, never a 410, though retention dropped older ones', async (t) => {
  const { app, url } = await serve(t)
  const db = await writer()
  const [gone, kept] = await insertEvents({ run_id: 'run-old' }, { run_id: 'run-old' })
  await sql`update event_log_state set history_floor = ${gone!}`.execute(db)
  t.teardown(() => sql`update event_log_state set history_floor = 0`.execute(db))
  await untilWindowLearnsFloor(app, gone!)
  const client = createClient({ url })
  t.same(await take(client.watch({ run_id: 'run-old' }, { after: 0 }), 1), [kept], 'the oldest kept event of the run')
  // None kept matches: from the position of that read.
  const statuses: StreamStatus[] = []
  const events = client.watch({ run_id: 'run-none-yet' }, { after: 0, onStatus: (status) => statuses.push(status) })
  const next = events.next()
  await waitUntil(() => statuses.some((status) => status.state === 'live'), 'the stream to open')
  const [fresh] = await insertEvents({ run_id: 'run-none-yet' })
  t.equal((await next).value?.event_id, fresh)
  await events.return()
})

t.test('followRun: the read, then each event after it; a fresh read after a 410; a refusal retrying cannot fix throws', async (t) => {
  const first = await serve(t)
  const client = createClient({ url: first.url })
  const items: Array<Followed<RunDetailEnvelope>> = []
  const controller = new AbortController()
  const following = (async () => { for await (const item of client.followRun('run-c2', { signal: controller.signal, maxDelayMs: 300 })) items.push(item) })()
  await waitUntil(() => items.length === 1, 'the read')
  t.match(items[0], { kind: 'read', body: { run: { run: { run_id: 'run-c2', status: 'done' } } }, read: { eventCursor: Number } })
  const written = await insertEvents({ run_id: 'run-c2' }, { run_id: 'run-other' }, { run_id: 'run-c2' })
  await waitUntil(() => items.length === 3, 'two events')
  t.same(items.slice(1).map((item) => item.kind === 'event' && item.event.event_id), [written[0], written[2]], 'the run\'s events, in order')

  await first.app.close()
  await insertEvents({ run_id: 'run-c2' }) // while it is away, and then the history's floor passes its cursor
  const db = await writer()
  await sql`update event_log_state set history_floor = (select max(event_id) from events)`.execute(db)
  t.teardown(() => sql`update event_log_state set history_floor = 0`.execute(db))
  await serve(t, {}, first.port)
  await waitUntil(() => items.length === 4, 'a fresh read', 60_000)
  t.equal(items[3]!.kind, 'read', 'read again, not the events lost')
  const [after] = await insertEvents({ run_id: 'run-c2' })
  await waitUntil(() => items.length === 5, 'the event after it')
  t.match(items[4], { kind: 'event', event: { event_id: after } })
  controller.abort()
  await following

  const missing = await client.followRun('no-such-run').next().catch((error: unknown) => error)
  t.match(missing, { status: 404, code: 'not_found', terminal: true })
  const runs = await client.followRuns({ limit: 1 }).next()
  t.match(runs.value, { kind: 'read', body: { runs: [{ run: { run_id: String } }] } })
  const { url: guarded } = await serve(t, { API_TOKENS: 'tok' })
  const refused = await createClient({ url: guarded, token: 'wrong' }).followThread('thread-c').next().catch((error: unknown) => error)
  t.match(refused, { status: 401, code: 'unauthorized' })
})

t.test('follow and live: a failure neither transient nor terminal (a 500) is retried, slowly, and said', async (t) => {
  const { url } = await serve(t)
  let readFailures = 1
  let streamFailures = 1
  const failing = () => new Response('{"error":{"code":"internal","message":"a bad moment"}}', { status: 500 })
  const { fetcher } = recordingFetch((requestUrl) => {
    if (requestUrl.includes('/stream')) return streamFailures-- > 0 ? failing() : undefined
    return requestUrl.includes('/api/runs/run-c3') && readFailures-- > 0 ? failing() : undefined
  })
  const statuses: StreamStatus[] = []
  const controller = new AbortController()
  const items: Array<Followed<RunDetailEnvelope>> = []
  const following = (async () => {
    for await (const item of createClient({ url, fetch: fetcher }).followRun('run-c3', { signal: controller.signal, maxDelayMs: 100, onStatus: (status) => statuses.push(status) })) items.push(item)
  })()
  await waitUntil(() => items.length === 1 && streamFailures < 0, 'the read, and the stream tried')
  const [id] = await insertEvents({ run_id: 'run-c3' })
  await waitUntil(() => items.length === 2, 'the event')
  t.match(items[1], { kind: 'event', event: { event_id: id } })
  t.match(statuses.filter((status) => status.state === 'retrying'), [{ reason: 'a bad moment', error: { status: 500 } }, { reason: 'a bad moment', error: { status: 500 } }], 'the read and the stream, each retried once')
  controller.abort()
  await following
})

t.test('a 200 whose body is the one kept (a proxy that drops ETags): the kept body is handed out again, not parsed anew', async (t) => {
  const server = createServer((_request, response) => {
    response.writeHead(200, { 'content-type': 'application/json' }).end('{"runs":[]}')
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => server.close())
  const { port } = server.address() as { port: number }
  const client = createClient({ url: `http://127.0.0.1:${port}` })
  const first = await client.runs()
  const second = await client.runs()
  t.same(second, { runs: [] })
  t.equal(second, first, 'the same object')
})
