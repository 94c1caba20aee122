import fp from 'fastify-plugin'
import { responseSchemas } from '../../schemas/api.ts'
import { resourceSchemas } from '../../schemas/resources.ts'

/** Registers every shared schema once, by $id, for the routes to reference. */
export default fp(async function schemasPlugin (app) {
  for (const schema of [...resourceSchemas, ...responseSchemas]) app.addSchema(schema)
}, { name: 'schemas' })
