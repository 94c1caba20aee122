import { execFile, spawn } from 'node:child_process'
import { once } from 'node:events'
import { mkdtemp, rm, symlink } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { promisify } from 'node:util'
import t, { type Test } from 'tap'
import { migrateToLatest } from '../db/migrate.ts'
import { migrations } from '../db/migrations/index.ts'
import { extraDatabaseUrl, needsServer, withAdmin } from './helpers/database.ts'
import { root, runScript, TEST_SERVICE_ENV, type Outcome } from './helpers/run.ts'

/*
 * A rolling deploy and a rollback across versions (docs/operating.md,
 * "Upgrades, rolling deploys and rollbacks"), with the previous version's
 * own code: a git worktree of it in a temporary directory (removed at the
 * end), run under tsx with this checkout's node_modules (a symlink).
 *
 * Which commit is the previous version: the newest one, walking back from
 * HEAD, whose db/migrations lacks this version's newest migration, i.e.
 * the schema the replicas of version N-1 run on while N's migrations are
 * applied. Then, each way round:
 *
 * - New on old: the previous code migrates a fresh database (`npm run
 *   migrate`'s script); this code starts on it with MIGRATE_ON_START=true,
 *   applies the rest, and serves.
 * - Old on new: this code migrates a fresh database; the previous code
 *   starts on it and answers /api/runs, with MIGRATE_ON_START=false, and
 *   with MIGRATE_ON_START=true. The latter needs a previous version that
 *   serves a database a newer version migrated, which versions before that
 *   change refused ("previously executed migration ... is missing"): it
 *   runs when the commit found above has that change (its db/migrate.ts
 *   defines TOLERANT_MARKER), and is skipped, saying so, when it does not,
 *   as on the branch that brought the change, where the commit before the
 *   newest migration predates it. From the first migration after that
 *   change on, the previous version is one that has it.
 *
 * The walk needs the history: a shallow clone, or a copy without .git,
 * skips the whole file, saying why (CI runs on a full clone).
 */

const TOLERANT_MARKER = 'newerVersionText'

const exec = promisify(execFile)
const git = async (...args: string[]) => (await exec('git', args, { cwd: root })).stdout.trim()
const succeeds = (command: Promise<unknown>) => command.then(() => true, () => false)

const newest = `db/migrations/${Object.keys(migrations).at(-1)}.ts`

/** Why this file cannot run here, or false. */
async function historySkipReason (): Promise<string | false> {
  const shallow = await git('rev-parse', '--is-shallow-repository').catch(() => undefined)
  /* c8 ignore next 2: CI and the development checkouts are full clones */
  if (shallow === undefined) return 'needs the git history: this checkout is not a git repository'
  if (shallow === 'true') return 'needs the git history: this checkout is a shallow clone (git fetch --unshallow)'
  return needsServer('runs the previous version\'s server, on databases of its own')
}

/** The previous version's commit (above), and whether it serves a database a newer version migrated. */
async function previousVersion (): Promise<{ commit: string, tolerant: boolean }> {
  for (const commit of (await git('rev-list', '--topo-order', 'HEAD')).split('\n')) {
    if (await succeeds(git('cat-file', '-e', `${commit}:${newest}`))) continue
    return { commit, tolerant: await succeeds(git('grep', '-q', '-F', TOLERANT_MARKER, commit, '--', 'db/migrate.ts')) }
  }
  /* c8 ignore next: the newest migration was added by some commit */
  throw new Error(`no commit lacks ${newest}`)
}

/** A worktree of `commit` in a temporary directory, with this checkout's node_modules; removed when `t` ends. */
async function worktreeOf (t: Test, commit: string): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'ocp-api-previous-'))
  const tree = join(dir, 'previous')
  await git('worktree', 'add', '--detach', tree, commit)
  t.teardown(async () => {
    await git('worktree', 'remove', '--force', tree)
    await rm(dir, { recursive: true, force: true })
  })
  await symlink(join(root, 'node_modules'), join(tree, 'node_modules'))
  return tree
}

/**
 * Runs `script` of the worktree `tree` under tsx, with `env`; `onStdout`
 * sees all output so far; TEST_SERVICE_ENV's settings, as runScript's. Not
 * with this process's loaders and coverage: the previous code is not this
 * checkout's.
 */
async function runPrevious (tree: string, script: string, env: Record<string, string>, onStdout?: (text: string, child: ReturnType<typeof spawn>) => void): Promise<Outcome> {
  const inherited = Object.fromEntries(Object.entries(process.env).filter(([name]) => !/^(NODE_|_TAPJS|TAP)/.test(name)))
  const child = spawn(process.execPath, ['--import', 'tsx', script], {
    cwd: tree,
    env: { ...inherited, LOG_LEVEL: 'info', ...TEST_SERVICE_ENV, ...env },
    stdio: ['ignore', 'pipe', 'pipe']
  })
  let stdout = ''
  let stderr = ''
  child.stdout.on('data', (chunk) => { stdout += chunk; onStdout?.(stdout, child) })
  child.stderr.on('data', (chunk) => { stderr += chunk })
  const [code] = await once(child, 'exit')
  return { code: code as number | null, stdout, stderr }
}

/** Until the server started by `run` listens: its answer to GET /api/runs, then it is stopped with SIGTERM. */
async function runsAnswer (run: (onStdout: (text: string, child: ReturnType<typeof spawn>) => void) => Promise<Outcome>): Promise<{ outcome: Outcome, status?: number, body?: unknown }> {
  let answer: Promise<{ status: number, body: unknown }> | undefined
  const outcome = await run((stdout, child) => {
    const match = /Server listening at (http:\/\/127\.0\.0\.1:\d+)/.exec(stdout)
    if (match === null || answer !== undefined) return
    answer = fetch(`${match[1]}/api/runs`).then(async (res) => ({ status: res.status, body: await res.json() })).finally(() => child.kill('SIGTERM'))
  })
  return { outcome, ...await answer }
}

/**
 * The previous version's server, started with `env`, answering as runsAnswer says.
 * Before this version, Fastify's default limit of 10 s for a plugin to
 * start applied, and a loaded machine can pass it: such a start is tried
 * again, up to three times (the previous code cannot be changed).
 */
async function previousRunsAnswer (tree: string, env: Record<string, string>): Promise<Awaited<ReturnType<typeof runsAnswer>>> {
  for (let attempt = 1; ; attempt++) {
    const answer = await runsAnswer((onStdout) => runPrevious(tree, 'server.ts', { ...serverEnv, ...env }, onStdout))
    if (attempt === 3 || !answer.outcome.stderr.includes('Plugin did not start in time')) return answer
  }
}

const seedRun = (url: string) => withAdmin(url, (client) => client.query("insert into runs (run_id, goal, status) values ('run-1', 'across versions', 'running')"))
const served = { runs: [{ run: { run_id: 'run-1', goal: 'across versions' } }] }
const serverEnv = { PORT: '0', HOST: '127.0.0.1' }

t.test('the previous version and this one, on each other\'s databases', { skip: await historySkipReason() }, async (t) => {
  const previous = await previousVersion()
  t.comment(`the previous version: ${previous.commit}, the newest commit without ${newest}`)
  const tree = await worktreeOf(t, previous.commit)

  await t.test('new on old: this version applies the rest and serves', async (t) => {
    const url = await extraDatabaseUrl('new_on_old')
    const migrated = await runPrevious(tree, 'db/migrate.ts', { DATABASE_URL: url })
    t.equal(migrated.code, 0, migrated.stderr)
    await seedRun(url)
    const { outcome, status, body } = await runsAnswer((onStdout) => runScript('server.ts', { ...serverEnv, DATABASE_URL: url, MIGRATE_ON_START: 'true' }, onStdout))
    t.equal(outcome.code, 0, outcome.stderr)
    t.match(outcome.stdout, `"applied":["${Object.keys(migrations).at(-1)}"]`, 'the newest migration applied at start')
    t.equal(status, 200)
    t.match(body, served)
  })

  for (const migrateOnStart of ['false', 'true']) {
    const skip = migrateOnStart === 'true' && !previous.tolerant &&
      `the previous version (${previous.commit.slice(0, 12)}) predates serving a database a newer version migrated: it refuses one with MIGRATE_ON_START=true`
    await t.test(`old on new, MIGRATE_ON_START=${migrateOnStart}: the previous version serves`, { skip }, async (t) => {
      const url = await extraDatabaseUrl(`old_on_new_${migrateOnStart}`)
      await migrateToLatest(url)
      await seedRun(url)
      const { outcome, status, body } = await previousRunsAnswer(tree, { DATABASE_URL: url, MIGRATE_ON_START: migrateOnStart })
      t.equal(outcome.code, 0, outcome.stderr)
      t.equal(status, 200)
      t.match(body, served)
    })
  }
})
