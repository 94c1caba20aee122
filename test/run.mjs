#!/usr/bin/env node
// `npm test`. With a Postgres server to test on (DATABASE_URL, or one that
// testcontainers starts on a Docker engine): the whole suite, coverage
// required. When there is none, whatever the reason (no engine, or an engine
// that cannot pull or start the image): it says why, then runs the
// embedded-database suite (`npm run test:embedded`). Arguments go on to tap;
// named test files (`npm test -- test/runs.test.ts`) run alone, without the
// coverage bar, which only the whole suite can meet.
import { spawn } from 'node:child_process'
import { existsSync } from 'node:fs'
import { availableParallelism } from 'node:os'

const args = process.argv.slice(2)
// Test files in parallel: one more than the cores (TAP_JOBS, or --jobs, overrides). tap's
// own default leaves a core free, for files that keep a core busy; these mostly wait on
// servers, clusters and timers, and on two cores its one file at a time took twice as
// long (docs/development.md, "Tests").
process.env.TAP_JOBS ??= String(availableParallelism() + 1)
// Test files and the servers they start run on Node's own type stripping, not tap's
// TypeScript loader (ts-node), which compiled every file of every process again: the
// code keeps to the syntax Node can strip (erasableSyntaxOnly in tsconfig.json).
process.env.TAP_TYPE_STRIP_ONLY ??= '1'
const namedFiles = args.some((arg) => arg.endsWith('.ts'))
const IMAGE = 'postgres:15-alpine'

/** Runs a command to its end; its exit status. With TEST_RUNNER_DRY_RUN=1 (test/test-runner.test.ts), only says what it would run: a tap inside tap would clear the outer run's coverage. */
function run (command, commandArgs, env = process.env) {
  if (process.env.TEST_RUNNER_DRY_RUN === '1') {
    console.log(`would run: ${command} ${commandArgs.join(' ')} (TEST_BACKEND=${env.TEST_BACKEND ?? 'server'}, DATABASE_URL=${env.DATABASE_URL ?? ''})`)
    return Promise.resolve(0)
  }
  /* c8 ignore start: the runs themselves (npm test) */
  return new Promise((resolve) => {
    const child = spawn(command, commandArgs, { stdio: 'inherit', env })
    child.once('exit', (status, signal) => resolve(status ?? (signal ? 1 : 0)))
  })
  /* c8 ignore stop */
}

/** The Postgres to test on, or why there is none. */
async function findServer () {
  const fromEnv = process.env.DATABASE_URL ?? ''
  // An explicit server is used as given: if it is down, the tests say so (a CI that meant it must not quietly run less).
  if (fromEnv !== '') return { url: fromEnv }
  /* c8 ignore next 3: test/test-runner.test.ts names a DOCKER_HOST */
  if ((process.env.DOCKER_HOST ?? '') === '' && !existsSync('/var/run/docker.sock')) {
    return { why: 'no DATABASE_URL, and no Docker engine for testcontainers (no DOCKER_HOST, no /var/run/docker.sock)' }
  }
  try {
    // One container for the whole run, started here: the test files then see DATABASE_URL.
    const { PostgreSqlContainer } = await import('@testcontainers/postgresql')
    const container = await new PostgreSqlContainer(IMAGE).start()
    /* c8 ignore next: CI's testcontainers run goes through tap directly (.ci/run) */
    return { url: container.getConnectionUri(), container }
  } catch (err) {
    /* c8 ignore next: errors are Errors */
    const reason = String(err instanceof Error ? err.message : err).split('\n')[0]
    return { why: `no DATABASE_URL, and testcontainers could not start ${IMAGE} on the Docker engine here: ${reason}` }
  }
}

const server = await findServer()
if (server.url !== undefined) {
  const status = await run('npx', ['tap', ...(namedFiles ? ['--disable-coverage'] : []), ...args], { ...process.env, DATABASE_URL: server.url })
  /* c8 ignore next: a container of our own, which test/test-runner.test.ts cannot start here */
  await server.container?.stop()
  process.exit(status)
}

console.log(`No Postgres server to test on (${server.why}).
Running the tests that need none, on the embedded database (npm run test:embedded).
The whole suite, with coverage, runs on a server:
  DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm test
`)
// Named files run alone; otherwise the embedded suite.
if (namedFiles) process.exit(await run('npx', ['tap', '--disable-coverage', ...args], { ...process.env, TEST_BACKEND: 'embedded' }))
process.exit(await run('npm', ['run', '--silent', 'test:embedded']))
