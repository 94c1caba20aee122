import { execFileSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import pg from 'pg'
import t from 'tap'
import { ErrorCodes } from '../errors.ts'
import { eventTypeNames } from '../schemas/event-types.ts'
import { endpointsBlock, referencePath, resourcesBlock, withGeneratedBlocks, type OpenApiDocument } from '../scripts/reference.ts'
import { build } from './helpers/app.ts'
import { testDatabaseUrl } from './helpers/database.ts'

// docs/reference.md is the repository's whole contract: its generated parts
// match the served OpenAPI document, and nothing the code defines (an
// operation, a parameter, an error code, an event type, a table column) is
// missing from it. No file of the repository cites a document outside it.

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const reference = readFileSync(referencePath, 'utf8')

/** The text of a `## ` section of the reference, up to the next one. */
function section (title: string): string {
  const start = reference.indexOf(`\n## ${title}\n`)
  if (start < 0) throw new Error(`docs/reference.md has no section "${title}"`)
  const end = reference.indexOf('\n## ', start + 1)
  return reference.slice(start, end < 0 ? undefined : end)
}

t.test('the generated parts are those the served OpenAPI document gives (npm run docs:reference)', async (t) => {
  const app = await build(t)
  const doc = (await app.inject('/openapi.json')).json<OpenApiDocument>()
  t.equal(withGeneratedBlocks(reference, doc), reference, 'docs/reference.md is up to date: run npm run docs:reference')
  const endpoints = section('Endpoints')
  for (const [path, methods] of Object.entries(doc.paths)) {
    for (const operation of Object.values(methods)) {
      t.match(endpoints, `\n### ${operation.operationId}\n`, `${operation.operationId} has its section`)
      t.match(endpoints, path, `${path} is named`)
      for (const parameter of operation.parameters ?? []) {
        t.match(endpoints.toLowerCase(), `| \`${parameter.name.toLowerCase()}\` | ${parameter.in} |`, `${operation.operationId}: ${parameter.name}`)
      }
    }
  }
  const resources = section('Resources')
  for (const name of Object.keys(doc.components.schemas)) t.match(resources, `\n### ${name}\n`, `resource ${name}`)
})

t.test('every error code, with its status', async (t) => {
  const errors = section('Errors')
  for (const [code, status] of Object.entries(ErrorCodes)) t.match(errors, `| ${status} | \`${code}\` |`, `${status} ${code}`)
})

t.test('every event type of the catalog', async (t) => {
  const events = section('Event types')
  for (const type of eventTypeNames) t.match(events, `| \`${type}\` |`, type)
})

t.test('every column of every table the orchestrator writes, under its table', async (t) => {
  const tables = section('Tables the orchestrator writes')
  const client = new pg.Client({ connectionString: await testDatabaseUrl() })
  await client.connect()
  t.teardown(() => client.end())
  const { rows } = await client.query<{ table_name: string, column_name: string }>(`
    select table_name, column_name from information_schema.columns
    where table_schema = 'public' and table_name in ('runs', 'tasks', 'task_attempts', 'threads', 'messages', 'artifacts', 'events')
    order by table_name, ordinal_position`)
  t.ok(rows.length >= 50, 'the tables have their columns')
  for (const { table_name: table, column_name: column } of rows) {
    const start = tables.indexOf(`**\`${table}\`**`)
    t.ok(start >= 0, `table ${table}`)
    const next = tables.indexOf('\n**`', start + 1)
    t.match(tables.slice(start, next < 0 ? undefined : next), `| \`${column}\` |`, `${table}.${column}`)
  }
})

t.test('no file of the repository cites or links a document outside it', async (t) => {
  // .ci/run is the CI of this machine: it may call the machine's own tools. This file names the patterns.
  const files = execFileSync('git', ['ls-files', '--cached', '--others', '--exclude-standard'], { cwd: root, encoding: 'utf8' })
    .split('\n').filter((file) => file !== '' && !file.startsWith('.ci/') && file !== 'test/reference.test.ts' && !/\.(png|ico|woff2?)$/.test(file))
  const outside = /\.\.\/shared\b|\b(?:SPEC|CONTRACT|EVENT-ORDER)\.md\b|\b(?:SPEC|CONTRACT) sections?\b|EVENT-ORDER fact/
  const citing: string[] = []
  for (const file of files) {
    let text: string
    try { text = readFileSync(join(root, file), 'utf8') } catch { continue }
    text.split('\n').forEach((line, i) => { if (outside.test(line)) citing.push(`${file}:${i + 1}: ${line.trim().slice(0, 120)}`) })
  }
  t.same(citing, [], 'every citation points inside the repository')
})

t.test('how a schema reads in the reference', async (t) => {
  const schema = (properties: Record<string, object>): OpenApiDocument => ({ paths: {}, components: { schemas: { Probe: { description: 'A probe', required: ['a'], properties } } } })
  const rendered = resourcesBlock(schema({
    a: { type: 'integer', minimum: 1, maximum: 9 },
    b: { type: 'integer', minimum: 0 },
    c: { type: 'number' },
    d: { type: 'boolean' },
    e: { type: 'null' },
    f: { type: 'string', minLength: 2, maxLength: 5 },
    g: { type: 'string', minLength: 1, pattern: '^[a-z]+$' },
    h: { anyOf: [{ const: 'x' }, { enum: ['y', 'z'] }] },
    i: { type: 'object', additionalProperties: { type: 'string' } },
    j: { type: 'object' },
    k: {},
    l: { type: 'string', description: 'one | two\nlines' },
    m: { type: 'array' },
    n: { type: 'object', patternProperties: { '^.*$': { type: 'integer' } } }
  }))
  t.match(rendered, 'A probe')
  for (const row of ['| `a` | integer (1 to 9) | yes |', '| `b` | integer (≥ 0) | no', '| `c` | number |', '| `d` | boolean |', '| `e` | nothing |',
    '| `f` | string (2 to 5 characters) |', '| `g` | string (not empty, matching `^[a-z]+$`) |', '| `h` | `x` or `y` or `z` |',
    '| `i` | object mapping strings to string |', '| `j` | object |', '| `k` | any JSON |', '| `l` | string | no: omitted when empty | one \\| two lines |']) t.match(rendered, row, row)
  for (const row of ['| `m` | array of any JSON |', '| `n` | object mapping strings to integer |']) t.match(rendered, row, row)
  t.match(resourcesBlock({ paths: {}, components: { schemas: { Bare: {} } } }), '### Bare\n\n| Field | Type | Required | Meaning |\n|---|---|---|---|', 'a schema without fields')
  const endpoints = endpointsBlock({ paths: { '/x': { get: { operationId: 'getX', responses: { 204: { headers: { 'x-thing': {} } } } } } }, components: { schemas: {} } })
  t.match(endpoints, '| 204 |  | none | `X-Thing`:  |', 'a response without body, a header without description')
  t.throws(() => withGeneratedBlocks('<!-- generated: nothing -->\n<!-- end of generated: nothing -->', schema({})), /no generator for the block "nothing"/)
})
