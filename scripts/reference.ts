/*
 * The generated parts of docs/reference.md: every operation with its
 * parameters, statuses and headers, and every resource with its fields,
 * written from the OpenAPI document the running service serves (which the
 * TypeBox schemas of schemas/ and routes/ produce), so that the reference
 * and the wire never disagree. The prose around them is written by hand.
 *
 *   npm run docs:reference      rewrites docs/reference.md's generated blocks
 *
 * test/reference.test.ts fails when the file differs from what this writes.
 */
import { readFileSync, writeFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { EVENT_TYPES } from '../schemas/event-types.ts'

export const referencePath = join(dirname(fileURLToPath(import.meta.url)), '../docs/reference.md')

interface JsonSchema {
  type?: string | string[]
  $ref?: string
  description?: string
  enum?: unknown[]
  const?: unknown
  anyOf?: JsonSchema[]
  items?: JsonSchema
  additionalProperties?: JsonSchema | boolean
  patternProperties?: Record<string, JsonSchema>
  properties?: Record<string, JsonSchema>
  required?: string[]
  format?: string
  minimum?: number
  maximum?: number
  minLength?: number
  maxLength?: number
  pattern?: string
}
interface Parameter { name: string, in: string, required?: boolean, description?: string, schema?: JsonSchema }
interface Response { description?: string, headers?: Record<string, { description?: string }>, content?: Record<string, { schema?: JsonSchema }> }
interface Operation { operationId: string, summary?: string, description?: string, parameters?: Parameter[], responses: Record<string, Response> }
export interface OpenApiDocument { paths: Record<string, Record<string, Operation>>, components: { schemas: Record<string, JsonSchema> } }

/** A schema as words: its type and what it accepts. */
function typeOf (schema: JsonSchema | undefined): string {
  if (schema === undefined) return 'any JSON'
  if (schema.$ref !== undefined) {
    const name = schema.$ref.split('/').pop()!
    return `[${name}](#${name.toLowerCase()})`
  }
  if (schema.anyOf !== undefined) return schema.anyOf.map(typeOf).join(' or ')
  if (schema.const !== undefined) return `\`${String(schema.const)}\``
  if (schema.enum !== undefined) return schema.enum.map((value) => `\`${String(value)}\``).join(' or ')
  const limits: string[] = []
  if (schema.minimum !== undefined && schema.maximum !== undefined) limits.push(`${schema.minimum} to ${schema.maximum}`)
  else if (schema.minimum !== undefined) limits.push(`≥ ${schema.minimum}`)
  if (schema.minLength !== undefined && schema.maxLength !== undefined) limits.push(`${schema.minLength} to ${schema.maxLength} characters`)
  else if (schema.minLength !== undefined && schema.minLength > 0) limits.push('not empty')
  if (schema.pattern === '^[^\\u0000]+$') limits.push('no NUL')
  else if (schema.pattern !== undefined) limits.push(`matching \`${schema.pattern}\``)
  const limited = (word: string) => limits.length === 0 ? word : `${word} (${limits.join(', ')})`
  switch (schema.type) {
    case 'string': return limited(schema.format === 'date-time' ? 'date-time string' : 'string')
    case 'integer': return limited('integer')
    case 'number': return limited('number')
    case 'boolean': return 'boolean'
    case 'null': return 'nothing'
    case 'array': return `array of ${typeOf(schema.items)}`
    case 'object': {
      const values = schema.patternProperties === undefined ? undefined : Object.values(schema.patternProperties)[0]
      if (values !== undefined) return `object mapping strings to ${typeOf(values)}`
      if (typeof schema.additionalProperties === 'object') return `object mapping strings to ${typeOf(schema.additionalProperties)}`
      return 'object'
    }
    default: return 'any JSON'
  }
}

/** Text for a table cell: one line, pipes escaped. */
const cell = (text: string | undefined) => (text ?? '').replace(/\s*\n\s*/g, ' ').replace(/\|/g, '\\|')

/** A header's name as it is usually written: X-Event-Cursor, ETag. */
const headerName = (name: string) => name === 'etag' ? 'ETag' : name.split('-').map((part) => part.charAt(0).toUpperCase() + part.slice(1)).join('-')

const METHOD_ORDER = ['get', 'head', 'post', 'put', 'patch', 'delete']

/** The operations, one per path and method (each has its own operationId). */
function operationsOf (doc: OpenApiDocument) {
  const operations: Array<{ method: string, path: string, operation: Operation }> = []
  for (const [path, methods] of Object.entries(doc.paths)) {
    for (const method of METHOD_ORDER) {
      const operation = methods[method]
      if (operation !== undefined) operations.push({ method: method.toUpperCase(), path, operation })
    }
  }
  return operations
}

/** The generated block `endpoints`: a table of every operation, then each in detail. */
export function endpointsBlock (doc: OpenApiDocument): string {
  const operations = operationsOf(doc)
  const lines = ['| Operation | Method | Path | What it answers |', '|---|---|---|---|']
  for (const { method, path, operation } of operations) {
    lines.push(`| [${operation.operationId}](#${operation.operationId.toLowerCase()}) | ${method} | \`${path}\` | ${cell(operation.summary)} |`)
  }
  for (const { method, path, operation } of operations) {
    lines.push('', `### ${operation.operationId}`, '', `\`${method} ${path}\`: ${cell(operation.summary)}.`)
    if (operation.description !== undefined) lines.push('', cell(operation.description))
    const parameters = operation.parameters ?? []
    if (parameters.length > 0) {
      lines.push('', '| Parameter | In | Required | Accepts | Meaning |', '|---|---|---|---|---|')
      for (const parameter of parameters) {
        const name = parameter.in === 'header' ? headerName(parameter.name) : parameter.name
        lines.push(`| \`${name}\` | ${parameter.in} | ${parameter.required === true ? 'yes' : 'no'} | ${cell(typeOf(parameter.schema))} | ` +
          `${cell(parameter.description)} |`)
      }
    }
    lines.push('', '| Status | Meaning | Body | Headers |', '|---|---|---|---|')
    for (const [status, response] of Object.entries(operation.responses)) {
      const bodies = Object.entries(response.content ?? {}).map(([type, { schema }]) => `${type}: ${typeOf(schema)}`)
      const headers = Object.entries(response.headers ?? {}).map(([name, header]) => `\`${headerName(name)}\`: ${header.description ?? ''}`)
      lines.push(`| ${status} | ${cell(response.description)} | ${cell(bodies.join('; ')) || 'none'} | ${cell(headers.join('; '))} |`)
    }
  }
  return lines.join('\n')
}

/** The generated block `resources`: each schema the operations answer with, its fields. */
export function resourcesBlock (doc: OpenApiDocument): string {
  const lines: string[] = []
  for (const [name, schema] of Object.entries(doc.components.schemas)) {
    lines.push(`### ${name}`, '')
    if (schema.description !== undefined) lines.push(cell(schema.description), '')
    lines.push('| Field | Type | Required | Meaning |', '|---|---|---|---|')
    const required = new Set(schema.required ?? [])
    for (const [field, fieldSchema] of Object.entries(schema.properties ?? {})) {
      lines.push(`| \`${field}\` | ${cell(typeOf(fieldSchema))} | ${required.has(field) ? 'yes' : 'no: omitted when empty'} | ` +
        `${cell(fieldSchema.description)} |`)
    }
    lines.push('')
  }
  return lines.join('\n').trimEnd()
}

/** The generated block `event-types`: the catalog of schemas/event-types.ts. */
export function eventTypesBlock (): string {
  const lines = ['| `event_type` | Announces (committed in the same transaction) | Ids filled | `payload` |', '|---|---|---|---|']
  for (const [type, info] of Object.entries(EVENT_TYPES)) lines.push(`| \`${type}\` | ${cell(info.announces)} | ${info.ids} | ${cell(info.payload)} |`)
  return lines.join('\n')
}

const BLOCK = /(<!-- generated: ([\w-]+)[^>]*-->)\n[\s\S]*?\n?(<!-- end of generated: \2 -->)/g

/** `markdown` with each generated block rewritten from `doc`. */
export function withGeneratedBlocks (markdown: string, doc: OpenApiDocument): string {
  const blocks: Record<string, (doc: OpenApiDocument) => string> = { endpoints: endpointsBlock, resources: resourcesBlock, 'event-types': eventTypesBlock }
  return markdown.replace(BLOCK, (_whole, open: string, name: string, close: string) => {
    const render = blocks[name]
    if (render === undefined) throw new Error(`docs/reference.md: no generator for the block "${name}"`)
    return `${open}\n${render(doc)}\n${close}`
  })
}

/* c8 ignore start: the command line (npm run docs:reference); the test checks what it writes */
if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const { buildApp } = await import('../app.ts')
  const { loadConfig } = await import('../config.ts')
  // The embedded database: the document needs no data, only the routes.
  const app = await buildApp(loadConfig({ LOG_LEVEL: 'error', EVENTS_WAKEUP: 'off', PGLITE_DATA_DIR: 'memory://' }))
  await app.ready()
  const doc = app.swagger() as unknown as OpenApiDocument
  await app.close()
  const before = readFileSync(referencePath, 'utf8')
  const after = withGeneratedBlocks(before, doc)
  writeFileSync(referencePath, after)
  console.log(after === before ? 'docs/reference.md: up to date' : 'docs/reference.md: rewritten')
}
/* c8 ignore stop */
