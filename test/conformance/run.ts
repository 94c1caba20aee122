import { spawn } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import pg from 'pg'
import { startConformanceAdapter } from './adapter.ts'
import { EXCLUDED, isReadPath, READ_BLOCKS_PATTERN } from './scope.ts'

/*
 * Runs the official Durable Streams conformance suite's read path
 * (@durable-streams/server-conformance-tests, pinned in package.json) by
 * vitest in a child process, against a service through the adapter of
 * adapter.ts, which writes to the service's database as an orchestrator
 * does. test/conformance.test.ts runs it on a service of its own; `npm run
 * conformance` runs it against a deployment (docs/durable-streams.md,
 * "Running the official conformance suite").
 */

const ROOT = resolve(fileURLToPath(import.meta.url), '../../..')

export interface ConformanceResult {
  /** Each test of the read path, by name (its blocks and title joined by ' > '). */
  tests: Array<{ name: string, status: string, failure?: string }>
  /** Tests of the read path that did not pass and are not excluded (scope.ts), with their first line of failure. */
  failed: string[]
  /** Names in EXCLUDED that the suite no longer has. */
  stale: string[]
}

interface AssertionResult { ancestorTitles: string[], title: string, status: string, failureMessages: string[] }

function vitest (url: string, longPollMs: number, outputFile: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn('npx', ['vitest', 'run', '--config', 'test/conformance/vitest.config.ts', '--reporter=json', `--outputFile=${outputFile}`, '--testNamePattern', READ_BLOCKS_PATTERN],
      { cwd: ROOT, env: { ...process.env, CONFORMANCE_URL: url, CONFORMANCE_LONG_POLL_MS: String(longPollMs) }, stdio: ['ignore', 'ignore', 'pipe'] })
    let stderr = ''
    child.stderr.on('data', (chunk: Buffer) => { stderr = (stderr + chunk.toString()).slice(-4000) })
    child.on('error', reject)
    // vitest exits 1 when a test fails: the report says which.
    child.on('close', (code) => code === null || code > 1 ? reject(new Error(`vitest ended with ${code}: ${stderr}`)) : resolve())
  })
}

/** How long a check before the suite waits for the service or the database. */
const CHECK_TIMEOUT_MS = 5000

/**
 * What the suite needs before it starts, each said plainly when missing
 * rather than as a hundred tests timing out one by one: the database
 * answers, the service answers, and the service reads that database (a run
 * written there is found through the API, then removed).
 */
export async function checkDeployment (serviceUrl: string, databaseUrl: string): Promise<void> {
  const client = new pg.Client({ connectionString: databaseUrl, connectionTimeoutMillis: CHECK_TIMEOUT_MS })
  /* c8 ignore next: a connection lost between the check's statements; the next one reports it */
  client.on('error', () => {})
  try {
    await client.connect()
  } catch (err) {
    throw new Error(`cannot connect to the database (--database, default DATABASE_URL): ${(err as Error).message}`)
  }
  const probe = `conformance-probe-${process.pid}-${Date.now()}`
  try {
    const health = await fetch(new URL('/health', serviceUrl), { signal: AbortSignal.timeout(CHECK_TIMEOUT_MS) }).catch((err: unknown) => {
      // fetch says "fetch failed"; its cause says why (a refused connection, a name not found).
      const why = [err, (err as Error).cause].filter(Boolean).map((each) => (each as Error).message).join(': ')
      throw new Error(`no service answers at ${serviceUrl} (GET /health: ${why}): start one, or pass --url`)
    })
    if (!health.ok) throw new Error(`the service at ${serviceUrl} is not ready: GET /health answered ${health.status}`)
    await client.query('insert into runs (run_id, goal, summary, status) values ($1, \'conformance probe\', \'\', \'running\')', [probe]).catch((err: unknown) => {
      throw new Error(`the database given refused a run written as an orchestrator writes it (${(err as Error).message}): pass the database the service reads as --database, its migrations applied`)
    })
    const run = await fetch(new URL(`/api/runs/${probe}`, serviceUrl), { signal: AbortSignal.timeout(CHECK_TIMEOUT_MS) })
    if (run.status === 404) throw new Error(`the service at ${serviceUrl} does not read the database given (a run written there is not found): pass the database the service reads as --database`)
    if (run.status === 401) throw new Error(`the service at ${serviceUrl} asks for credentials (401), and the suite sends none: run it against a deployment with authentication off (API_TOKENS and AUTH_ISSUERS unset)`)
    if (!run.ok) throw new Error(`the service at ${serviceUrl} answered GET /api/runs/{id} with ${run.status}`)
  } finally {
    await client.query('delete from runs where run_id = $1', [probe]).catch(() => {})
    await client.end()
  }
}

/**
 * The suite's read path against the service at `serviceUrl`, whose database
 * `databaseUrl` the adapter writes to; `longPollMs` is the service's
 * DURABLE_STREAMS_LONG_POLL_MS (the suite waits that long for a long-poll's 204).
 */
export async function runConformance (serviceUrl: string, databaseUrl: string, longPollMs: number): Promise<ConformanceResult> {
  await checkDeployment(serviceUrl, databaseUrl)
  const adapter = await startConformanceAdapter(serviceUrl, databaseUrl)
  const dir = mkdtempSync(join(tmpdir(), 'ocp-conformance-'))
  try {
    const report = join(dir, 'report.json')
    await vitest(adapter.url, longPollMs, report)
    const results = (JSON.parse(readFileSync(report, 'utf8')) as { testResults: Array<{ assertionResults: AssertionResult[] }> })
      .testResults.flatMap((file) => file.assertionResults)
      .filter((result) => isReadPath(result.ancestorTitles, result.title))
    const tests = results.map((result) => ({
      name: [...result.ancestorTitles, result.title].join(' > '),
      status: result.status,
      ...(result.status === 'passed' ? {} : { failure: result.failureMessages[0]?.split('\n')[0] ?? result.status })
    }))
    return {
      tests,
      failed: tests.filter((test) => test.status !== 'passed' && !EXCLUDED.has(test.name)).map((test) => `${test.name}: ${test.failure}`),
      stale: [...EXCLUDED.keys()].filter((name) => !tests.some((test) => test.name === name))
    }
  } finally {
    rmSync(dir, { recursive: true, force: true })
    await adapter.close()
  }
}

/* c8 ignore start: the command line (npm run conformance) */
if (process.argv[1] !== undefined && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const { values } = parseArgs({
    options: {
      url: { type: 'string', default: 'http://127.0.0.1:8080' },
      database: { type: 'string', default: process.env.DATABASE_URL },
      'long-poll-ms': { type: 'string', default: '20000' }
    }
  })
  if (values.database === undefined) {
    console.error('usage: npm run conformance -- --url http://service:8080 --database postgres://... [--long-poll-ms 20000]\n(--database: the database the service reads, which the suite writes to as an orchestrator; default DATABASE_URL)')
    process.exit(2)
  }
  const result = await runConformance(values.url, values.database, Number(values['long-poll-ms'])).catch((err: unknown) => {
    console.error(`conformance: ${(err as Error).message}`)
    process.exit(1)
  })
  for (const test of result.tests) {
    const mark = test.status === 'passed' ? 'pass' : EXCLUDED.has(test.name) ? 'excluded' : 'FAIL'
    console.log(`${mark.padEnd(8)} ${test.name}${test.failure === undefined ? '' : `: ${test.failure}`}`)
  }
  const passed = result.tests.filter((test) => test.status === 'passed').length
  console.log(`\nread path: ${passed} passed, ${result.failed.length} failed, ${result.tests.length - passed - result.failed.length} excluded, of ${result.tests.length}`)
  process.exit(result.failed.length === 0 ? 0 : 1)
}
/* c8 ignore stop */
