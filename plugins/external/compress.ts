import compress from '@fastify/compress'
import fp from 'fastify-plugin'
import { constants } from 'node:zlib'
import { PROBES } from '../app/request-log.ts'

/**
 * gzip or brotli for responses of COMPRESS_MIN_BYTES or more. Never for
 * text/event-stream: the plugin's content-type rule excludes it, and the
 * stream is written past it anyway (a compressor would hold events back).
 */
export default fp(async function compressPlugin (app) {
  // Each route it handles gets its hooks. None takes a request body, so
  // none needs decompressing; the probes' 15-byte bodies are never
  // compressed.
  app.addHook('onRoute', (route) => {
    route.decompress ??= false
    if (PROBES.has(route.url)) route.compress ??= false
  })
  await app.register(compress, {
    global: true,
    threshold: app.config.COMPRESS_MIN_BYTES,
    encodings: ['br', 'gzip'],
    // Brotli's default (11) costs far more CPU than it saves on JSON this size.
    brotliOptions: { params: { [constants.BROTLI_PARAM_QUALITY]: 4 } },
    zlibOptions: { level: 6 }
  })
}, { name: 'compress', decorators: { fastify: ['config'] } })
