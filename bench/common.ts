/*
 * What the benchmarks share: the scales, the bench databases, the marker
 * that records what a database holds, and small process helpers (those the
 * tests have too come from test/helpers/wait.ts).
 */
import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import pg from 'pg'
import { migrateToLatest } from '../db/migrate.ts'
import { seed } from '../db/seed.ts'
import { TEST_SERVICE_ENV } from '../test/helpers/run.ts'
import { freePort, sleep, withDatabase } from '../test/helpers/wait.ts'

export { freePort, sleep, withDatabase }

/** The settings every service a benchmark starts runs with: the tests' (no load shedding). */
export const BENCH_SERVICE_ENV = TEST_SERVICE_ENV

export const root = join(dirname(fileURLToPath(import.meta.url)), '..')

export interface Scale {
  runs: number
  tasks: number
  events: number
}

/**
 * The scales of issue 7. Threads, messages and artifacts follow from the
 * tasks (see bench/generate.ts for the shape).
 */
export const SCALES = {
  small: { runs: 1_000, tasks: 20_000, events: 100_000 },
  large: { runs: 50_000, tasks: 1_000_000, events: 5_000_000 }
} satisfies Record<string, Scale>

export type ScaleName = keyof typeof SCALES

export function isScaleName (name: string): name is ScaleName {
  return Object.hasOwn(SCALES, name)
}

/** The ids the HTTP benchmark reads: the same shape at every scale. */
export interface Targets {
  /** A run of 10 tasks (2 blocked). */
  run10: string
  /** A run of 200 tasks (10 blocked, each with its attempt and question). */
  run200: string
  /** A thread of 200 messages (a quarter with artifacts): the first attempt's thread of run200's blocked task-020. */
  thread200: string
}

/** What a bench database holds: written by bench/generate.ts once it has finished. */
export interface Marker {
  scale: ScaleName
  seed: number
  version: number
  counts: Record<string, number>
  targets: Targets
  seconds: number
  generated_at: string
}

export function adminUrl (): string {
  const url = process.env.DATABASE_URL
  if (url === undefined || url === '') {
    console.error('bench: set DATABASE_URL to the server\'s admin URL (e.g. postgres://postgres@127.0.0.1:5432/postgres); the bench databases are created beside it')
    process.exit(2)
  }
  return url
}

export const defaultDatabaseFor = (scale: ScaleName) => `ocp_bench_${scale}`

/** The marker of a bench database, or undefined when it is missing, empty or unfinished. */
export async function readMarker (url: string): Promise<Marker | undefined> {
  const client = new pg.Client({ connectionString: url })
  try {
    await client.connect()
  } catch {
    return undefined
  }
  try {
    const exists = await client.query("select to_regclass('bench.marker') is not null as present")
    if (exists.rows[0].present !== true) return undefined
    const result = await client.query('select scale, seed, version, counts, targets, seconds::float8 as seconds, generated_at::text from bench.marker')
    return result.rows[0] as Marker | undefined
  } finally {
    await client.end()
  }
}

export const formatInt = (n: number) => Math.round(n).toLocaleString('en-US')

/** The checkout's commit, and whether tracked files differ from it: printed beside the figures. */
export function gitDescription (): string {
  try {
    const commit = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: root, encoding: 'utf8' }).trim()
    const dirty = execFileSync('git', ['status', '--porcelain', '--untracked-files=no'], { cwd: root, encoding: 'utf8' }).trim() !== ''
    return `${commit}${dirty ? ' (with uncommitted changes)' : ''}`
  } catch {
    return 'unknown'
  }
}

/** The middle value (the upper one of an even count). */
export const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!

/** `npm run build`: the service as `npm start` runs it (dist/). */
export function buildService (): void {
  const build = spawnSync('npm', ['run', '--silent', 'build'], { cwd: root, stdio: 'inherit' })
  if (build.status !== 0) throw new Error('npm run build failed')
}

/** Database `name` beside the admin URL's, made anew and empty (a bench's own, dropped first if a run left it); its URL. */
export async function emptyDatabase (name: string): Promise<string> {
  const admin = new pg.Client({ connectionString: adminUrl() })
  await admin.connect()
  try {
    await admin.query(`drop database if exists ${name} with (force)`)
    await admin.query(`create database ${name}`)
  } finally {
    await admin.end()
  }
  return withDatabase(adminUrl(), name)
}

/** emptyDatabase, migrated; its URL. */
export async function migratedDatabase (name: string): Promise<string> {
  const url = await emptyDatabase(name)
  await migrateToLatest(url)
  return url
}

/** emptyDatabase with the demo fixture (migrated, then loaded); its URL. */
export async function demoDatabase (name: string): Promise<string> {
  const databaseUrl = await emptyDatabase(name)
  await seed(databaseUrl, join(root, 'fixtures/demo.json'))
  return databaseUrl
}

/** How long a started server may take to answer: on a loaded machine loading the TypeScript alone takes many seconds. */
const START_TIMEOUT_MS = 120_000

/**
 * Waits until `url` answers 200, served by `child`. If the child exits
 * first, or START_TIMEOUT_MS passes, it fails, and kills the child: a bench
 * that gives up leaves no server running behind it.
 */
export async function untilAnswering (child: ChildProcess, url: string, what: string): Promise<void> {
  const deadline = Date.now() + START_TIMEOUT_MS
  while (child.exitCode === null && child.signalCode === null && Date.now() < deadline) {
    try {
      const res = await fetch(url)
      await res.arrayBuffer()
      if (res.ok) return
    } catch {}
    await sleep(100)
  }
  const exited = child.exitCode ?? child.signalCode
  child.kill('SIGKILL')
  throw new Error(exited === null ? `${what} did not answer ${url} within ${START_TIMEOUT_MS / 1000} s` : `${what} exited (${exited}) before answering`)
}

/** The built service (node dist/server.js) on a free port over `databaseUrl`, once /ready answers; `env` adds to or overrides its environment. */
export async function startBuiltService (databaseUrl: string, env: Record<string, string>): Promise<{ url: string, child: ChildProcess }> {
  const port = await freePort()
  const child = spawn(process.execPath, [join(root, 'dist/server.js')], {
    cwd: root,
    env: { ...process.env, DATABASE_URL: databaseUrl, PORT: String(port), HOST: '127.0.0.1', LOG_LEVEL: 'info', LOG_FORMAT: 'json', ...BENCH_SERVICE_ENV, ...env },
    stdio: ['ignore', 'ignore', 'inherit']
  })
  const url = `http://127.0.0.1:${port}`
  await untilAnswering(child, `${url}/ready`, 'the service')
  return { url, child }
}
