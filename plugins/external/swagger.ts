import swagger from '@fastify/swagger'
import swaggerUi from '@fastify/swagger-ui'
import fp from 'fastify-plugin'
import { authenticationOn } from '../../config.ts'
import pkg from '../../package.json' with { type: 'json' }

/**
 * The OpenAPI document, generated from the very route schemas that validate
 * and serialize: GET /openapi.json, and interactive docs at /docs (assets
 * served by this process, no CDN). Shared schemas become components named
 * by their $id (Run, Task, ...).
 */
export default fp(async function swaggerPlugin (app) {
  const authEnabled = authenticationOn(app.config)
  await app.register(swagger, {
    openapi: {
      openapi: '3.0.3',
      info: {
        title: 'Orchestration control plane API',
        description: 'The read-only HTTP/JSON API and live event stream over the state of an orchestration control plane: runs, tasks, blocked ' +
          'tasks, threads, messages, artifacts and events. Every read carries X-Event-Cursor, the event stream position it was read at.',
        version: pkg.version
      },
      tags: [
        { name: 'runs', description: 'Runs, their tasks and blocked tasks' },
        { name: 'threads', description: 'Threads and their messages' },
        { name: 'events', description: 'The event stream' },
        { name: 'streams', description: 'The event log under the Durable Streams protocol' },
        { name: 'auth', description: 'How to authenticate; stream tokens' },
        { name: 'operations', description: 'Health, readiness and metrics' }
      ],
      components: {
        securitySchemes: {
          bearerToken: {
            type: 'http',
            scheme: 'bearer',
            description: 'One of API_TOKENS, or a JWT of an identity provider of AUTH_ISSUERS; required on /api (but /api/auth) and /metrics when ' +
              'authentication is on. The stream routes also take a stream token (GET /api/stream-token), here or as ?stream_token=.'
          }
        }
      },
      ...(authEnabled ? { security: [{ bearerToken: [] }] } : {})
    },
    refResolver: {
      // Components named after the schemas' $id (every shared schema has one), not def-0, def-1...
      buildLocalReference: (json) => String(json.$id)
    }
  })
  await app.register(swaggerUi, {
    routePrefix: '/docs',
    // No staticCSP: /docs carries the pages' policy (plugins/external/helmet.ts), which allows swagger-ui's inline style by its hash.
    uiConfig: { docExpansion: 'list', deepLinking: true, validatorUrl: null }
  })
  app.get('/openapi.json', { schema: { hide: true } }, async () => app.swagger())
}, { name: 'swagger', decorators: { fastify: ['config'] } })
