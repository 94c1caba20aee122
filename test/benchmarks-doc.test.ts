import { readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import t from 'tap'

// BENCHMARKS.md is a reference: each benchmark's command and its current
// figures, short enough to read (its history lives in git). The checks are
// functions of the text, so that each is also shown to catch what it guards.
// And CI runs every benchmark's command, at a tiny scale (.ci/run).

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const MAX_LINES = 400
const MAX_CELL = 300

/** The file's table cells longer than MAX_CELL characters, by line. */
function longCells (text: string): string[] {
  return text.split('\n').flatMap((line, index) => line.startsWith('|')
    ? line.split('|').filter((cell) => cell.trim().length > MAX_CELL).map((cell) => `line ${index + 1}: ${cell.trim().slice(0, 40)}...`)
    : [])
}

/** The bench:* scripts no section gives a command for, and those a section names that package.json lacks. */
function commandGaps (text: string, scripts: string[]): { missing: string[], unknown: string[] } {
  const commanded = new Set([...text.matchAll(/npm run (bench:[\w-]+)/g)].map((match) => match[1]!))
  const named = new Set([...text.matchAll(/\b(bench:[\w-]+)/g)].map((match) => match[1]!))
  return {
    missing: scripts.filter((script) => !commanded.has(script)),
    unknown: [...named].filter((script) => !scripts.includes(script))
  }
}

const text = readFileSync(join(root, 'BENCHMARKS.md'), 'utf8')
const lines = text.trimEnd().split('\n').length
const packageScripts = Object.keys((JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { scripts: Record<string, string> }).scripts)
const benchScripts = packageScripts.filter((name) => name.startsWith('bench:'))

t.test('BENCHMARKS.md is short, its table cells too', async (t) => {
  t.ok(lines <= MAX_LINES, `at most ${MAX_LINES} lines (${lines})`)
  t.same(longCells(text), [], `no table cell over ${MAX_CELL} characters`)
  t.same(longCells(`| a | ${'x'.repeat(MAX_CELL + 1)} |\n`).length, 1, 'a long cell is caught')
  t.same(longCells(`${'x'.repeat(MAX_CELL + 1)}\n`), [], 'a long line of prose is not a cell')
})

t.test('every bench:* script has a section with its command, and every one named exists', async (t) => {
  t.ok(benchScripts.length >= 10, 'package.json has the bench scripts')
  t.same(commandGaps(text, benchScripts), { missing: [], unknown: [] })
  const [first, ...rest] = benchScripts
  t.same(commandGaps(text, [...rest, 'bench:gone']).unknown, [first], 'a section naming a script package.json lacks is caught')
  t.same(commandGaps(text, [...benchScripts, 'bench:new']).missing, ['bench:new'], 'a script with no section is caught')
})

t.test('.ci/run smoke-runs every bench:* script, or names it with the reason it does not', async (t) => {
  const ci = readFileSync(join(root, '.ci/run'), 'utf8')
  const smoked = [...ci.matchAll(/^\s*smoke ([\w-]+)/gm)].map((match) => `bench:${match[1]}`)
  t.ok(smoked.length >= 10, 'CI has smoke runs')
  t.same(smoked.filter((script) => !benchScripts.includes(script)), [], 'each smoke run is of a script that exists')
  t.same(benchScripts.filter((script) => !smoked.includes(script) && !ci.includes(`${script} (`)), [], 'each script is smoke-run, or named with its reason')
})
