import { execFileSync } from 'node:child_process'
import { existsSync, readdirSync, readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { ConfigSchema } from '../config.ts'

// The documentation names every setting the code reads: the README's table
// and .env.example stay in step with config.ts; every path it names exists;
// and the README's layout names every top-level folder, each of which has a
// README of its own.
// (Error codes, event types and table columns: test/reference.test.ts.)

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const readme = readFileSync(join(root, 'README.md'), 'utf8')
const example = readFileSync(join(root, '.env.example'), 'utf8')
const tracingDoc = readFileSync(join(root, 'docs/tracing.md'), 'utf8')

t.test('every configuration variable is documented', async (t) => {
  const variables = Object.keys(ConfigSchema.properties)
  for (const name of variables) {
    t.match(readme, new RegExp(`^\\| \`${name}\` \\|`, 'm'), `README documents ${name}`)
    t.match(example, new RegExp(`^${name}=`, 'm'), `.env.example lists ${name}`)
  }
  const documented = [...readme.matchAll(/^\| `([A-Z_]+)` \|/gm)].map((match) => match[1])
  // OTEL_* are the OpenTelemetry SDK's own variables (tracing.ts), not config.ts's.
  t.same(documented.filter((name) => !variables.includes(name!) && !name!.startsWith('OTEL_')), [], 'and the README documents no variable that does not exist')
  t.match(tracingDoc, /^\| `OTEL_EXPORTER_OTLP_ENDPOINT` \|/m, 'and docs/tracing.md the tracing variables')
})

/** The top-level folders of the repository as git tracks them (dot-folders aside), at the time the test runs. */
const trackedFolders = [...new Set(execFileSync('git', ['ls-files'], { cwd: root, encoding: 'utf8' })
  .split('\n').filter((path) => path.includes('/')).map((path) => path.slice(0, path.indexOf('/'))))]
  .filter((folder) => !folder.startsWith('.')).sort()

/** The folders' own READMEs (what lives there, what it may import). */
const folderReadmes = readdirSync(root, { withFileTypes: true })
  .filter((entry) => entry.isDirectory() && !entry.name.startsWith('.') && entry.name !== 'node_modules' && existsSync(join(root, entry.name, 'README.md')))
  .map((entry) => `${entry.name}/README.md`)

/** The Markdown files a reader opens: the README, BENCHMARKS.md, CHANGELOG.md, docs/ and each folder's README. */
const markdownFiles = [...new Set(['README.md', 'BENCHMARKS.md', 'CHANGELOG.md', ...readdirSync(join(root, 'docs')).filter((name) => name.endsWith('.md')).map((name) => `docs/${name}`), ...folderReadmes])]

t.test('the README\'s layout names every top-level folder, and each has a README', async (t) => {
  const start = readme.indexOf('\n## Layout\n')
  t.ok(start >= 0, 'the README has a "Layout" section')
  const end = readme.indexOf('\n## ', start + 1)
  const layout = readme.slice(start, end < 0 ? undefined : end)
  // A folder is named in the first cell of a row of the layout's table: | `db/` | ... |
  const named = layout.split('\n').filter((line) => line.startsWith('| `'))
    .flatMap((line) => [...line.split(' | ')[0]!.matchAll(/`([\w.-]+)\/`/g)].map((match) => match[1]!))
  t.ok(trackedFolders.length >= 10 && trackedFolders.includes('db'), 'git lists the folders')
  t.same(trackedFolders.filter((folder) => !named.includes(folder)), [], 'every top-level folder git tracks is named in the layout')
  t.same(named.filter((folder) => !existsSync(join(root, folder))), [], 'and every folder the layout names exists')
  t.same(trackedFolders.filter((folder) => !existsSync(join(root, folder, 'README.md'))), [], 'every top-level folder has a README')
})

/** A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as hyphens. */
const anchorOf = (heading: string) => heading.trim().toLowerCase().replace(/[^\p{L}\p{N}\s_-]/gu, '').replace(/\s/g, '-')

/** The anchors of a Markdown file's headings (outside code blocks). */
function anchorsOf (file: string): Set<string> {
  const text = readFileSync(file, 'utf8').replace(/^```[^\n]*\n[\s\S]*?^```/gm, '')
  return new Set([...text.matchAll(/^#{1,6} (.+)$/gm)].map((match) => anchorOf(match[1]!)))
}

t.test('one glossary: the reference\'s "Words", which the other pages link to', async (t) => {
  const reference = readFileSync(join(root, 'docs/reference.md'), 'utf8')
  t.match(reference, /\n## Words\n/, 'docs/reference.md has a "Words" section')
  for (const [path, link] of [['docs/stream.md', 'reference.md#words'], ['docs/durable-streams.md', 'reference.md#words'], ['events/README.md', '../docs/reference.md#words']] as const) {
    const text = readFileSync(join(root, path), 'utf8')
    t.ok(text.includes(`](${link})`), `${path} links to the glossary`)
    t.notMatch(text, /one meaning each|keeps apart|A word used with one meaning/, `and ${path} keeps no glossary of its own`)
  }
})

t.test('every link to a section of the documentation finds its heading', async (t) => {
  for (const file of markdownFiles) {
    const text = readFileSync(join(root, file), 'utf8')
    for (const [, target, anchor] of text.matchAll(/\]\(([^)#\s]*)#([^)\s]+)\)/g)) {
      if (/^[a-z]+:/.test(target!)) continue
      const linked = target === '' ? join(root, file) : join(root, dirname(file), target!)
      if (!linked.startsWith(root) || !linked.endsWith('.md')) continue
      t.ok(anchorsOf(linked).has(anchor!), `${file} links to ${target}#${anchor}`)
    }
  }
})

t.test('every repository path the documentation names exists', async (t) => {
  for (const file of markdownFiles) {
    const text = readFileSync(join(root, file), 'utf8')
    // Relative links, and file paths in code spans (a folder and a file with an extension).
    const links = [...text.matchAll(/\]\(([^)#\s]+)(?:#[^)]*)?\)/g)].map((match) => match[1]!).filter((target) => !/^[a-z]+:/.test(target))
    const spans = [...text.matchAll(/`((?:[\w.-]+\/)+[\w.-]+\.[a-z]{2,8})`/g)].map((match) => match[1]!)
      .filter((path) => !path.startsWith('dist/') && !path.includes('node_modules'))
    for (const path of new Set([...links, ...spans])) {
      const fromFile = join(root, dirname(file), path)
      if (!fromFile.startsWith(root)) continue // outside the repository (the shared contract beside it)
      t.ok(existsSync(fromFile) || existsSync(join(root, path)), `${file} names ${path}`)
    }
  }
})

t.test('the image builds from every source folder, and runs the service as npm start does', async (t) => {
  const dockerfile = readFileSync(join(root, 'Dockerfile'), 'utf8')
  const build = JSON.parse(readFileSync(join(root, 'tsconfig.build.json'), 'utf8')) as { include?: string[] }
  // Each folder the build compiles is copied into the build stage (a folder left out failed the image's build once).
  const folders = new Set((build.include ?? []).map((pattern) => pattern.split('/')[0]!).filter((folder) => !folder.includes('.') && !folder.includes('*')))
  t.ok(folders.size > 0, 'the build names its folders')
  for (const folder of folders) t.match(dockerfile, new RegExp(`^COPY ${folder} \\./${folder}$`, 'm'), `the Dockerfile copies ${folder}/`)
  const start = (JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { scripts: Record<string, string> }).scripts.start!
  const cmd = /^CMD \[(.*)\]$/m.exec(dockerfile)![1]!.split(',').map((part) => JSON.parse(part.trim()) as string).join(' ')
  t.equal(cmd, start, 'the image\'s command is npm start\'s (its node flags included)')
})
