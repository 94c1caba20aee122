import { sql } from 'kysely'
import t, { type Test } from 'tap'
import { EXIT, main, parseDuration, type Io } from '../client/src/ocp-api.ts'
import type { Config } from '../config.ts'
import { serve as serveApp, untilWindowLearnsFloor } from './helpers/app.ts'
import { createRun } from '../db/writer.ts'
import { insertGraph, makeRun, makeTask, makeAttempt, makeThread, makeMessage, writer } from './helpers/fixtures.ts'
import { insertEvents } from './helpers/sse.ts'
import { spawn } from 'node:child_process'
import { createServer } from 'node:http'
import { once } from 'node:events'
import { root } from './helpers/run.ts'
import { freePort, PROMPTLY_MS, sleep, waitUntil } from './helpers/wait.ts'

// The ocp-api command: its commands against the real service, in process
// (main with captured output), and the bin as a user runs it.

t.before(() => insertGraph({
  runs: [makeRun({ run_id: 'run-cli', goal: 'Ship the CLI', status: 'running' }), makeRun({ run_id: 'run-done', status: 'done' })],
  tasks: [
    makeTask({ run_id: 'run-cli', task_id: 'task-1', title: 'Write it', status: 'done' }),
    makeTask({ run_id: 'run-cli', task_id: 'task-2', title: 'Ask', status: 'blocked', latest_attempt_no: 1 })
  ],
  task_attempts: [makeAttempt({ run_id: 'run-cli', task_id: 'task-2', thread_id: 'thread-cli' })],
  threads: [makeThread({ run_id: 'run-cli', task_id: 'task-2', thread_id: 'thread-cli' })],
  messages: [makeMessage({ thread_id: 'thread-cli', message_id: 'msg-cli', kind: 'question', summary: 'Which way?' })]
}))

/** This file's application, listening. */
const serve = (t: Test, overrides: Partial<Config> = {}) => serveApp(t, { EVENTS_POLL_INTERVAL_MS: 50, SSE_RETRY_MS: 100, ...overrides })

interface Ran { code: number, stdout: string, stderr: string }

/** Runs main with captured output; `output`, when given, fills as it runs (for a test to watch). */
async function cli (args: string[], env: Record<string, string> = {}, options: { color?: boolean, signal?: AbortSignal, output?: { stdout: string, stderr: string } } = {}): Promise<Ran> {
  const out = options.output ?? { stdout: '', stderr: '' }
  const io: Io = { stdout: (text) => { out.stdout += text }, stderr: (text) => { out.stderr += text }, env, color: options.color ?? false, ...(options.signal ? { signal: options.signal } : {}) }
  const code = await main(args, io)
  return { code, ...out }
}

async function setRunStatus (runId: string, status: string) {
  const db = await writer()
  await db.transaction().execute(async (trx) => {
    await trx.updateTable('runs').set({ status, updated_at: new Date() }).where('run_id', '=', runId).execute()
    await trx.insertInto('events').values({ event_type: 'run_status', run_id: runId, summary: status }).execute()
  })
}

t.test('--help on every command; usage errors are exit 2 with the usage, never a stack trace', async (t) => {
  const help = await cli(['--help'])
  t.equal(help.code, EXIT.ok)
  t.match(help.stdout, /Usage: ocp-api COMMAND/)
  t.match(help.stdout, /Exit codes:\n {2}0 .*\n {2}1 {2}the service could not be reached[^]*\n {2}2 [^]*\n {2}3 /, 'every exit code, 1 for a service out of reach included')
  t.match((await cli(['wait', '--help'])).stdout, /--connect-timeout DURATION[^]*\(default 30s\)[^]*Exit codes:/, 'the default deadline, and the exit codes')
  for (const command of ['runs', 'run', 'watch', 'wait']) {
    const { code, stdout } = await cli([command, '--help'])
    t.equal(code, 0)
    t.match(stdout, new RegExp(`^Usage: ocp-api ${command}`), `${command} --help`)
  }
  t.equal((await cli([])).code, EXIT.usage, 'no command')
  for (const [args, message] of [
    [['launch'], /unknown command "launch"/],
    [['runs', '--bogus'], /^ocp-api: Unknown option '--bogus'\n\nUsage: ocp-api runs/],
    [['runs', '--limit', '0'], /--limit must be an integer from 1 to 1000, not "0"/],
    [['runs', 'extra'], /runs takes no argument, not "extra"/],
    [['run'], /run takes one RUN_ID/],
    [['run', 'a', 'b'], /run takes one RUN_ID, not 2 arguments/],
    [['watch', '--after=-1'], /--after must be an event id/],
    [['wait', 'run-cli', '--until', ','], /--until must name a status/],
    [['wait', 'run-cli', '--until', 'done', '--timeout', '3 weeks'], /--timeout must be a duration such as 90s, 10m, 1h or 500ms, not "3 weeks"/],
    [['watch', '--connect-timeout', 'soon'], /--connect-timeout must be a duration such as 90s, 10m, 1h or 500ms, not "soon"/],
    [['runs', '--url', 'ftp://x'], /--url must be an http\(s\) URL/]
  ] as Array<[string[], RegExp]>) {
    const ran = await cli(args)
    t.equal(ran.code, EXIT.usage, args.join(' '))
    t.match(ran.stderr, message)
    t.notMatch(ran.stderr, /\n {4}at /, 'no stack trace')
  }
  t.same([parseDuration('90s'), parseDuration('10m'), parseDuration('1h'), parseDuration('500ms'), parseDuration('2.5'), parseDuration('x')], [90_000, 600_000, 3_600_000, 500, 2500, undefined])
})

t.test('runs and run: tables for people, --json for programs; paging; errors in one line', async (t) => {
  const { url } = await serve(t)
  const env = { OCP_API_URL: url }
  const table = await cli(['runs'], env)
  t.equal(table.code, 0)
  t.match(table.stdout, /^RUN +STATUS +TASKS +CREATED +GOAL\n/)
  t.match(table.stdout, /run-cli +running +2 \(1 blocked, 1 done\) +\S+ +Ship the CLI/)
  const json = await cli(['runs', '--json', '--status', 'done,failed'], env)
  t.same(JSON.parse(json.stdout).runs.map((item: { run: { run_id: string } }) => item.run.run_id), ['run-done'], '--status filters')
  const paged = await cli(['runs', '--limit', '1', '--url', url])
  t.match(paged.stderr, /^ocp-api: more runs: ocp-api runs --limit 1 --cursor \S+\n$/)
  const cursor = /--cursor (\S+)/.exec(paged.stderr)![1]!
  const filtered = await cli(['runs', '--limit', '1', '--status', 'running,done', '--json'], env)
  t.match(filtered.stderr, /^ocp-api: more runs: ocp-api runs --status running,done --limit 1 --cursor \S+ --json\n$/, 'the hint keeps the filter and --json')
  // Without --limit, a next page (the service's default page size) gives the bare hint.
  const paging = createServer((_request, response) => {
    response.writeHead(200, { 'content-type': 'application/json', link: '</api/runs?cursor=k2>; rel="next"' }).end('{"runs":[]}')
  })
  await new Promise<void>((resolve) => paging.listen(0, '127.0.0.1', resolve))
  t.teardown(() => paging.close())
  const bare = await cli(['runs', '--url', `http://127.0.0.1:${(paging.address() as { port: number }).port}`])
  t.equal(bare.stderr, 'ocp-api: more runs: ocp-api runs --cursor k2\n')
  const second = await cli(['runs', '--limit', '1', '--cursor', cursor, '--json'], env)
  t.equal(JSON.parse(second.stdout).runs.length, 1)
  t.equal((await cli(['runs', '--status', 'nothing-has-it'], env)).stdout, 'No runs.\n')
  const colored = await cli(['runs'], env, { color: true })
  t.ok(colored.stdout.startsWith('\u001b[1mRUN'), 'bold headers on a terminal')

  const run = await cli(['run', 'run-cli'], env)
  t.equal(run.code, 0)
  t.match(run.stdout, /^Run run-cli: Ship the CLI\nstatus {3}running\ntasks {4}2 \(1 blocked, 1 done\)/)
  t.match(run.stdout, /TASK +STATUS +PRIORITY +TITLE\ntask-1 +done/)
  t.match(run.stdout, /Blocked task-2 \(attempt 1, thread thread-cli\): Which way\?/)
  t.equal(JSON.parse((await cli(['run', 'run-cli', '--json'], env)).stdout).run.run.run_id, 'run-cli')
  t.match((await cli(['run', 'run-done'], env)).stdout, /\ntasks {4}0\n/, 'a run with no tasks')
  const filteredPage = await cli(['runs', '--limit', '1', '--status', 'running,done', '--json'], env)
  t.match(filteredPage.stderr, /^ocp-api: more runs: ocp-api runs --status running,done --limit 1 --cursor \S+ --json\n$/)

  const missing = await cli(['run', 'no-such-run'], env)
  t.equal(missing.code, EXIT.usage, 'an unknown run is exit 2')
  t.match(missing.stderr, new RegExp(`^ocp-api: run not found \\(HTTP 404 not_found, ${url}/api/runs/no-such-run\\)\\n$`))
  const down = await cli(['runs', '--url', `http://127.0.0.1:${await freePort()}`])
  t.equal(down.code, EXIT.failed)
  t.match(down.stderr, /^ocp-api: cannot reach the service: ECONNREFUSED \(no answer network, http:\/\/127\.0\.0\.1:\d+\/api\/runs\)\n$/)
})

t.test('a refused token is exit 2; --token and OCP_API_TOKEN are sent', async (t) => {
  const { url } = await serve(t, { API_TOKENS: 'ci-token' })
  const refused = await cli(['runs', '--url', url])
  t.equal(refused.code, EXIT.usage)
  t.match(refused.stderr, /HTTP 401 unauthorized/)
  t.equal((await cli(['runs', '--url', url, '--token', 'ci-token'])).code, 0)
  t.equal((await cli(['run', 'run-cli'], { OCP_API_URL: url, OCP_API_TOKEN: 'ci-token' })).code, 0)
  const waiting = await cli(['wait', 'run-cli', '--until', 'done', '--url', url, '--token', 'wrong'])
  t.equal(waiting.code, EXIT.usage, 'wait with a refused token')
})

t.test('watch: one line per event, NDJSON with --json, until interrupted', async (t) => {
  const { url } = await serve(t)
  const [base] = await insertEvents({ run_id: 'run-cli' })
  const [a, , b] = await insertEvents({ run_id: 'run-cli', event_type: 'task_done', task_id: 'task-1', summary: 'done at last' }, { run_id: 'other' }, { run_id: 'run-cli', thread_id: 'thread-cli', event_type: 'thread_reply' })
  const controller = new AbortController()
  const out: string[] = []
  const io: Io = { stdout: (text) => out.push(text), stderr: () => {}, env: { OCP_API_URL: url }, color: false, signal: controller.signal }
  const watching = main(['watch', '--run', 'run-cli', '--after', String(base)], io)
  await waitUntil(() => out.length === 2, 'two lines')
  controller.abort()
  t.equal(await watching, 0)
  t.match(out[0], new RegExp(`^${a}  \\S+  task_done  run=run-cli task=task-1  done at last\\n$`))
  t.match(out[1], new RegExp(`^${b}  \\S+  thread_reply  run=run-cli thread=thread-cli\\n$`))

  const json = new AbortController()
  const lines: string[] = []
  const ndjson = main(['watch', '--thread', 'thread-cli', '--after', String(base), '--json'], { ...io, stdout: (text) => lines.push(text), signal: json.signal })
  await waitUntil(() => lines.length === 1, 'one line')
  json.abort()
  await ndjson
  t.equal(JSON.parse(lines[0]!).event_id, b)
})

t.test('wait: on the stream until the status is in --until; exit 0 in --ok, 1 outside it, 3 on timeout', async (t) => {
  const { url } = await serve(t)
  const env = { OCP_API_URL: url }
  await insertGraph({ runs: [makeRun({ run_id: 'run-wait', status: 'running' }), makeRun({ run_id: 'run-fail', status: 'running' })] })

  const already = await cli(['wait', 'run-done', '--until', 'done,failed', '--ok', 'done'], env)
  t.equal(already.code, EXIT.ok, 'already there')
  t.equal(JSON.parse(already.stdout).run.run_id, 'run-done', 'the final run as JSON')

  const requests: string[] = []
  // Each status is set once the CLI has printed the one before: it must see them all.
  const progress = { stdout: '', stderr: '' }
  const waiting = cli(['wait', 'run-wait', '--until', 'done,failed', '--ok', 'done', '--timeout', '20s'], env, { output: progress })
  await waitUntil(() => progress.stderr.includes('run run-wait is running'), 'the CLI to read running')
  await setRunStatus('run-wait', 'dispatching') // not yet
  await waitUntil(() => progress.stderr.includes('run run-wait is dispatching'), 'the CLI to read dispatching')
  await setRunStatus('run-wait', 'done')
  const done = await waiting
  t.equal(done.code, EXIT.ok)
  t.equal(JSON.parse(done.stdout).run.status, 'done')
  t.match(done.stderr, /run run-wait is running, waiting for done, failed\n(.*\n)*ocp-api: run run-wait is dispatching, waiting for done, failed\n(.*\n)*ocp-api: run run-wait is done\n/)
  t.same(requests, [])

  const failing = cli(['wait', 'run-fail', '--until', 'done,failed', '--ok', 'done'], env)
  await sleep(300)
  await setRunStatus('run-fail', 'failed')
  const failed = await failing
  t.equal(failed.code, EXIT.failed, 'a status outside --ok')
  t.match(failed.stderr, /run run-fail ended failed, not done\n/)
  t.equal(JSON.parse(failed.stdout).run.status, 'failed')

  const started = Date.now()
  const timedOut = await cli(['wait', 'run-cli', '--until', 'done', '--timeout', '700ms'], env)
  t.equal(timedOut.code, EXIT.timeout)
  t.ok(Date.now() - started < PROMPTLY_MS, 'on time')
  t.match(timedOut.stderr, /timed out after 700ms: run run-cli is still running, waiting for done/)
  t.equal(timedOut.stdout, '')

  const unknown = await cli(['wait', 'no-such-run', '--until', 'done', '--fail-if-missing'], env)
  t.equal(unknown.code, EXIT.usage, 'an unknown run, with --fail-if-missing')
  t.match(unknown.stderr, /^ocp-api: run not found \(HTTP 404 not_found/)

  const unreachable = await cli(['wait', 'run-cli', '--until', 'done', '--timeout', '1s', '--url', `http://127.0.0.1:${await freePort()}`])
  t.equal(unreachable.code, EXIT.timeout, 'a service that never answers: exit 3, not a hang')
  t.match(unreachable.stderr, /cannot reach the service: ECONNREFUSED/)
  t.match(unreachable.stderr, /timed out after 1s: run run-cli is not read yet/)

  const controller = new AbortController()
  const interrupted = cli(['wait', 'run-cli', '--until', 'done'], env, { signal: controller.signal })
  await sleep(200)
  controller.abort()
  t.equal((await interrupted).code, EXIT.failed, 'interrupted')
})

t.test('wait --timeout 0 checks once: 0 or 1 from the status now, 3 when it is not in --until', async (t) => {
  const { url } = await serve(t)
  const env = { OCP_API_URL: url }
  const done = await cli(['wait', 'run-done', '--until', 'done,failed', '--ok', 'done', '--timeout', '0'], env)
  t.equal(done.code, EXIT.ok)
  t.equal(JSON.parse(done.stdout).run.status, 'done')
  const notOk = await cli(['wait', 'run-done', '--until', 'done,failed', '--ok', 'failed', '--timeout', '0'], env)
  t.equal(notOk.code, EXIT.failed)
  t.match(notOk.stderr, /run run-done ended done, not failed/)
  const notYet = await cli(['wait', 'run-cli', '--until', 'done,failed', '--timeout', '0s'], env)
  t.equal(notYet.code, EXIT.timeout)
  t.equal(notYet.stderr, 'ocp-api: run run-cli is running, not done or failed (--timeout 0: checked once)\n')
  t.equal(notYet.stdout, '')
  const unknown = await cli(['wait', 'no-such-run', '--until', 'done', '--timeout', '0', '--fail-if-missing'], env)
  t.equal(unknown.code, EXIT.usage)
  t.match(unknown.stderr, /^ocp-api: run not found \(HTTP 404 not_found/)
  const notThere = await cli(['wait', 'no-such-run', '--timeout', '0'], env)
  t.equal(notThere.code, EXIT.timeout, 'without --fail-if-missing, a run not there yet is a timeout')
  t.equal(notThere.stderr, 'ocp-api: run no-such-run does not exist (--timeout 0: checked once)\n')
  const down = await cli(['wait', 'run-cli', '--until', 'done', '--timeout', '0', '--url', `http://127.0.0.1:${await freePort()}`])
  t.equal(down.code, EXIT.failed, 'out of reach: 1, at once')
})

t.test('wait and watch started before the run exists wait for it to appear, within --timeout; --until defaults to the run\'s end', async (t) => {
  const { url } = await serve(t)
  const env = { OCP_API_URL: url }
  const db = await writer()

  // Created with its event (as an orchestrator does): the stream says so at once.
  const progress = { stdout: '', stderr: '' }
  const waiting = cli(['wait', 'run-late', '--ok', 'done', '--timeout', '30s'], env, { output: progress })
  const watchOutput = { stdout: '', stderr: '' }
  const stopWatch = new AbortController()
  const watching = cli(['watch', '--run', 'run-late', '--json'], env, { signal: stopWatch.signal, output: watchOutput })
  await waitUntil(() => progress.stderr.includes('run run-late does not exist yet') && watchOutput.stderr.includes('run run-late does not exist yet'), 'wait and watch to find no run')
  await createRun(db, { run_id: 'run-late', goal: 'Late', summary: '', status: 'running' })
  await waitUntil(() => progress.stderr.includes('run run-late is running'), 'the CLI to read the run')
  await setRunStatus('run-late', 'done')
  const done = await waiting
  t.equal(done.code, EXIT.ok, done.stderr)
  t.equal(JSON.parse(done.stdout).run.status, 'done')
  t.match(done.stderr, /^ocp-api: run run-late does not exist yet; waiting for it to appear \(--fail-if-missing: exit 2 instead\)\n(.*\n)*ocp-api: run run-late is running, waiting for done, failed\n(.*\n)*ocp-api: run run-late is done\n$/, 'the default --until: done, failed')
  await waitUntil(() => watchOutput.stdout.split('\n').length === 3, 'the watch to show both events')
  stopWatch.abort()
  t.equal((await watching).code, EXIT.ok)
  t.same(watchOutput.stdout.trim().split('\n').map((line) => JSON.parse(line).event_type), ['run_created', 'run_status'], 'every event of the run, from its creation')

  // Created without an event (a bare insert): read again every few seconds all the same.
  const quiet = { stdout: '', stderr: '' }
  const waitingQuietly = cli(['wait', 'run-quiet', '--timeout', '30s'], env, { output: quiet })
  await waitUntil(() => quiet.stderr.includes('does not exist yet'), 'the CLI to find no run')
  await db.insertInto('runs').values(makeRun({ run_id: 'run-quiet', status: 'failed' })).execute()
  const quietEnd = await waitingQuietly
  t.equal(quietEnd.code, EXIT.ok, 'no --ok: any end is success')
  t.equal(JSON.parse(quietEnd.stdout).run.status, 'failed')

  const never = await cli(['wait', 'run-never', '--timeout', '2500ms'], env)
  t.equal(never.code, EXIT.timeout, 'a run that never appears')
  t.match(never.stderr, /\nocp-api: timed out after 2500ms: run run-never does not exist yet, waiting for done, failed\n$/)
  t.equal(never.stdout, '')

  const neverWatched = await cli(['watch', '--run', 'run-never', '--thread', 'thread-never', '--after', '3', '--timeout', '500ms'], env)
  t.equal(neverWatched.code, EXIT.timeout)
  t.equal(neverWatched.stderr, 'ocp-api: run run-never does not exist yet; waiting for it to appear (--fail-if-missing: exit 2 instead)\n' +
    'ocp-api: thread thread-never does not exist yet; waiting for it to appear (--fail-if-missing: exit 2 instead)\n' +
    'ocp-api: timed out after 500ms: run run-never and thread thread-never did not appear\n')

  const stopEarly = new AbortController()
  const early = { stdout: '', stderr: '' }
  const interrupted = cli(['watch', '--thread', 'thread-never'], env, { signal: stopEarly.signal, output: early })
  await waitUntil(() => early.stderr.includes('does not exist yet'), 'the watch to wait')
  stopEarly.abort()
  t.equal((await interrupted).code, EXIT.ok, 'interrupted while waiting: the end of a watch, as ever')
})

t.test('waiting for a run: a refused token ends it (exit 2), an unreachable service gives up after --connect-timeout (exit 1)', async (t) => {
  // A service that does not know the run, then refuses the token, then is unavailable.
  let answer: [number, string, string] = [404, 'not_found', 'run not found']
  const service = createServer((_request, response) => {
    const [status, code, message] = answer
    response.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify({ error: { code, message } }))
  })
  await new Promise<void>((resolve) => service.listen(0, '127.0.0.1', resolve))
  t.teardown(() => service.close())
  const url = `http://127.0.0.1:${(service.address() as { port: number }).port}`

  const refusedOutput = { stdout: '', stderr: '' }
  const refusing = cli(['wait', 'run-x', '--url', url], {}, { output: refusedOutput })
  await waitUntil(() => refusedOutput.stderr.includes('does not exist yet'), 'the wait to wait')
  answer = [401, 'unauthorized', 'the token is not one this service accepts']
  const refused = await refusing
  t.equal(refused.code, EXIT.usage)
  t.match(refused.stderr, /\nocp-api: the token is not one this service accepts \(HTTP 401 unauthorized, \S+\/api\/runs\/run-x\)\n$/)

  answer = [404, 'not_found', 'thread not found']
  const unavailableOutput = { stdout: '', stderr: '' }
  const unavailable = cli(['watch', '--thread', 'thread-x', '--url', url, '--connect-timeout', '1s'], {}, { output: unavailableOutput })
  await waitUntil(() => unavailableOutput.stderr.includes('does not exist yet'), 'the watch to wait')
  answer = [503, 'unavailable', 'the database is unavailable']
  const gaveUp = await unavailable
  t.equal(gaveUp.code, EXIT.failed)
  t.match(gaveUp.stderr, /ocp-api: the database is unavailable \(HTTP 503 unavailable, \S+\/api\/threads\/thread-x\); retrying in 2\.0 s\n/)
  t.match(gaveUp.stderr, /\nocp-api: gave up after 1s \(--connect-timeout\) out of reach of the service: the database is unavailable \(HTTP 503 unavailable, \S+\)\n$/)
})

t.test('--connect-timeout: wait and watch give up on a service out of reach, exit 1 with the reason in one line', async (t) => {
  const nowhere = `http://127.0.0.1:${await freePort()}`
  const started = Date.now()
  const waiting = await cli(['wait', 'run-cli', '--until', 'done', '--connect-timeout', '1s', '--url', nowhere])
  t.equal(waiting.code, EXIT.failed, 'no --timeout: still an end')
  t.ok(Date.now() - started < PROMPTLY_MS, 'on time')
  t.match(waiting.stderr, /ocp-api: cannot reach the service: ECONNREFUSED \(no answer network, \S+\); retrying in \d\.\d s\n/, 'each retry says why')
  t.match(waiting.stderr, /\nocp-api: gave up after 1s \(--connect-timeout\) out of reach of the service: cannot reach the service: ECONNREFUSED \(no answer network, http:\/\/127\.0\.0\.1:\d+\/api\/runs\/run-cli\)\n$/)
  for (const args of [['watch'], ['watch', '--run', 'run-cli'], ['watch', '--thread', 'thread-cli', '--after', '3']]) {
    const watching = await cli([...args, '--connect-timeout', '300ms', '--url', nowhere])
    t.equal(watching.code, EXIT.failed, args.join(' '))
    t.match(watching.stderr, /\nocp-api: gave up after 300ms \(--connect-timeout\) out of reach of the service: cannot reach the service: ECONNREFUSED/)
  }

  // A service that answers, but refuses every stream (a 200 that says why, then ends): each retry line says why too.
  const refusing = createServer((request, response) => {
    response.writeHead(200, { 'content-type': 'text/event-stream' }).end('retry: 50\n: unavailable: the database is unavailable\n\n')
  })
  await new Promise<void>((resolve) => refusing.listen(0, '127.0.0.1', resolve))
  t.teardown(() => refusing.close())
  const refused = await cli(['watch', '--after', '5', '--connect-timeout', '400ms', '--url', `http://127.0.0.1:${(refusing.address() as { port: number }).port}`])
  t.equal(refused.code, EXIT.failed)
  t.match(refused.stderr, /^ocp-api: the stream ended: unavailable: the database is unavailable; retrying in \d\.\d s\n/)
  t.notMatch(refused.stderr, /connected/, 'a refusal is not a connection')
  t.match(refused.stderr, /ocp-api: gave up after 400ms \(--connect-timeout\) out of reach of the service: the stream ended: unavailable: the database is unavailable\n$/)
})

t.test('watch: with --fail-if-missing an unknown run or thread is exit 2; --after 0 starts from the oldest event kept; a cursor no longer kept says what to do', async (t) => {
  const { app, url } = await serve(t)
  const env = { OCP_API_URL: url }
  const unknownRun = await cli(['watch', '--run', 'no-such-run', '--fail-if-missing'], env)
  t.equal(unknownRun.code, EXIT.usage)
  t.match(unknownRun.stderr, /^ocp-api: run not found \(HTTP 404 not_found, \S+\/api\/runs\/no-such-run\)\n$/)
  const unknownThread = await cli(['watch', '--thread', 'no-such-thread', '--fail-if-missing'], env)
  t.equal(unknownThread.code, EXIT.usage)
  t.match(unknownThread.stderr, /^ocp-api: thread not found \(HTTP 404 not_found/)

  // One more gone before it: a cursor below `gone` is then never 0 (which means "from the oldest kept"), even in a database of this test alone.
  const [, gone, kept] = await insertEvents({ run_id: 'run-cli', summary: 'gone' }, { run_id: 'run-cli', summary: 'gone' }, { run_id: 'run-cli', summary: 'kept' })
  const db = await writer()
  await sql`update event_log_state set history_floor = ${gone!}`.execute(db)
  t.teardown(() => sql`update event_log_state set history_floor = 0`.execute(db))
  await untilWindowLearnsFloor(app, gone!)
  const controller = new AbortController()
  const lines: string[] = []
  const watching = main(['watch', '--after', '0', '--json'], { stdout: (text) => lines.push(text), stderr: () => {}, env, color: false, signal: controller.signal })
  await waitUntil(() => lines.length >= 1, 'the oldest kept event')
  controller.abort()
  t.equal(await watching, EXIT.ok, 'no 410')
  t.equal(JSON.parse(lines[0]!).event_id, kept)

  const expired = await cli(['watch', '--after', String(gone! - 1)], env)
  t.equal(expired.code, EXIT.failed)
  t.equal(expired.stderr, `ocp-api: the events after ${gone! - 1} are no longer kept (the service's EVENTS_RETENTION); --after 0 starts from the oldest kept\n`)
})

/**
 * Runs the bin as in a checkout: none of this test process's loaders but
 * tsx, so that it runs the sources (not a client/dist/ that may be older;
 * test/client-package.test.ts runs the compiled bin). Its coverage is off
 * (tap's process tracking would record it anyway): mixing that
 * compilation's coverage with the tests' own garbles the report for every
 * file both load (client/src); main is covered in process above.
 */
async function runBin (args: string[], env: Record<string, string>): Promise<{ code: number | null, stdout: string, stderr: string }> {
  const child = spawn(process.execPath, ['--import', 'tsx', `${root}/bin/ocp-api.js`, ...args], { cwd: root, env: { PATH: process.env.PATH ?? '', _TAPJS_PROCESSINFO_COVERAGE_: '0', ...env }, stdio: ['ignore', 'pipe', 'pipe'] })
  let stdout = ''
  let stderr = ''
  child.stdout.on('data', (chunk) => { stdout += chunk })
  child.stderr.on('data', (chunk) => { stderr += chunk })
  const [code] = await once(child, 'exit')
  return { code: code as number | null, stdout, stderr }
}

t.test('the bin: npx ocp-api --help, and a wait as CI runs it', async (t) => {
  const { url } = await serve(t)
  const help = await runBin(['wait', '--help'], {})
  t.equal(help.code, 0)
  t.match(help.stdout, /^Usage: ocp-api wait RUN_ID/)
  await insertGraph({ runs: [makeRun({ run_id: 'run-bin', status: 'running' })] })
  const waiting = runBin(['wait', 'run-bin', '--until', 'done', '--timeout', '30s'], { OCP_API_URL: url })
  await sleep(1500)
  await setRunStatus('run-bin', 'done')
  const done = await waiting
  t.equal(done.code, 0, done.stderr)
  t.equal(JSON.parse(done.stdout).run.status, 'done')
  const usage = await runBin(['wait', 'run-bin', '--timeout', 'soon'], {})
  t.equal(usage.code, 2)
  t.notMatch(usage.stderr, /\n {4}at /, 'no stack trace')
})
