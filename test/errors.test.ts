import t from 'tap'
import { buildApp } from '../app.ts'
import { ApiError, isDatabaseUnavailable, toApiError } from '../errors.ts'
import { build, testConfig } from './helpers/app.ts'
import { assertSchema } from './helpers/contract.ts'
import { insertGraph, lockTable, makeRun } from './helpers/fixtures.ts'
import { PROMPTLY_MS, waitUntil } from './helpers/wait.ts'

// Database faults are 503 `unavailable`, the unforeseen is a bare 500 `internal`.

t.before(() => insertGraph({ runs: [makeRun({ run_id: 'run-e' })] }))

t.test('an unreachable database answers 503 unavailable, quickly; /health stays 200', async (t) => {
  const app = await build(t, { DATABASE_URL: 'postgres://postgres@127.0.0.1:1/none', DB_CONNECT_TIMEOUT_MS: 500 })
  for (const url of ['/api/runs', '/api/runs/run-e', '/api/runs/run-e/tasks', '/api/runs/run-e/blocked', '/api/threads/x']) {
    const started = Date.now()
    const res = await app.inject(url)
    t.equal(res.statusCode, 503, url)
    assertSchema(t, 'ErrorEnvelope', res.json())
    t.same(res.json(), { error: { code: 'unavailable', message: 'the database is unavailable, try again shortly' } })
    t.ok(Date.now() - started < PROMPTLY_MS, 'within the connect timeout, not hanging')
  }
  t.same((await app.inject('/health')).json(), { status: 'ok' })
})

t.test('a statement past the timeout is cancelled and answers 503', async (t) => {
  const app = await build(t, { DB_STATEMENT_TIMEOUT_MS: 100 })
  // Hold an exclusive lock so the read has to wait past its timeout.
  const release = await lockTable('runs')
  try {
    const res = await app.inject('/api/runs/run-e')
    t.equal(res.statusCode, 503)
    t.equal(res.json().error.code, 'unavailable')
  } finally {
    await release()
  }
  // The read has the same 100 ms, which a loaded machine can pass: until it answers.
  await waitUntil(async () => (await app.inject('/api/runs/run-e')).statusCode === 200, 'a read once the lock is gone')
  t.pass('and serves again once the lock is gone')
})

t.test('an unexpected error is 500 internal, leaking nothing', async (t) => {
  const app = await buildApp(await testConfig())
  t.teardown(() => app.close())
  app.get('/boom', async () => { throw new Error('select secret from passwords at /srv/app.ts:1') })
  const res = await app.inject('/boom')
  t.equal(res.statusCode, 500)
  t.same(res.json(), { error: { code: 'internal', message: 'internal server error' } })
})

t.test('toApiError maps what is thrown', async (t) => {
  const cases: Array<[unknown, number, string]> = [
    [new ApiError('not_found', 'x'), 404, 'not_found'],
    [Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' }), 503, 'unavailable'],
    [Object.assign(new Error('terminating connection'), { code: '57P01' }), 503, 'unavailable'],
    [Object.assign(new Error('too many connections'), { code: '53300' }), 503, 'unavailable'],
    [Object.assign(new Error('canceling statement due to statement timeout'), { code: '57014' }), 503, 'unavailable'],
    [new Error('timeout exceeded when trying to connect'), 503, 'unavailable'],
    [new Error('Connection terminated unexpectedly'), 503, 'unavailable'],
    [Object.assign(new Error('invalid byte sequence for encoding "UTF8": 0x00'), { code: '22021' }), 400, 'bad_request'],
    [Object.assign(new Error('body too large'), { statusCode: 413, code: 'FST_ERR_CTP_BODY_TOO_LARGE' }), 413, 'bad_request'],
    [Object.assign(new Error('Unsupported Media Type'), { statusCode: 415, code: 'FST_ERR_CTP_INVALID_MEDIA_TYPE' }), 415, 'bad_request'],
    [Object.assign(new Error('secret'), { statusCode: 400 }), 400, 'bad_request'],
    [Object.assign(new Error('nope'), { statusCode: 401 }), 401, 'unauthorized'],
    [Object.assign(new Error('gone'), { statusCode: 404 }), 404, 'not_found'],
    [Object.assign(new Error('busy'), { statusCode: 503 }), 503, 'unavailable'],
    [Object.assign(new Error('syntax error at or near'), { code: '42601' }), 500, 'internal'],
    [Object.assign(new URIError("'/%zz' is not a valid url component"), { statusCode: 400, code: 'FST_ERR_BAD_URL' }), 400, 'bad_request'],
    [Object.assign(new URIError("'xxx' is exceeding the max param length"), { statusCode: 414, code: 'FST_ERR_MAX_PARAM_LENGTH' }), 404, 'not_found'],
    ['a string', 500, 'internal'],
    [null, 500, 'internal']
  ]
  for (const [thrown, status, code] of cases) {
    const error = toApiError(thrown)
    t.equal(error.statusCode, status, String((thrown as Error)?.message ?? thrown))
    t.equal(error.code, code)
  }
  t.equal(toApiError(Object.assign(new Error('secret'), { statusCode: 400 })).message, 'bad request', 'no message of unknown origin is echoed')
  const refused = Object.assign(new Error('querystring/x must be string'), { statusCode: 400, code: 'FST_ERR_VALIDATION', validation: [{ instancePath: '/x' }], validationContext: 'querystring' })
  t.same(toApiError(refused).toBody(), { error: { code: 'bad_request', message: 'a parameter of the request is not valid' } }, 'a parameter without its sentence: a bare one, never the validator\'s')
  t.same(toApiError(refused, { querystring: { properties: { x: { 'x-accepts': 'x must be y' } } } }).message, 'x must be y', 'else the sentence of its schema')
  t.equal(toApiError(Object.assign(new Error('bad'), { statusCode: 400, validation: [] })).message, 'a parameter of the request is not valid')
  t.notOk(isDatabaseUnavailable(undefined))
  t.notOk(isDatabaseUnavailable({ code: 42 }))
})
