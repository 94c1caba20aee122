import { execFileSync, spawn } from 'node:child_process'
import { once } from 'node:events'
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { setRunStatus } from '../db/writer.js'
import { build } from './helpers/app.js'
import { insertGraph, makeRun, writer } from './helpers/fixtures.js'
import { root } from './helpers/run.js'
import { waitUntil } from './helpers/wait.js'

// The published package: `npm pack` in client/ gives a tarball that installs
// in an empty project (no dependency to fetch), type-checks there with the
// types it ships, and runs under Node; its bin runs with nothing installed;
// and its README's examples run, as written, against the service.

/**
 * The environment of a user's shell: without the test's TypeScript loader
 * and coverage (NODE_OPTIONS, NODE_V8_COVERAGE, tap's own variables), which
 * would otherwise also record the packed copy's run against client/src.
 */
const userEnv = {
  ...Object.fromEntries(Object.entries(process.env).filter(([name]) =>
    name !== 'NODE_OPTIONS' && name !== 'NODE_V8_COVERAGE' && !name.startsWith('TAP') && !name.startsWith('_TAP'))),
  // tap's process tracking hooks the children all the same: no coverage from them.
  _TAPJS_PROCESSINFO_COVERAGE_: '0'
}

const dir = mkdtempSync(join(tmpdir(), 'ocp-client-pack-'))
t.teardown(() => rmSync(dir, { recursive: true, force: true }))
const npm = (args: string[], cwd: string) => execFileSync('npm', [...args, '--no-audit', '--no-fund', '--loglevel=error'], { cwd, stdio: 'pipe', env: userEnv }).toString()
/** The project the tarball is installed in. */
const project = join(dir, 'project')

interface Ran { code: number | null, stdout: string, stderr: string }

/** Runs `command` in the project as a user's shell would; `during` runs once it started. */
async function inProject (command: string[], env: Record<string, string>, during?: (output: () => string) => Promise<void>): Promise<Ran> {
  const child = spawn(command[0]!, command.slice(1), { cwd: project, env: { ...userEnv, ...env }, stdio: ['ignore', 'pipe', 'pipe'] })
  let stdout = ''
  let stderr = ''
  child.stdout.on('data', (chunk) => { stdout += chunk })
  child.stderr.on('data', (chunk) => { stderr += chunk })
  const exited = once(child, 'exit')
  await during?.(() => stdout + stderr)
  const [code] = await exited
  return { code: code as number | null, stdout, stderr }
}

/** The fenced blocks of client/README.md in `language`, each with the heading it is under. */
function readmeBlocks (language: string): Array<{ heading: string, code: string }> {
  const text = readFileSync(join(root, 'client/README.md'), 'utf8')
  const blocks: Array<{ heading: string, code: string }> = []
  let heading = ''
  for (const match of text.matchAll(/^(#+ .*)$|^```(\w+)\n([^]*?)^```$/gm)) {
    if (match[1] !== undefined) heading = match[1]
    else if (match[2] === language) blocks.push({ heading, code: match[3]! })
  }
  return blocks
}

t.test('npm pack: the tarball installs, type-checks and runs in an empty project; its bin runs with nothing installed', async (t) => {
  npm(['pack', '--pack-destination', dir], join(root, 'client'))
  const [tarball] = readdirSync(dir).filter((name) => name.endsWith('.tgz'))
  t.ok(tarball, 'a tarball')
  const contents = execFileSync('tar', ['-tzf', join(dir, tarball!)]).toString().split('\n').filter(Boolean).sort()
  t.ok(contents.includes('package/dist/index.js') && contents.includes('package/dist/index.d.ts'), 'ESM and its declarations')
  t.ok(contents.includes('package/dist/cli.js') && contents.includes('package/README.md'), 'the bin and the README')
  t.notOk(contents.some((path) => path.includes('/src/') || path.includes('/scripts/')), 'only dist/')

  const unpacked = join(dir, 'unpacked')
  mkdirSync(unpacked)
  execFileSync('tar', ['-xzf', join(dir, tarball!), '-C', unpacked])
  const manifest = JSON.parse(readFileSync(join(unpacked, 'package/package.json'), 'utf8')) as { bin: Record<string, string>, dependencies?: unknown }
  t.same(manifest.bin, { 'ocp-api': './dist/cli.js' })
  t.equal(manifest.dependencies, undefined, 'no runtime dependency')
  t.match(readFileSync(join(unpacked, 'package/dist/cli.js'), 'utf8'), /^#!\/usr\/bin\/env node\n/)
  const help = execFileSync(process.execPath, [join(unpacked, 'package/dist/cli.js'), '--help'], { cwd: unpacked, env: userEnv }).toString()
  t.match(help, /^Usage: ocp-api COMMAND/, 'plain node, no node_modules anywhere')

  mkdirSync(project)
  writeFileSync(join(project, 'package.json'), JSON.stringify({ name: 'empty', version: '1.0.0', type: 'module', private: true }))
  npm(['install', join(dir, tarball!), '--offline'], project)
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
  execFileSync(process.execPath, [join(root, 'node_modules/typescript/bin/tsc'), '-p', project], { stdio: 'pipe', env: userEnv })
  t.pass('type-checks in the empty project, with the types it ships')
  const out = execFileSync(process.execPath, ['--input-type=module', '-e', `
import { createClient, ApiError } from 'ocp-api-client'
const client = createClient({ url: 'http://127.0.0.1:9' })
console.log(typeof client.liveRun, typeof client.followRun, new ApiError(404, 'not_found', 'no such run', 'u').message)
`], { cwd: project, env: userEnv }).toString()
  t.equal(out.trim(), 'function function no such run (HTTP 404 not_found, u)')
  t.match((await inProject(['npx', 'ocp-api-client', '--help'], {})).stdout, /^Usage: ocp-api COMMAND/, 'npx ocp-api-client: the package\'s only bin')
})

t.test('the README: its client example and its CI step, as written, against the service', async (t) => {
  const app = await build(t, { EVENTS_POLL_INTERVAL_MS: 50, SSE_RETRY_MS: 100 })
  await app.listen({ port: 0, host: '127.0.0.1' })
  const url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`
  await insertGraph({ runs: ['run-readme', 'run-ci', 'run-ci-fails'].map((run_id) => makeRun({ run_id, status: 'running' })) })
  const db = await writer()

  const [example] = readmeBlocks('ts')
  t.ok(example, 'the client example')
  writeFileSync(join(project, 'readme.ts'), example!.code)
  writeFileSync(join(project, 'tsconfig.readme.json'), JSON.stringify({
    compilerOptions: { target: 'ES2022', module: 'NodeNext', moduleResolution: 'NodeNext', strict: true, outDir: 'readme', typeRoots: [join(root, 'node_modules/@types')], types: ['node'], skipLibCheck: true },
    files: ['readme.ts']
  }))
  execFileSync(process.execPath, [join(root, 'node_modules/typescript/bin/tsc'), '-p', join(project, 'tsconfig.readme.json')], { stdio: 'pipe', env: userEnv })
  const page = await inProject(['node', 'readme/readme.js', 'run-readme'], { OCP_API_URL: url }, async (output) => {
    await waitUntil(() => output().includes('run-readme is running'), 'the first read')
    await setRunStatus(db, 'run-readme', 'done', 'All done')
  })
  t.equal(page.code, 0, page.stderr)
  t.match(page.stdout, /^run-readme is running, 0 tasks\n#\d+ run_status All done\nrun-readme is done, 0 tasks\n$/, 'the read, the event, the read that ends it')
  const unknown = await inProject(['node', 'readme/readme.js', 'no-such-run'], { OCP_API_URL: url })
  t.equal(unknown.code, 2)
  t.match(unknown.stderr, /^run not found \(HTTP 404 not_found, \S+\/api\/runs\/no-such-run\)\n$/)

  const ci = readmeBlocks('sh').find((block) => block.heading === '### In CI')
  t.ok(ci, 'the CI step')
  const runCi = (runId: string, status: string) => inProject(['sh', '-ec', ci!.code], { OCP_API_URL: url, RUN_ID: runId }, async (output) => {
    await waitUntil(() => output().includes(`run ${runId} is running`), `${runId} waited on`)
    await setRunStatus(db, runId, status, '')
  })
  const passed = await runCi('run-ci', 'done')
  t.equal(passed.code, 0, passed.stderr)
  t.equal(JSON.parse(readFileSync(join(project, 'run.json'), 'utf8')).run.status, 'done')
  const failed = await runCi('run-ci-fails', 'failed')
  t.equal(failed.code, 1, 'the step fails when the run fails')
  t.match(failed.stderr, /run run-ci-fails ended failed, not done/)
  t.equal(JSON.parse(readFileSync(join(project, 'run.json'), 'utf8')).run.status, 'failed', 'run.json: the run as it ended')

  const exitCodes = readFileSync(join(root, 'client/README.md'), 'utf8').match(/^\| [0-3] \|.*$/gm) ?? []
  t.same(exitCodes.map((row) => row[2]), ['0', '1', '2', '3'], 'the README lists every exit code')
  t.match(exitCodes[1], /could not be reached/)
})
