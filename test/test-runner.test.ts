import { spawnSync } from 'node:child_process'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import t from 'tap'

// `npm test`'s runner (test/run.mjs) finds its database, or says why there is none and falls back to the embedded suite.

const root = join(dirname(fileURLToPath(import.meta.url)), '..')

function runner (env: Record<string, string>) {
  const { DATABASE_URL: _url, DOCKER_HOST: _host, TEST_BACKEND: _backend, ...rest } = process.env
  const result = spawnSync(process.execPath, [join(root, 'test/run.mjs'), 'test/helpers/runner-probe.ts'], { cwd: root, env: { ...rest, ...env }, encoding: 'utf8', timeout: 120_000 })
  return { status: result.status, output: `${result.stdout}${result.stderr}` }
}

t.test('a Docker engine that cannot start the image: the embedded backend, saying why', async (t) => {
  const { status, output } = runner({ DOCKER_HOST: 'unix:///nonexistent/docker.sock' })
  t.equal(status, 0, output)
  t.match(output, /No Postgres server to test on \(no DATABASE_URL, and testcontainers could not start postgres:15-alpine on the Docker engine here: .+\)/)
  t.match(output, /probe: TEST_BACKEND=embedded/)
})

t.test('DATABASE_URL: that server, and a named file runs without the coverage bar', async (t) => {
  const { status, output } = runner({ DATABASE_URL: 'postgres://postgres@127.0.0.1:1/nowhere' })
  t.equal(status, 0, output)
  t.match(output, /probe: TEST_BACKEND=server/)
  t.notMatch(output, /No Postgres server/)
})
