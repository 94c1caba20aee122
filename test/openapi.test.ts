import SwaggerParser from '@apidevtools/swagger-parser'
import { sql } from 'kysely'
import { Ajv } from 'ajv'
import addFormats from 'ajv-formats'
import t, { type Test } from 'tap'
import { build, untilWindowLearnsFloor } from './helpers/app.ts'
import { insertGraph, json, makeArtifact, makeAttempt, makeMessage, makeRun, makeTask, makeThread, writer } from './helpers/fixtures.ts'
import { insertEvents, openStream } from './helpers/sse.ts'

// The OpenAPI document: valid, complete against docs/reference.md, "Endpoints", named
// components, and true: real responses validate against its own schemas.

interface Operation { operationId: string, parameters?: Array<{ name: string, in: string }>, responses: Record<string, { content?: Record<string, { schema: unknown }> }> }
type Document = { openapi: string, info: { version: string }, paths: Record<string, Record<string, Operation>>, components: { schemas: Record<string, unknown> } }

const specOperations = [
  ['getHealth', '/health', ['200']],
  ['listRuns', '/api/runs', ['200']],
  ['getRunDetail', '/api/runs/{runID}', ['200', '404']],
  ['listRunTasks', '/api/runs/{runID}/tasks', ['200', '404']],
  ['getTaskDetail', '/api/runs/{runID}/tasks/{taskID}', ['200', '304', '404']],
  ['listBlockedTasks', '/api/runs/{runID}/blocked', ['200', '404']],
  ['getThreadDetail', '/api/threads/{threadID}', ['200', '404']]
] as const

const specResources = ['Run', 'RunListItem', 'RunDetail', 'Task', 'TaskAttempt', 'Artifact', 'Message', 'Thread', 'ThreadDetail', 'TaskDetail', 'BlockedTask', 'ErrorEnvelope', 'Event']

t.before(() => insertGraph({
  runs: [makeRun({ run_id: 'run-o' })],
  tasks: [
    makeTask({ run_id: 'run-o', task_id: 'task-blocked', status: 'blocked', latest_attempt_no: 1, default_to: 'alice', acceptance_json: json([1, 'a', null]) }),
    makeTask({ run_id: 'run-o', task_id: 'task-plain', acceptance_json: json('text') })
  ],
  task_attempts: [makeAttempt({ run_id: 'run-o', task_id: 'task-blocked', thread_id: 'thread-o', base_ref: 'main' })],
  threads: [makeThread({ run_id: 'run-o', task_id: 'task-blocked', thread_id: 'thread-o', latest_message_id: 'msg-q' })],
  messages: [makeMessage({ thread_id: 'thread-o', message_id: 'msg-q', kind: 'question', payload_json: json(null) })],
  artifacts: [makeArtifact({ message_id: 'msg-q', metadata_json: json({ deep: { x: [true] } }) })]
}))

async function fetchDocument (t: Test) {
  const app = await build(t)
  const res = await app.inject('/openapi.json')
  t.equal(res.statusCode, 200)
  return { app, doc: res.json() as Document }
}

t.test('the document is valid OpenAPI 3, version 0.1.0', async (t) => {
  const { doc } = await fetchDocument(t)
  t.match(doc.openapi, /^3\./)
  t.equal(doc.info.version, '0.1.0')
  await t.resolves(SwaggerParser.validate(structuredClone(doc) as never), 'swagger-parser validates it')
})

t.test('every operation of docs/reference.md, "Endpoints", by operation id, path and status', async (t) => {
  const { doc } = await fetchDocument(t)
  for (const [operationId, path, statuses] of specOperations) {
    const operation = doc.paths[path]?.get
    t.equal(operation?.operationId, operationId, `${operationId} at GET ${path}`)
    for (const status of statuses) t.ok(operation?.responses[status], `${operationId} documents ${status}`)
  }
})

t.test('with authentication on, the document says which operations are open (security: []) and which need a token', async (t) => {
  const app = await build(t, { API_TOKENS: 'a-token' })
  const doc = (await app.inject('/openapi.json')).json() as Document & { security?: unknown }
  t.same(doc.security, [{ bearerToken: [] }], 'a token by default')
  const open: string[] = []
  for (const [path, operations] of Object.entries(doc.paths)) {
    for (const [method, operation] of Object.entries(operations)) {
      const security = (operation as { security?: unknown[] }).security
      if (security !== undefined) t.same(security, [], `${method} ${path}: open`)
      if (security !== undefined) open.push(operation.operationId)
      // What the document says is what the service does.
      const url = path.replace(/\{[^}]+\}/g, 'x') + (path.startsWith('/api/streams') && method === 'get' ? '?offset=now' : '')
      const answer = await app.inject({ method: method.toUpperCase() as 'GET', url })
      t.equal(answer.statusCode === 401, security === undefined, `${method} ${path}: ${answer.statusCode} without a token`)
    }
  }
  t.same(open.sort(), ['getAuth', 'getHealth', 'getReady', 'signOut'])
})

t.test('with authentication off, every operation but the probes documents 421 for a foreign Host, and answers it', async (t) => {
  const { app, doc } = await fetchDocument(t)
  const unchecked: string[] = []
  for (const [path, operations] of Object.entries(doc.paths)) {
    for (const [method, operation] of Object.entries(operations)) {
      const documented = operation.responses['421'] !== undefined
      if (!documented) unchecked.push(operation.operationId)
      // What the document says is what the service does (allowed-hosts.ts).
      const url = path.replace(/\{[^}]+\}/g, 'x') + (path.startsWith('/api/streams') && method === 'get' ? '?offset=now' : '')
      const answer = await app.inject({ method: method.toUpperCase() as 'GET', url, headers: { host: 'attacker.example' } })
      t.equal(answer.statusCode === 421, documented, `${method} ${path}: ${answer.statusCode} for a foreign Host`)
    }
  }
  t.same(unchecked.sort(), ['getHealth', 'getReady'], 'the probes alone never answer it')
})

t.test('components carry the resources\' names; every error response is the envelope', async (t) => {
  const { doc } = await fetchDocument(t)
  const names = Object.keys(doc.components.schemas)
  for (const name of specResources) t.ok(names.includes(name), `component ${name}`)
  t.same(names.filter((name) => /^def-\d+$/.test(name)), [], 'no def-N component')
  for (const [path, methods] of Object.entries(doc.paths)) {
    for (const [method, operation] of Object.entries(methods)) {
      for (const [status, response] of Object.entries(operation.responses)) {
        if (Number(status) < 400) continue
        t.same(response.content?.['application/json']?.schema, { $ref: '#/components/schemas/ErrorEnvelope' }, `${method.toUpperCase()} ${path} ${status}`)
      }
    }
  }
})

t.test('the event stream is documented as text/event-stream with its parameters', async (t) => {
  const { doc } = await fetchDocument(t)
  const stream = doc.paths['/api/events/stream']?.get
  t.ok(stream)
  t.same(stream!.responses['200']?.content?.['text/event-stream']?.schema, { $ref: '#/components/schemas/Event' })
  const parameters = (stream!.parameters ?? []).map((parameter) => `${parameter.in}:${parameter.name}`)
  for (const parameter of ['query:after_event_id', 'query:run_id', 'query:thread_id', 'header:last-event-id']) t.ok(parameters.includes(parameter), parameter)
  t.ok(doc.paths['/api/events']?.get, 'the JSON page too')
  t.ok(stream!.responses['410'] && doc.paths['/api/events']!.get!.responses['410'], 'both document 410 cursor_expired')
  t.notOk(stream!.responses['503'], 'the stream never answers 503 (a transient refusal is a retry)')
  t.ok(doc.paths['/api/events']!.get!.responses['503'], 'the JSON page does')
})

t.test('real responses validate against the document\'s own schemas', async (t) => {
  const { app, doc } = await fetchDocument(t)
  const ajv = new Ajv({ strict: false, allErrors: true })
  addFormats.default(ajv)
  ajv.addSchema(doc as object, 'openapi.json')
  const pointer = (path: string, status: string, type = 'application/json') =>
    `openapi.json#/paths/${path.replaceAll('~', '~0').replaceAll('/', '~1')}/get/responses/${status}/content/${type.replaceAll('/', '~1')}/schema`
  const check = (path: string, status: string, body: unknown, label: string) => {
    const validate = ajv.compile({ $ref: pointer(path, status) })
    t.ok(validate(body), label, { errors: validate.errors })
  }
  await insertEvents({ run_id: 'run-o', payload: json({ k: 1 }) })
  const cases: Array<[string, string, number]> = [
    ['/health', '/health', 200],
    ['/api/runs', '/api/runs', 200],
    ['/api/runs/{runID}', '/api/runs/run-o', 200],
    ['/api/runs/{runID}/tasks', '/api/runs/run-o/tasks', 200],
    ['/api/runs/{runID}/tasks/{taskID}', '/api/runs/run-o/tasks/task-blocked', 200],
    ['/api/runs/{runID}/blocked', '/api/runs/run-o/blocked', 200],
    ['/api/threads/{threadID}', '/api/threads/thread-o', 200],
    ['/api/events', '/api/events', 200],
    ['/api/runs/{runID}', '/api/runs/nope', 404],
    ['/api/runs/{runID}/tasks', '/api/runs/nope/tasks', 404],
    ['/api/runs/{runID}/tasks/{taskID}', '/api/runs/run-o/tasks/nope', 404],
    ['/api/runs/{runID}/blocked', '/api/runs/nope/blocked', 404],
    ['/api/threads/{threadID}', '/api/threads/nope', 404],
    ['/api/runs', '/api/runs?limit=0', 400],
    ['/api/runs', '/api/runs?blocked=yes', 400],
    ['/api/events', '/api/events?after_event_id=x', 400]
  ]
  for (const [path, url, status] of cases) {
    const res = await app.inject(url)
    t.equal(res.statusCode, status, url)
    check(path, String(status), res.json(), `${url} (${status}) matches the document`)
  }
  const detail = (await app.inject('/api/runs/run-o')).json()
  t.equal(detail.run.blocked_tasks.length, 1, 'the blocked task (attempt, question, artifacts) was in what was checked')

  // An event off the wire against the document's Event schema.
  await app.listen({ port: 0, host: '127.0.0.1' })
  const { port } = app.server.address() as { port: number }
  const stream = await openStream(`http://127.0.0.1:${port}`, '/api/events/stream?after_event_id=0')
  t.teardown(stream.close)
  await stream.waitFor((s) => s.events().length >= 1)
  const validateEvent = ajv.compile({ $ref: pointer('/api/events/stream', '200', 'text/event-stream') })
  t.ok(validateEvent(stream.events()[0]), 'a streamed event matches the document', { errors: validateEvent.errors })

  // Cursors older than the history kept (EVENTS_RETENTION): both operations document the 410.
  const db = await writer()
  await sql`update event_log_state set history_floor = 1`.execute(db)
  t.teardown(() => sql`update event_log_state set history_floor = 0`.execute(db))
  await untilWindowLearnsFloor(app, 1)
  const expiredPage = await app.inject('/api/events?after_event_id=0')
  t.equal(expiredPage.statusCode, 410)
  check('/api/events', '410', expiredPage.json(), 'GET /api/events?after_event_id=0 (410) matches the document')
  const expiredStream = await openStream(`http://127.0.0.1:${port}`, '/api/events/stream?after_event_id=0')
  await expiredStream.ended
  t.equal(expiredStream.status, 410)
  const validateExpired = ajv.compile({ $ref: `openapi.json#/paths/${'/api/events/stream'.replaceAll('/', '~1')}/get/responses/410/content/application~1json/schema` })
  t.ok(validateExpired(JSON.parse(expiredStream.body)), 'a stream refused with 410 matches the document', { errors: validateExpired.errors })
})

t.test('/docs works with no network: every asset it loads is served here', async (t) => {
  const { app } = await fetchDocument(t)
  const page = await app.inject('/docs/')
  t.equal(page.statusCode, 200)
  t.match(page.headers['content-type'], /text\/html/)
  t.notMatch(page.body, /(src|href)="(https?:)?\/\//, 'no asset from another host')
  const assets = [...page.body.matchAll(/(?:src|href)="\.\/([^"]+)"/g)].map((match) => match[1]!)
  t.ok(assets.length >= 3, `${assets.length} assets`)
  for (const asset of assets) {
    const res = await app.inject(`/docs/${asset}`)
    t.equal(res.statusCode, 200, asset)
  }
  const initializer = await app.inject('/docs/static/swagger-initializer.js')
  t.notMatch(initializer.body, /petstore|unpkg|jsdelivr|cdnjs/i, 'the initializer loads the spec from here, nothing from a CDN')
  t.ok(page.headers['content-security-policy'], 'a content security policy')
  t.equal(page.headers['x-content-type-options'], 'nosniff')
})
