import type { FastifyBaseLogger, FastifyReply, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { randomUUID } from 'node:crypto'
import type { IncomingMessage } from 'node:http'
import { eventsSent } from '../../events/index.ts'
import { callerOf } from './auth/index.ts'
import { withoutCredentials } from './auth/url-credentials.ts'
import type { Bindings, ChildLoggerOptions, Level, LevelWithSilentOrString, LogFn, Logger } from 'pino'

/** An incoming X-Request-Id is honoured when it looks like an id; otherwise one is made. */
const REQUEST_ID = /^[A-Za-z0-9._:@/+=-]{1,128}$/

/**
 * The ids this process makes: a random version 4 UUID whose last group
 * counts up. randomUUID() for each request made about 460 bytes of
 * garbage (a crowd of long-polls answered every 200 ms made hundreds of
 * megabytes a minute); this makes one short string. Unique within the
 * process by the counter and across replicas by the 80 random bits before
 * it; still a well-formed UUID, as docs/operating.md says.
 */
const idPrefix = randomUUID().slice(0, 24)
let idCount = Number.parseInt(randomUUID().slice(24, 36), 16)
const ID_GROUP = 2 ** 48

/** Fastify's genReqId: the caller's X-Request-Id, or a fresh UUID. */
export function requestIdOf (request: IncomingMessage): string {
  const header = request.headers['x-request-id']
  if (typeof header === 'string' && REQUEST_ID.test(header)) return header
  idCount = (idCount + 1) % ID_GROUP
  return idPrefix + idCount.toString(16).padStart(12, '0')
}

/** The URL as logged: a token given in the query (a stream's stream_token or access_token) never reaches the logs. */
export const loggableUrl = withoutCredentials

/** How logs and metrics name the route of a request that matched none. */
export const UNMATCHED = 'unmatched'

/** The route a request matched, as its pattern (`/api/runs/:runID`), or `unmatched`: for logs. */
export const routeOf = (request: FastifyRequest) => request.routeOptions.url ?? UNMATCHED

/**
 * A request's logger that makes its pino child only when a line goes
 * through it: the child serializes its bindings (the request id) when it
 * is made, about 0.7 µs, and at the default level most requests write no
 * line at all. A call at a level that is off returns without making it.
 */
interface RequestLogger extends Pick<FastifyBaseLogger, Level | 'silent'> {}
class RequestLogger implements FastifyBaseLogger {
  #made: FastifyBaseLogger | undefined
  private readonly parent: FastifyBaseLogger
  private readonly bindings: Bindings
  private readonly options: ChildLoggerOptions

  constructor (parent: FastifyBaseLogger, bindings: Bindings, options: ChildLoggerOptions) {
    this.parent = parent
    this.bindings = bindings
    this.options = options
  }

  made (): FastifyBaseLogger {
    return (this.#made ??= this.parent.child(this.bindings, this.options))
  }

  enabled (level: string): boolean {
    return ((this.#made ?? this.parent) as Logger).isLevelEnabled(level)
  }

  get level (): LevelWithSilentOrString { return (this.#made ?? this.parent).level }
  set level (level: LevelWithSilentOrString) { this.made().level = level }
  isLevelEnabled (level: string): boolean { return this.enabled(level) }
  child (bindings: Bindings, options?: ChildLoggerOptions): FastifyBaseLogger { return this.made().child(bindings, options) }
}
// The level methods, on the prototype: nothing is made per request.
for (const level of ['fatal', 'error', 'warn', 'info', 'debug', 'trace'] as const) {
  RequestLogger.prototype[level] = function (this: RequestLogger, ...args: Parameters<LogFn>) {
    if (this.enabled(level)) this.made()[level](...args)
  } as LogFn
}
RequestLogger.prototype.silent = () => {}

/** Fastify's childLoggerFactory: each request's logger, made when first used (a route's own log level makes it at once). */
export function requestLogger (logger: FastifyBaseLogger, bindings: Bindings, options: ChildLoggerOptions): FastifyBaseLogger {
  return options.level === undefined ? new RequestLogger(logger, bindings, options) : logger.child(bindings, options)
}

/**
 * Liveness and readiness probes: polled every few seconds by orchestrators
 * and load balancers, they are logged at debug, so that they neither drown
 * the request log nor cost a log write each.
 */
export const PROBES = new Set(['/health', '/ready'])

/** Whether `log` writes lines of `level` (Fastify's logger is pino's, whose type Fastify narrows). */
const writes = (log: FastifyBaseLogger, level: 'info' | 'debug') => (log as Logger).isLevelEnabled(level)

/** A stream route's (the event stream's, a Durable Streams route's): its line is written when its connection closes. */
const isStreamRoute = (request: FastifyRequest) => request.routeOptions.config.streamScope !== undefined

/** The request's line: what was asked, by whom, and how it was answered. */
function logRequest (request: FastifyRequest, reply: FastifyReply, level: 'info' | 'debug', stream?: { eventsSent: number | undefined, hungUp: boolean }) {
  const { principal } = request
  request.log[level]({
    method: request.method,
    url: loggableUrl(request.url),
    route: routeOf(request),
    statusCode: reply.statusCode,
    responseTimeMs: Math.round(reply.elapsedTime * 100) / 100,
    ...(principal === undefined ? {} : { principal: callerOf(principal), credential: principal.kind }),
    ...stream
  }, 'request')
}

/**
 * One log line per request, when its response is done, carrying the
 * request id (echoed in X-Request-Id) and, with authentication on, who
 * made it (`principal`: a static token's name, a JWT's issuer and subject,
 * or whoever asked for the stream token; `credential`: which kind). A
 * stream's and a long-poll's line is written when its connection closes,
 * whoever ends it (Fastify's onResponse never runs when a client hangs
 * up), with `eventsSent` and `hungUp` (the connection closed before the
 * service ended the response: the client left, or was cut off); its
 * `responseTimeMs` is then how long it lasted. Headers are never logged,
 * so neither is an Authorization header. Probes are logged at debug. At a
 * level that writes no request line (warn and above), no hook runs after
 * the response: the line is not even built. Callback hooks, not async
 * ones: no promise per request.
 */
export default fp(async function requestLogPlugin (app) {
  const logged = writes(app.log, 'info')
  app.addHook('onRequest', (request, reply, done) => {
    reply.header('x-request-id', request.id)
    if (logged && isStreamRoute(request)) {
      reply.raw.once('close', () => {
        if (writes(request.log, 'info')) logRequest(request, reply, 'info', { eventsSent: eventsSent(reply.raw), hungUp: !reply.raw.writableFinished })
      })
    }
    done()
  })
  if (!logged) return
  app.addHook('onResponse', (request, reply, done) => {
    const level = PROBES.has(routeOf(request)) ? 'debug' : 'info'
    if (!isStreamRoute(request) && writes(request.log, level)) logRequest(request, reply, level)
    done()
  })
}, { name: 'request-log' })
