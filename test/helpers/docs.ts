import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { root } from './run.ts'

/* The documentation's code blocks, and running them as a user does: for the tests that run them as written. */

export interface CodeBlock {
  /** The Markdown file, relative to the repository's root. */
  file: string
  /** The heading the block is under, as written (`### In CI`); '' before the first. */
  heading: string
  /** The block's language (`sh`, `ts`), '' when it names none. */
  language: string
  code: string
}

/** The fenced code blocks of `file` (relative to the repository's root), indented ones (in a list item) included, in order. */
export function codeBlocks (file: string): CodeBlock[] {
  const text = readFileSync(join(root, file), 'utf8')
  const blocks: CodeBlock[] = []
  let heading = ''
  for (const match of text.matchAll(/^(#{1,6} .*)$|^( *)```(\w*)\n([^]*?)^\2```$/gm)) {
    if (match[1] !== undefined) {
      heading = match[1]
      continue
    }
    const indent = match[2]!
    const code = match[4]!.split('\n').map((line) => line.startsWith(indent) ? line.slice(indent.length) : line).join('\n')
    blocks.push({ file, heading, language: match[3]!, code })
  }
  return blocks
}

/**
 * The environment of a user's shell: without the test's TypeScript loader
 * and coverage (NODE_OPTIONS, NODE_V8_COVERAGE, tap's own variables) nor
 * npm's variables of the run that started the tests, which would otherwise
 * also record what a documented command runs against the sources.
 */
export const userEnv: Record<string, string> = {
  ...Object.fromEntries(Object.entries(process.env).filter((entry): entry is [string, string] => {
    const [name, value] = entry
    return value !== undefined && name !== 'NODE_OPTIONS' && name !== 'NODE_V8_COVERAGE' && !name.startsWith('TAP') && !name.startsWith('_TAP') && !name.toLowerCase().startsWith('npm_')
  })),
  // tap's process tracking hooks the children all the same: no coverage from them.
  _TAPJS_PROCESSINFO_COVERAGE_: '0'
}

export interface Ran { code: number | null, signal: NodeJS.Signals | null, stdout: string, stderr: string }

/**
 * Runs `command` (a program and its arguments) in `cwd` as a user would,
 * with `env` over userEnv; `during` runs once it started, and may interrupt
 * it (Ctrl-C: SIGINT to its process group). A failure of `during` kills it.
 */
export async function runAsUser (command: string[], cwd: string, env: Record<string, string>, during?: (output: () => string, interrupt: () => void) => Promise<void>): Promise<Ran> {
  const child = spawn(command[0]!, command.slice(1), { cwd, env: { ...userEnv, ...env }, stdio: ['ignore', 'pipe', 'pipe'], detached: true })
  let stdout = ''
  let stderr = ''
  child.stdout.on('data', (chunk) => { stdout += chunk })
  child.stderr.on('data', (chunk) => { stderr += chunk })
  const exited = once(child, 'exit')
  try {
    await during?.(() => stdout + stderr, () => process.kill(-child.pid!, 'SIGINT'))
  } catch (error) {
    process.kill(-child.pid!, 'SIGKILL')
    throw error
  }
  const [code, signal] = await exited
  return { code: code as number | null, signal: signal as NodeJS.Signals | null, stdout, stderr }
}

/** A shell command line, run as runAsUser runs a command. */
export const shell = (line: string, cwd: string, env: Record<string, string>, during?: Parameters<typeof runAsUser>[3]) =>
  runAsUser(['sh', '-ec', line], cwd, env, during)
