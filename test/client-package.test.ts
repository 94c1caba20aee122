import { execFileSync } from 'node:child_process'
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'
import t from 'tap'
import { loadFixtureFile } from '../db/fixtures.ts'
import { createRun, setRunStatus } from '../db/writer.ts'
import { serve } from './helpers/app.ts'
import { codeBlocks, runAsUser, userEnv } from './helpers/docs.ts'
import { writer } from './helpers/fixtures.ts'
import { root } from './helpers/run.ts'
import { waitUntil } from './helpers/wait.ts'

// The client package as its users get it: `npm run build:client` (part of
// `npm run build`) packs it, the service serves it at
// /client/ocp-api-client.tgz (without a token, authentication on or not),
// and it installs from there in a new project exactly as client/README.md
// says, with no dependency to fetch; there it type-checks with the types it
// ships, and the README's examples run as written against the demo's data.
// docs/clients.md's CI recipe and docs/authentication.md's GitHub Actions
// step run through npx with nothing installed, each started before the run
// it waits for exists.

const { version } = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { version: string }
const built = join(root, 'dist', `ocp-api-client-${version}.tgz`)

const dir = mkdtempSync(join(tmpdir(), 'ocp-client-pack-'))
t.teardown(() => rmSync(dir, { recursive: true, force: true }))

/**
 * npm gets a cache of this file's own, so that nothing comes from an earlier
 * run, and a registry that does not answer: the package must install and
 * run from the service alone.
 */
const npmEnv: Record<string, string> = {
  npm_config_cache: join(dir, 'npm-cache'),
  npm_config_registry: 'http://127.0.0.1:9/',
  npm_config_audit: 'false',
  npm_config_fund: 'false',
  npm_config_update_notifier: 'false',
  npm_config_loglevel: 'error'
}

/** The project the README's instructions make. */
const project = join(dir, 'project')
mkdirSync(project)

/** A shell command line in `cwd`, as a user runs it, with npm's settings above. */
const shell = (line: string, cwd: string, env: Record<string, string>, during?: Parameters<typeof runAsUser>[3]) =>
  runAsUser(['sh', '-ec', line], cwd, { ...npmEnv, ...env }, during)

/** The one block of `file` in `language` under `heading` (its nth, from 0). */
function block (file: string, heading: string, language: string, nth = 0): string {
  const found = codeBlocks(file).filter((candidate) => candidate.heading === heading && candidate.language === language)[nth]
  if (found === undefined) throw new Error(`${file} has no ${language} block ${nth} under "${heading}"`)
  return found.code
}

const lines = (code: string) => code.split('\n').filter((line) => line.trim() !== '')

t.before(async () => { await loadFixtureFile(await writer(), join(root, 'fixtures/demo.json')) })

t.test('npm run build:client packs the package the service serves, of its version, without a token', async (t) => {
  rmSync(built, { force: true })
  const { app, url } = await serve(t, { API_TOKENS: 'a-token' })
  const notBuilt = await app.inject('/client/ocp-api-client.tgz')
  t.equal(notBuilt.statusCode, 404)
  t.equal(notBuilt.json().error.message, `the client package is not built: run npm run build (it makes dist/ocp-api-client-${version}.tgz)`)

  execFileSync('npm', ['run', 'build:client'], { cwd: root, stdio: 'pipe', env: { ...userEnv, ...npmEnv } })
  const served = await fetch(`${url}/client/ocp-api-client.tgz`)
  t.equal(served.status, 200, 'no token needed, while the API needs one')
  t.equal((await app.inject('/api/runs')).statusCode, 401)
  t.equal(served.headers.get('content-type'), 'application/gzip')
  t.equal(served.headers.get('cache-control'), 'public, no-cache', 'the URL names no version: revalidated before each use')
  t.equal(served.headers.get('content-disposition'), `attachment; filename="ocp-api-client-${version}.tgz"`)
  const body = Buffer.from(await served.arrayBuffer())
  t.ok(body.equals(readFileSync(built)), 'the tarball the build made')
  const tag = served.headers.get('etag')!
  t.match(tag, /^"[\w-]{22}"$/)
  t.equal((await fetch(`${url}/client/ocp-api-client.tgz`, { headers: { 'if-none-match': tag } })).status, 304, 'unchanged: 304')

  const tarball = join(dir, 'served.tgz')
  writeFileSync(tarball, body)
  const contents = execFileSync('tar', ['-tzf', tarball]).toString().split('\n').filter(Boolean).sort()
  t.ok(contents.includes('package/dist/index.js') && contents.includes('package/dist/index.d.ts'), 'ESM and its declarations')
  t.ok(contents.includes('package/dist/cli.js') && contents.includes('package/README.md'), 'the bin and the README')
  t.notOk(contents.some((path) => path.includes('/src/') || path.includes('/scripts/')), 'only dist/')
  const unpacked = join(dir, 'unpacked')
  mkdirSync(unpacked)
  execFileSync('tar', ['-xzf', tarball, '-C', unpacked])
  const manifest = JSON.parse(readFileSync(join(unpacked, 'package/package.json'), 'utf8')) as { version: string, bin: Record<string, string>, dependencies?: unknown }
  t.equal(manifest.version, version, 'the package\'s version is the service\'s')
  t.same(manifest.bin, { 'ocp-api': './dist/cli.js' })
  t.equal(manifest.dependencies, undefined, 'no runtime dependency')
  t.match(readFileSync(join(unpacked, 'package/dist/cli.js'), 'utf8'), /^#!\/usr\/bin\/env node\n/)
  const help = execFileSync(process.execPath, [join(unpacked, 'package/dist/cli.js'), '--help'], { cwd: unpacked, env: userEnv }).toString()
  t.match(help, /^Usage: ocp-api COMMAND/, 'plain node, no node_modules anywhere')
})

t.test('client/README.md as written: installed from the service in a new project, where it type-checks and its examples run', async (t) => {
  const { url } = await serve(t, { EVENTS_POLL_INTERVAL_MS: 50, SSE_RETRY_MS: 100 })
  const env = { OCP_API_URL: url }
  const readme = 'client/README.md'
  const db = await writer()

  const install = await shell(block(readme, '## Install', 'sh'), project, env)
  t.equal(install.code, 0, install.stderr)
  const manifest = JSON.parse(readFileSync(join(project, 'package.json'), 'utf8')) as { devDependencies: Record<string, string> }
  t.equal(manifest.devDependencies['ocp-api-client'], `${url}/client/ocp-api-client.tgz`, 'from the service')

  writeFileSync(join(project, 'tsconfig.json'), JSON.stringify({ compilerOptions: { target: 'ES2022', module: 'NodeNext', moduleResolution: 'NodeNext', strict: true, noEmit: true, types: [] }, include: ['main.ts'] }))
  writeFileSync(join(project, 'main.ts'), `
import { ApiError, createClient, CursorExpired, MAX_PAGE_LIMIT, type Event, type EventType, type RunDetail } from 'ocp-api-client'
const client = createClient({ url: 'http://127.0.0.1:8080', token: 'x' })
export async function statusOf (id: string): Promise<string> {
  const { run }: { run: RunDetail } = await client.run(id)
  return run.run.status
}
export async function first (): Promise<Event | undefined> {
  for await (const event of client.watch({ run_id: 'r' }, { after: 0 })) return event
  return undefined
}
export async function firstRead (): Promise<string | undefined> {
  for await (const item of client.followRun('r')) return item.kind === 'read' ? item.body.run.run.status : item.event.event_type
  return undefined
}
const live = client.liveRuns({ status: ['running'], limit: MAX_PAGE_LIMIT }, (body, read) => console.log(body.runs.length, read.next))
live.close()
export const isExpired = (error: unknown) => error instanceof CursorExpired || (error instanceof ApiError && error.terminal)
export const known: EventType = 'run_status'
// @ts-expect-error: a run's status is a string
export const wrong: number = ({} as RunDetail).run.status
`)
  const tsc = (config: string) => execFileSync(process.execPath, [join(root, 'node_modules/typescript/bin/tsc'), '-p', config], { stdio: 'pipe', env: userEnv })
  tsc(project)
  t.pass('type-checks in the new project, with the types it ships')
  t.match((await shell('npx ocp-api-client --help', project, env)).stdout, /^Usage: ocp-api COMMAND/, 'npx ocp-api-client: the package\'s only bin')

  // The run page: as a file of the project, which Node runs as it is.
  writeFileSync(join(project, 'run-page.mts'), block(readme, '## The client', 'ts'))
  writeFileSync(join(project, 'tsconfig.page.json'), JSON.stringify({
    compilerOptions: { target: 'ES2022', module: 'NodeNext', moduleResolution: 'NodeNext', strict: true, noEmit: true, typeRoots: [join(root, 'node_modules/@types')], types: ['node'], skipLibCheck: true },
    files: ['run-page.mts']
  }))
  tsc(join(project, 'tsconfig.page.json'))
  t.pass('and so does the run page')
  const [ended, running] = lines(block(readme, '## The client', 'sh'))
  const page = await shell(ended!, project, env)
  t.equal(page.code, 0, page.stderr)
  t.equal(page.stdout, 'run-demo-1 is done, 3 tasks\n', 'a run that has ended: it, and the end')
  const live = await shell(running!, project, env, async (output) => {
    await waitUntil(() => output().includes('run-demo-43 is running'), 'the first read')
    await setRunStatus(db, 'run-demo-43', 'done', 'All done')
  })
  t.equal(live.code, 0, live.stderr)
  t.match(live.stdout, /^run-demo-43 is running, 6 tasks\n#\d+ run_status All done\nrun-demo-43 is done, 6 tasks\n$/, 'the read, the event, the read that ends it')
  const unknown = await shell('node run-page.mts no-such-run', project, env)
  t.equal(unknown.code, 2)
  t.match(unknown.stderr, /^run not found \(HTTP 404 not_found, \S+\/api\/runs\/no-such-run\)\n$/)

  // The command line's examples, one by one.
  const [runs, run, watch, wait] = lines(block(readme, '## The command line (ocp-api)', 'sh'))
  const table = await shell(runs!, project, env)
  t.equal(table.code, 0, table.stderr)
  t.match(table.stdout, /^RUN +STATUS +TASKS +CREATED +GOAL\nrun-demo-104 +running/)
  const detail = await shell(run!, project, env)
  t.equal(detail.code, 0, detail.stderr)
  t.match(detail.stdout, /^Run run-demo-43: Add SSO to the admin console\n[^]*\nBlocked task-\d+ \(attempt \d+, thread thread-demo-\d+\): /)
  const watched = await shell(watch!, project, env, async (output, interrupt) => {
    await waitUntil(() => output().includes('ocp-api: connected'), 'the watch to connect')
    await setRunStatus(db, 'run-demo-43', 'done', 'Once more')
    await waitUntil(() => output().includes('Once more'), 'the event')
    interrupt()
  })
  // sh itself dies of the SIGINT (the CLI's own exit code on it, 0, is test/cli.test.ts's).
  t.equal(watched.signal, 'SIGINT', 'Ctrl-C ends it')
  t.notMatch(watched.stderr, /error/i)
  t.equal(JSON.parse(watched.stdout).summary, 'Once more', 'an event as one line of JSON')
  const waited = await shell(wait!, project, env)
  t.equal(waited.code, 0, waited.stderr)
  t.equal(JSON.parse(waited.stdout).run.run_id, 'run-demo-1')

  // The CI step: npx fetches the package from the service; the wait starts before the run exists.
  const ci = block(readme, '### In CI', 'sh')
  const runCi = (runId: string, status: string) => shell(ci, project, { ...env, RUN_ID: runId }, async (output) => {
    await waitUntil(() => output().includes(`run ${runId} does not exist yet`), `${runId} waited for`, 60_000)
    await createRun(db, { run_id: runId, goal: 'Smoke', summary: '', status: 'running' })
    await waitUntil(() => output().includes(`run ${runId} is running`), `${runId} read`)
    await setRunStatus(db, runId, status, '')
  })
  const passed = await runCi('run-ci', 'done')
  t.equal(passed.code, 0, passed.stderr)
  t.equal(JSON.parse(readFileSync(join(project, 'run.json'), 'utf8')).run.status, 'done')
  const failed = await runCi('run-ci-fails', 'failed')
  t.equal(failed.code, 1, 'the step fails when the run fails')
  t.match(failed.stderr, /run run-ci-fails ended failed, not done/)
  t.equal(JSON.parse(readFileSync(join(project, 'run.json'), 'utf8')).run.status, 'failed', 'run.json: the run as it ended')

  const exitCodes = readFileSync(join(root, readme), 'utf8').match(/^\| [0-3] \|.*$/gm) ?? []
  t.same(exitCodes.map((row) => row[2]), ['0', '1', '2', '3'], 'the README lists every exit code')
  t.match(exitCodes[1], /could not be reached/)
})

t.test('docs/clients.md\'s CI recipe as written: the wait first, in an empty directory, then the run', async (t) => {
  const { url } = await serve(t, { EVENTS_POLL_INTERVAL_MS: 50, SSE_RETRY_MS: 100 })
  const step = lines(block('docs/clients.md', '### In CI', 'sh')).find((line) => line.startsWith('npx -y '))
  t.ok(step, 'the recipe\'s wait')
  const job = mkdtempSync(join(dir, 'job-'))
  const db = await writer()
  const ran = await shell(step!, job, { OCP_API_URL: url }, async (output) => {
    await waitUntil(() => output().includes('run smoke-1 does not exist yet'), 'the wait to wait for the run', 60_000)
    await createRun(db, { run_id: 'smoke-1', goal: 'Smoke test', summary: '', status: 'running' })
    await setRunStatus(db, 'smoke-1', 'done', 'Passed')
  })
  t.equal(ran.code, 0, ran.stderr)
  t.match(ran.stderr, /ocp-api: run smoke-1 does not exist yet; waiting for it to appear[^]*ocp-api: run smoke-1 is done\n$/)
  t.match(JSON.parse(readFileSync(join(job, 'run.json'), 'utf8')).run, { run_id: 'smoke-1', status: 'done', summary: 'Passed' }, 'run.json: the run as it ended')
})

t.test('docs/authentication.md\'s GitHub Actions step as written, with authentication on: the package without a token, the run with it', async (t) => {
  const { url } = await serve(t, { EVENTS_POLL_INTERVAL_MS: 50, SSE_RETRY_MS: 100, API_TOKENS: 'ci-secret' })
  const workflow = codeBlocks('docs/authentication.md').find((candidate) => candidate.language === 'yaml')!.code
  const step = /- name: The run finishes\n\s+run: (.*)\n/.exec(workflow)?.[1]
  t.ok(step, 'the step')
  t.match(workflow, /OCP_API_URL: https:\/\/ocp\.example\.com\n/, 'the job names the service')
  const job = mkdtempSync(join(dir, 'job-'))
  const refused = await shell(step!, job, { OCP_API_URL: url, OCP_API_TOKEN: 'wrong', RUN_ID: 'smoke-auth' })
  t.equal(refused.code, 2, 'a refused token')
  t.match(refused.stderr, /HTTP 401 unauthorized/)
  const db = await writer()
  const ran = await shell(step!, job, { OCP_API_URL: url, OCP_API_TOKEN: 'ci-secret', RUN_ID: 'smoke-auth' }, async (output) => {
    await waitUntil(() => output().includes('run smoke-auth does not exist yet'), 'the wait to wait for the run', 60_000)
    await createRun(db, { run_id: 'smoke-auth', goal: 'Smoke test', summary: '', status: 'running' })
    await setRunStatus(db, 'smoke-auth', 'done', '')
  })
  t.equal(ran.code, 0, ran.stderr)
  t.equal(JSON.parse(ran.stdout).run.status, 'done')

  // client/README.md's stream token for an EventSource, with the run page's client (`api`), in the project: in Node with what a page has.
  writeFileSync(join(project, 'api.mjs'), `import { createClient } from 'ocp-api-client'
globalThis.api = createClient({ url: process.env.OCP_API_URL, token: process.env.OCP_API_TOKEN })
`)
  const page = pathToFileURL(join(root, 'test/helpers/page.mjs')).href
  const snippet = block('client/README.md', '## Authentication', 'ts')
  const opened = await runAsUser([process.execPath, '--import', page, '--import', './api.mjs', '--input-type=module-typescript', '-e', snippet], project, { OCP_API_URL: url, OCP_API_TOKEN: 'ci-secret' }, async (output, interrupt) => {
    await waitUntil(() => output().includes('{"open":'), 'the EventSource to open')
    interrupt()
  })
  t.match(JSON.parse(opened.stdout.split('\n')[0]!), { open: /\/api\/events\/stream\?run_id=run-demo-43&stream_token=[\w-]+\.[\w-]+\.[\w-]+$/ }, 'the stream, opened with a stream token in its URL')
})
