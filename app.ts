import autoload from '@fastify/autoload'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import Fastify, { LogController, type FastifyInstance, type FastifyPluginCallback, type FastifyReply, type FastifyServerOptions } from 'fastify'
import { dirname, join } from 'node:path'
import { pino } from 'pino'
import { fileURLToPath } from 'node:url'
import { trustedProxiesOf, type Config } from './config.ts'
import { ACCEPTS, badRequest, toApiError } from './errors.ts'
import { NO_STORE } from './plugins/app/http-cache.ts'
import { countRequests } from './plugins/request-metrics.ts'
import { requestIdOf, requestLogger } from './plugins/app/request-log.ts'
import { MAX_ID_LENGTH } from './schemas/api.ts'

declare module 'fastify' {
  interface FastifyInstance {
    /** The validated configuration (config.ts). */
    config: Config
  }
}

const here = dirname(fileURLToPath(import.meta.url))

// Run from the TypeScript sources (tests, `npm run dev`), autoload must be
// told to load .ts files: it cannot see a loader given with --import.
if (import.meta.url.endsWith('.ts')) process.env.FASTIFY_AUTOLOAD_TYPESCRIPT ??= '1'

const malformedRequestBody = JSON.stringify(badRequest('malformed HTTP request').toBody())

/** How long a plugin may take to start, besides its connection checks, before the start fails naming it. */
export const PLUGIN_TIMEOUT_MS = 120_000

/**
 * A plugin's whole allowance: the database plugin may check two servers at
 * start (is it a hot standby?), each check bounded by DB_CONNECT_TIMEOUT_MS,
 * which may be set past PLUGIN_TIMEOUT_MS alone; they answer first.
 */
export const pluginTimeoutOf = (config: Pick<Config, 'DB_CONNECT_TIMEOUT_MS'>) => PLUGIN_TIMEOUT_MS + 2 * config.DB_CONNECT_TIMEOUT_MS

export interface BuildOptions {
  logger?: FastifyServerOptions['logger']
  /** @fastify/otel's plugin, when tracing is on (tracing.ts). */
  tracing?: FastifyPluginCallback
}

/** pino: JSON lines, or readable lines on a terminal (LOG_FORMAT). */
function loggerFor (config: Config): FastifyServerOptions['logger'] {
  const pretty = config.LOG_FORMAT === 'pretty' || (config.LOG_FORMAT === 'auto' && process.stdout.isTTY === true)
  return {
    level: config.LOG_LEVEL,
    // Belt and braces: request logging never includes headers anyway.
    redact: ['req.headers.authorization', 'req.headers.cookie'],
    ...(pretty
      ? { transport: { target: 'pino-pretty', options: { translateTime: 'SYS:HH:MM:ss.l', ignore: 'pid,hostname' } } }
      // Asynchronous writes: under load, lines queued while a write is in
      // flight go out together instead of one blocking write each. pino
      // flushes what is queued when the process exits.
      : { stream: pino.destination({ dest: 1, sync: false }) })
  }
}

/**
 * The application: Fastify with the plugins of plugins/external (swagger,
 * CORS, compression...) and plugins/app (database, schemas, errors, event
 * stream...), then the routes of routes/, all autoloaded.
 */
export async function buildApp (config: Config, options: BuildOptions = {}): Promise<FastifyInstance> {
  const app = Fastify({
    logger: options.logger ?? loggerFor(config),
    // One line per request, written by plugins/app/request-log.ts.
    logController: new LogController({ disableRequestLogging: true }),
    genReqId: requestIdOf,
    // request.ip: the peer, or from TRUSTED_PROXIES, the client their X-Forwarded-For names (the limits per caller count it).
    trustProxy: trustedProxiesOf(config),
    childLoggerFactory: requestLogger,
    // Answered by plugins/app/shutdown.ts, with the envelope.
    return503OnClosing: false,
    // Fastify's default of 10 s for a plugin to start is less than the
    // embedded database's start, or two connection checks, can take on a
    // busy host: each plugin's waits have limits of their own
    // (DB_CONNECT_TIMEOUT_MS), and this one only names a plugin that hangs.
    pluginTimeout: pluginTimeoutOf(config),
    // Slow or silent clients: the whole request must arrive within
    // REQUEST_TIMEOUT_MS, and a socket silent both ways for
    // CONNECTION_TIMEOUT_MS is closed (an idle event stream writes a
    // keep-alive more often than that).
    requestTimeout: config.REQUEST_TIMEOUT_MS,
    connectionTimeout: config.CONNECTION_TIMEOUT_MS,
    routerOptions: {
      maxParamLength: MAX_ID_LENGTH,
      ignoreTrailingSlash: true
    },
    // A parameter's sentence for its 400s: an annotation, which Ajv's strict mode must be told of.
    ajv: { customOptions: { keywords: [ACCEPTS] } },
    // Errors raised before routing (bad percent-encoding, invalid UTF-8)
    // get the envelope too.
    frameworkErrors (error, _request, reply) {
      const apiError = toApiError(error)
      ;(reply as FastifyReply).code(apiError.statusCode).header('cache-control', NO_STORE).send(apiError.toBody())
    },
    // Errors of the HTTP parser itself (bad request line, headers too large).
    clientErrorHandler (error, socket) {
      if (!socket.writable || (error as NodeJS.ErrnoException).code === 'ECONNRESET') {
        socket.destroy()
        return
      }
      // Too large headers or URL included: a 400 with the envelope, like any malformed request.
      socket.end(`HTTP/1.1 400 Bad Request\r\nContent-Type: application/json; charset=utf-8\r\nCache-Control: ${NO_STORE}\r\n` +
        `Content-Length: ${Buffer.byteLength(malformedRequestBody)}\r\nConnection: close\r\n\r\n${malformedRequestBody}`)
    }
  }).withTypeProvider<TypeBoxTypeProvider>()

  app.decorate('config', config)
  // Before every route, so that each request's span is named by its route.
  if (options.tracing !== undefined) await app.register(options.tracing)
  await app.register(countRequests)
  // Third-party plugins first (they see every route added after them),
  // then the application's own, then the routes.
  await app.register(autoload, { dir: join(here, 'plugins/external') })
  await app.register(autoload, { dir: join(here, 'plugins/app') })
  await app.register(autoload, { dir: join(here, 'routes') })
  return app
}
