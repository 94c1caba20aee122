/*
 * Writes client/src/types.ts: the API's types as plain TypeScript, printed
 * from the server's TypeBox schemas (schemas/), the one source of the wire
 * shapes, with the page limit (schemas/api.ts) and the event types
 * (schemas/event-types.ts). The package then ships them with no dependency
 * on the server or on TypeBox. `npm run generate -w client`; a test fails
 * when the file is stale.
 */
import { writeFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { MAX_PAGE_LIMIT, responseSchemas } from '../../schemas/api.ts'
import { eventTypeNames } from '../../schemas/event-types.ts'
import { resourceSchemas } from '../../schemas/resources.ts'

type Schema = Record<string, any>

const comment = (text: string | undefined, indent: string) => text === undefined ? '' : `${indent}/** ${text.replaceAll('*/', '*\\/')} */\n`

function typeOf (schema: Schema, indent: string): string {
  if (typeof schema.$ref === 'string') return schema.$ref
  if ('const' in schema) return JSON.stringify(schema.const)
  if (Array.isArray(schema.anyOf)) return schema.anyOf.map((member: Schema) => typeOf(member, indent)).join(' | ')
  switch (schema.type) {
    case 'string': return 'string'
    case 'boolean': return 'boolean'
    case 'null': return 'null'
    case 'integer':
    case 'number': return 'number'
    case 'array': return `Array<${typeOf(schema.items, indent)}>`
    case 'object': {
      if (schema.patternProperties !== undefined) {
        const [value] = Object.values(schema.patternProperties) as Schema[]
        return `Record<string, ${typeOf(value!, indent)}>`
      }
      return objectBody(schema, indent)
    }
  }
  if (schema['~kind'] === 'Unknown') return 'unknown'
  /* c8 ignore start: a schema kind the API does not use (yet): add its TypeScript above */
  throw new Error(`no TypeScript for the schema ${JSON.stringify(schema)}`)
}
/* c8 ignore stop */

/** Fields typed more narrowly than their schema's `string`: the names, for completion (`string & {}` still takes any other). */
const NARROWED: Record<string, string> = {
  'Event.event_type': 'EventType'
}

function objectBody (schema: Schema, indent: string): string {
  const required = new Set<string>(schema.required)
  const inner = `${indent}  `
  const fields = Object.entries(schema.properties as Record<string, Schema>).map(([name, property]) => {
    const type = NARROWED[`${schema.$id}.${name}`] ?? typeOf(property, inner)
    return `${comment(property.description, inner)}${inner}${name}${required.has(name) ? '' : '?'}: ${type}`
  })
  return `{\n${fields.join('\n')}\n${indent}}`
}

export function generateTypes (): string {
  const declarations = [...resourceSchemas, ...responseSchemas].map((schema: Schema) =>
    `${comment(schema.description, '')}export interface ${schema.$id} ${objectBody(schema, '')}`)
  const constants = [
    `/** The largest \`limit\` a page may ask for. */\nexport const MAX_PAGE_LIMIT = ${MAX_PAGE_LIMIT}`,
    `/** The event types of the reference writer and the demo (schemas/event-types.ts, docs/reference.md); an orchestrator may write others. */\nexport type EventType = ${eventTypeNames.map((type) => JSON.stringify(type)).join(' | ')} | (string & {})`
  ]
  return `// Generated from the server's TypeBox schemas (schemas/) by client/scripts/generate-types.ts: do not edit.\n\n${[...constants, ...declarations].join('\n\n')}\n`
}

/* c8 ignore next 3: run as a script (npm run generate -w client); the tests call generateTypes */
if (process.argv[1] === fileURLToPath(import.meta.url)) {
  writeFileSync(new URL('../src/types.ts', import.meta.url), generateTypes())
}
