import { spawnSync } from 'node:child_process'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import t from 'tap'

// `npm test`'s runner (test/run.mjs) finds its database, or says why there
// is none and falls back to the embedded suite. Run dry: it says what it
// would run (a tap inside this tap would clear the run's coverage).

const root = join(dirname(fileURLToPath(import.meta.url)), '..')

function runner (env: Record<string, string>, args: string[]) {
  const { DATABASE_URL: _url, DOCKER_HOST: _host, TEST_BACKEND: _backend, ...rest } = process.env
  const result = spawnSync(process.execPath, [join(root, 'test/run.mjs'), ...args], { cwd: root, env: { ...rest, TEST_RUNNER_DRY_RUN: '1', ...env }, encoding: 'utf8', timeout: 120_000 })
  return { status: result.status, output: `${result.stdout}${result.stderr}` }
}

t.test('a Docker engine that cannot start the image: the embedded backend, saying why', async (t) => {
  const named = runner({ DOCKER_HOST: 'unix:///nonexistent/docker.sock' }, ['test/runs.test.ts'])
  t.equal(named.status, 0, named.output)
  t.match(named.output, /No Postgres server to test on \(no DATABASE_URL, and testcontainers could not start postgres:15-alpine on the Docker engine here: .+\)/)
  t.match(named.output, /would run: npx tap --disable-coverage test\/runs\.test\.ts \(TEST_BACKEND=embedded/, 'a named file, on the embedded database')
  const whole = runner({ DOCKER_HOST: 'unix:///nonexistent/docker.sock' }, [])
  t.match(whole.output, /would run: npm run --silent test:embedded/, 'else the embedded suite')
})

t.test('DATABASE_URL: that server; a named file without the coverage bar, the whole suite with it', async (t) => {
  const url = 'postgres://postgres@127.0.0.1:1/nowhere'
  const named = runner({ DATABASE_URL: url }, ['test/runs.test.ts'])
  t.equal(named.status, 0, named.output)
  t.match(named.output, `would run: npx tap --disable-coverage test/runs.test.ts (TEST_BACKEND=server, DATABASE_URL=${url})`)
  t.notMatch(named.output, /No Postgres server/)
  t.match(runner({ DATABASE_URL: url }, []).output, `would run: npx tap (TEST_BACKEND=server, DATABASE_URL=${url})`, 'the whole suite')
})
