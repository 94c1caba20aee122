import fp from 'fastify-plugin'
import { responseSchemas } from '../../schemas/api.js'
import { resourceSchemas } from '../../schemas/resources.js'

/** Registers every shared schema once, by $id, for the routes to reference. */
export default fp(async function schemasPlugin (app) {
  for (const schema of [...resourceSchemas, ...responseSchemas]) app.addSchema(schema)
}, { name: 'schemas' })
