import { readdirSync, readFileSync, statSync } from 'node:fs'
import { builtinModules } from 'node:module'
import t from 'tap'

// package.json tells the truth: every package the shipped code imports is a
// dependency (a production install has no devDependencies), and every
// dependency is imported by it, or is listed below with the reason.

const root = new URL('../', import.meta.url)
const pkg = JSON.parse(readFileSync(new URL('package.json', root), 'utf8')) as { dependencies: Record<string, string>, devDependencies: Record<string, string> }

/** What the image and a production install run (tsconfig.build.json, plus bin/). */
const SHIPPED = ['app.ts', 'server.ts', 'config.ts', 'errors.ts', 'tracing.ts', 'demo.ts', 'plugins', 'routes', 'db', 'schemas', 'client/src', 'bin']

/** Dependencies no `import` names, and why they are there. */
const NOT_IMPORTED: Record<string, string> = {
  '@opentelemetry/api': 'the peer dependency the OpenTelemetry packages share (tracing.ts)',
  'pino-pretty': 'a pino transport, loaded by name (app.ts)'
}

/** Imported by shipped code only where the source is (a checkout, with devDependencies): bin/ocp-api.js. */
const CHECKOUT_ONLY = new Set(['tsx'])

function sourceFiles (path: string): string[] {
  const url = new URL(path, root)
  if (!statSync(url).isDirectory()) return [path]
  return readdirSync(url, { recursive: true, encoding: 'utf8' })
    .filter((name) => /\.(ts|js|mjs)$/.test(name) && !name.endsWith('.d.ts'))
    .map((name) => `${path}/${name}`)
}

/** The package each bare specifier of a file names (`from 'x'`, `import('x')`). */
function packagesImportedBy (path: string): string[] {
  const text = readFileSync(new URL(path, root), 'utf8')
  const specifiers = [...text.matchAll(/^\s*(?:import|export)\s[^'"]*?from\s+'([^']+)'|^\s*import\s+'([^']+)'|\bimport\(\s*'([^']+)'\s*\)|\bregister\(\s*'([^']+)'/gm)]
    .map((match) => match.slice(1).find((group) => group !== undefined)!)
  return specifiers
    .filter((spec) => !spec.startsWith('.') && !spec.startsWith('node:') && !builtinModules.includes(spec))
    .map((spec) => spec.split('/').slice(0, spec.startsWith('@') ? 2 : 1).join('/'))
}

const imported = new Map<string, string>()
for (const file of SHIPPED.flatMap(sourceFiles)) {
  for (const name of packagesImportedBy(file)) imported.set(name, file)
}

t.test('every package the shipped code imports is a dependency', async (t) => {
  t.ok(imported.size > 20, 'the imports are read')
  for (const [name, file] of imported) {
    if (CHECKOUT_ONLY.has(name)) t.ok(pkg.devDependencies[name], `${name} (${file}): a devDependency, used in a checkout only`)
    else t.ok(pkg.dependencies[name], `${name}, imported by ${file}, is a dependency`)
  }
})

t.test('every dependency is imported by the shipped code, or said why not', async (t) => {
  for (const name of Object.keys(pkg.dependencies)) {
    t.ok(imported.has(name) || NOT_IMPORTED[name] !== undefined, `${name} is used`)
  }
  for (const name of Object.keys(NOT_IMPORTED)) t.notOk(imported.has(name), `${name} is still not imported: its entry goes`)
})
