import { execFileSync } from 'node:child_process'
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { root } from './helpers/run.js'

// The published package: `npm pack` in client/ gives a tarball that installs
// in an empty project (no dependency to fetch), type-checks there with the
// types it ships, and runs under Node.

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

t.test('npm pack: the tarball installs, type-checks and runs in an empty project', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'ocp-client-pack-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const npm = (args: string[], cwd: string) => execFileSync('npm', [...args, '--no-audit', '--no-fund', '--loglevel=error'], { cwd, stdio: 'pipe', env: userEnv }).toString()
  npm(['pack', '--pack-destination', dir], join(root, 'client'))
  const [tarball] = readdirSync(dir).filter((name) => name.endsWith('.tgz'))
  t.ok(tarball, 'a tarball')
  const contents = execFileSync('tar', ['-tzf', join(dir, tarball!)]).toString().split('\n').filter(Boolean).sort()
  t.ok(contents.includes('package/dist/index.js') && contents.includes('package/dist/index.d.ts'), 'ESM and its declarations')
  t.notOk(contents.some((path) => path.includes('/src/') || path.includes('/scripts/')), 'only dist/')

  const project = join(dir, 'project')
  execFileSync('mkdir', [project])
  writeFileSync(join(project, 'package.json'), JSON.stringify({ name: 'empty', version: '1.0.0', type: 'module', private: true }))
  npm(['install', join(dir, tarball!), '--offline'], project)
  writeFileSync(join(project, 'tsconfig.json'), JSON.stringify({ compilerOptions: { target: 'ES2022', module: 'NodeNext', moduleResolution: 'NodeNext', strict: true, noEmit: true, types: [] }, include: ['main.ts'] }))
  writeFileSync(join(project, 'main.ts'), `
import { ApiError, createClient, CursorExpired, type Event, type RunDetail } from 'ocp-api-client'
const client = createClient({ url: 'http://127.0.0.1:8080', token: 'x' })
export async function statusOf (id: string): Promise<string> {
  const { run }: { run: RunDetail } = await client.run(id)
  return run.run.status
}
export async function first (): Promise<Event | undefined> {
  for await (const event of client.watch({ run_id: 'r' }, { after: 0 })) return event
  return undefined
}
const live = client.liveRuns({ status: ['running'] }, (body, read) => console.log(body.runs.length, read.next))
live.close()
export const isExpired = (error: unknown) => error instanceof CursorExpired || (error instanceof ApiError && error.code === 'cursor_expired')
// @ts-expect-error: a run's status is a string
export const wrong: number = ({} as RunDetail).run.status
`)
  execFileSync(process.execPath, [join(root, 'node_modules/typescript/bin/tsc'), '-p', project], { stdio: 'pipe', env: userEnv })
  t.pass('type-checks in the empty project, with the types it ships')
  const out = execFileSync(process.execPath, ['--input-type=module', '-e', `
import { createClient, ApiError } from 'ocp-api-client'
const client = createClient({ url: 'http://127.0.0.1:9' })
console.log(typeof client.liveRun, typeof client.watch, new ApiError(404, 'not_found', 'no such run', 'u').message)
`], { cwd: project, env: userEnv }).toString()
  t.equal(out.trim(), 'function function no such run (HTTP 404 not_found, u)')
})
