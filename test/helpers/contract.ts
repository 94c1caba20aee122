import { Ajv2019 } from 'ajv/dist/2019.js'
import addFormats from 'ajv-formats'
import type { Test } from 'tap'
import { responseSchemas } from '../../schemas/api.ts'
import { resourceSchemas } from '../../schemas/resources.ts'

/*
 * Real responses are checked against the very TypeBox schemas the routes
 * declare, strictly: no extra field, every required one present, every
 * date-time a date-time.
 */
const ajv = new Ajv2019({ allErrors: true, strict: false })
addFormats.default(ajv)
for (const schema of [...resourceSchemas, ...responseSchemas]) ajv.addSchema(schema)

export function assertSchema (t: Test, schemaId: string, body: unknown, message = `body matches ${schemaId}`) {
  const validate = ajv.getSchema(schemaId)
  if (validate === undefined) throw new Error(`no schema ${schemaId}`)
  const valid = validate(body)
  t.ok(valid, message, valid ? {} : { errors: validate.errors })
}
