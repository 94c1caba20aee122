import cors from '@fastify/cors'
import fp from 'fastify-plugin'
import { listOf } from '../../config.ts'

/**
 * CORS for browser UIs served from other origins: off unless CORS_ORIGINS
 * lists them (comma-separated; `*` for any). The headers a UI needs to read
 * (X-Event-Cursor, Link, X-Request-Id, ETag, and the Durable Streams
 * headers of docs/reference.md, "Durable Streams") are exposed, and a UI may send
 * If-None-Match itself.
 */
export default fp(async function corsPlugin (app) {
  const origins = listOf(app.config.CORS_ORIGINS)
  if (origins.length === 0) return
  await app.register(cors, {
    origin: origins.includes('*') ? '*' : origins,
    methods: ['GET', 'HEAD', 'OPTIONS'],
    allowedHeaders: ['Authorization', 'Last-Event-ID', 'Content-Type', 'X-Request-Id', 'If-None-Match'],
    exposedHeaders: [
      'X-Event-Cursor', 'Link', 'X-Request-Id', 'Retry-After', 'ETag', 'Stream-Next-Offset', 'Stream-Up-To-Date', 'Stream-Cursor', 'Stream-Closed'
    ],
    maxAge: 600
  })
}, { name: 'cors', decorators: { fastify: ['config'] } })
