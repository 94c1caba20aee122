/*
 * Every error a client can see (docs/reference.md, "Errors"), and the one mapping
 * from anything thrown to one of them. Bodies are always
 * {error: {code, message}}; messages never carry a stack, SQL or a secret.
 */

export const ErrorCodes = {
  not_found: 404,
  bad_request: 400,
  unauthorized: 401,
  unavailable: 503,
  cursor_expired: 410,
  method_not_allowed: 405,
  too_many_requests: 429,
  misdirected_request: 421,
  internal: 500
} as const

export type ErrorCode = keyof typeof ErrorCodes

export interface ErrorBody {
  error: { code: ErrorCode, message: string }
}

export class ApiError extends Error {
  override name = 'ApiError'
  readonly code: ErrorCode
  readonly statusCode: number

  constructor (code: ErrorCode, message: string, statusCode: number = ErrorCodes[code]) {
    super(message)
    this.code = code
    this.statusCode = statusCode
  }

  toBody (): ErrorBody {
    return { error: { code: this.code, message: this.message } }
  }
}

/**
 * A request without a credential this service accepts (docs/reference.md,
 * "Authentication"). `challenge` is its WWW-Authenticate header (RFC 6750):
 * `error="invalid_token"` and the reason when a token was presented.
 */
export class UnauthorizedError extends ApiError {
  readonly challenge: string
  constructor (message: string, tokenPresented: boolean) {
    super('unauthorized', message)
    // A quoted-string: the messages are plain words, but a quote or backslash must never end it early.
    this.challenge = tokenPresented
      ? `Bearer realm="ocp-api", error="invalid_token", error_description="${message.replace(/["\\]/g, "'")}"`
      : 'Bearer realm="ocp-api"'
  }
}

/** An identity provider that could not be reached to check a token: worth retrying. */
export const identityProviderUnavailable = (issuer: string) => new ApiError('unavailable', `the identity provider ${issuer} could not be reached ` +
  'to check the token; try again shortly')

/** What the limits on open connections count (events/limits.ts): event streams (SSE, on either route) and Durable Streams long-polls. */
export type LimitedKind = 'stream' | 'long-poll'

/** Which limit refused: the instance's (SSE_MAX_STREAMS, DURABLE_STREAMS_MAX_LONG_POLLS), or the caller's share of it (the *_PER_CALLER settings). */
export type LimitReason = 'instance' | 'caller'

const LIMITED = {
  stream: { what: 'event streams', setting: 'SSE_MAX_STREAMS_PER_CALLER' },
  'long-poll': { what: 'long-polls', setting: 'DURABLE_STREAMS_MAX_LONG_POLLS_PER_CALLER' }
} as const

/**
 * A stream or long-poll refused at a limit, before any byte is sent: at
 * the instance's, 503 `unavailable` (another instance may have room: a
 * balancer retries there); at the caller's share, 429 `too_many_requests`
 * (its own streams or long-polls hold it). Either way the client comes
 * back after Retry-After, or, on a stream, its `retry:`.
 */
export class LimitRefusal extends ApiError {
  readonly kind: LimitedKind
  readonly reason: LimitReason

  constructor (kind: LimitedKind, reason: LimitReason, limit: number) {
    const { what, setting } = LIMITED[kind]
    super(reason === 'instance' ? 'unavailable' : 'too_many_requests', reason === 'instance'
      ? `this instance already serves ${limit} ${what}, retry shortly or on another instance`
      : `this caller already holds ${limit} ${what} on this instance (its share, ${setting}): end one, or retry shortly`)
    this.kind = kind
    this.reason = reason
  }
}

export const notFound = (what: string) => new ApiError('not_found', `${what} not found`)
/** Load shedding (plugins/external/under-pressure.ts), and any 503 from the framework. */
export const overloaded = new ApiError('unavailable', 'the service is overloaded, try again shortly')
export const shuttingDown = new ApiError('unavailable', 'the service is shutting down, retry on another instance')
export const badRequest = (message: string) => new ApiError('bad_request', message)

/**
 * The JSON Schema annotation (registered with Ajv in app.ts) that every
 * parameter a route validates carries (schemas/api.ts): the one sentence a
 * 400 says whenever that parameter is wrong, however it is wrong: its name
 * and what it accepts. So limit=0, limit=abc and limit given twice read
 * alike, and never in the validator's words.
 */
export const ACCEPTS = 'x-accepts'

/** A parameter that is wrong: the sentence of its schema (ACCEPTS). */
export const invalidParameter = (schema: object) => badRequest((schema as Record<string, string>)[ACCEPTS]!)

/** The longest part of a client's parameter name that a message repeats. */
const MAX_NAME_SHOWN = 100

/**
 * A query parameter the route does not take (a misspelt filter would
 * otherwise widen the answer silently): named, with what the route takes.
 */
export function unknownParameter (name: string, accepted: readonly string[]): ApiError {
  const shown = JSON.stringify(name.length > MAX_NAME_SHOWN ? `${name.slice(0, MAX_NAME_SHOWN)}…` : name)
  return badRequest(accepted.length === 0
    ? `unknown query parameter ${shown}: this route takes no query parameters`
    : `unknown query parameter ${shown}: this route accepts ${accepted.join(', ')}`)
}

/**
 * A request whose Host is not one this service answers to while
 * authentication is off (plugins/app/allowed-hosts.ts): a page that
 * rebinds its own name to this address (DNS rebinding) reaches it so.
 */
export const hostNotAllowed = (host: string | undefined) => new ApiError('misdirected_request', host === undefined
  ? 'a request without a Host header is not answered while authentication is off'
  : `the Host ${JSON.stringify(host.length > MAX_NAME_SHOWN ? `${host.slice(0, MAX_NAME_SHOWN)}…` : host)} is not one this service answers to ` +
    'while authentication is off: the operator may add it to ALLOWED_HOSTS')

/** A write to a path of the read-only API: `allowed` is what the path serves (none when no route serves it). */
export function methodNotAllowed (method: string, allowed: readonly string[]): ApiError {
  return new ApiError('method_not_allowed', allowed.length === 0
    ? `${method} is not allowed: the API is read-only, and no route serves this path`
    : `${method} is not allowed: the API is read-only (this path answers ${allowed.join(', ')}); the orchestrator writes the state it serves`)
}

/**
 * The errors of a client's position that cannot be served as it stands
 * (events/reader.ts, assertPositionKept), each in the words of what the
 * client sent: an event id (eventIdErrorsNamed) or a Durable Streams
 * offset (offsetErrors).
 */
export interface PositionErrors {
  /** Below the history's floor (docs/reference.md, "Event history"): 410. */
  expired: (position: number, floor: number) => ApiError
  /**
   * Inside a range of ids skipped after a failover or a crash (after
   * `after`, through `through`): no event of the database has one, so the
   * events it saw are gone. 410, like an expired one.
   */
  lost: (position: number, after: number, through: number) => ApiError
  /**
   * Read while the database may have lost commits that its keeper has not recorded yet
   * (a standby just promoted, a server restarted after a crash): 503.
   */
  lossPending: () => ApiError
  /**
   * Above every id the event log has handed out (Kubernetes' "too large
   * resource version"): no event ever had it, so waiting for one would be
   * waiting forever. 400.
   */
  beyond: (position: number, last: number) => ApiError
}

/** An event id's `beyond` error: it keeps the name, the position and the last id it was built from. */
export class EventIdBeyondError extends ApiError {
  readonly eventIdName: string
  readonly position: number
  readonly last: number

  constructor (eventIdName: string, position: number, last: number) {
    super('bad_request', `${eventIdName} ${position} is beyond the last event_id handed out (${last}): resume from an event_id or X-Event-Cursor this ` +
      'service sent')
    this.eventIdName = eventIdName
    this.position = position
    this.last = last
  }
}

const lossPending = (name: string) => new ApiError('unavailable',
  `the database was just promoted or restarted, and whether ${name} names an event it lost is not known yet: retry in a moment`)

/** The errors of an event id named `name` (after_event_id, Last-Event-ID). */
export const eventIdErrorsNamed = (name: string): PositionErrors => ({
  expired: (position, floor) => new ApiError('cursor_expired',
    `${name} ${position} is older than the event history kept (events up to ${floor} are gone): refetch what you show, then resume from the ` +
      'X-Event-Cursor of that read'),
  lost: (position, after, through) => new ApiError('cursor_expired',
    `${name} ${position} may name an event the database lost in a failover or a crash (it has no event after ${after} up to ${through}): ` +
      'refetch what you show, then resume from the X-Event-Cursor of that read'),
  lossPending: () => lossPending(name),
  beyond: (position, last) => new EventIdBeyondError(name, position, last)
})

/**
 * The errors of a Durable Streams offset (events/durable/), in the
 * protocol's words: offsets are opaque (`encode` writes one), and a client
 * starts again from -1.
 */
export const offsetErrors = (encode: (position: number) => string): PositionErrors => ({
  expired: () => new ApiError('cursor_expired',
    'offset is older than the event history kept (events before it are gone, EVENTS_RETENTION): read again from offset=-1'),
  lost: () => new ApiError('cursor_expired', 'offset may name an event the database lost in a failover or a crash ' +
    '(no event of it lies between that offset and the next one handed out): read again from offset=-1'),
  lossPending: () => lossPending('offset'),
  beyond: (position, last) => badRequest(`offset ${encode(position)} is beyond the last offset handed out (${encode(last)}): ` +
    'pass -1, now, or a Stream-Next-Offset this service sent')
})

/** SQLSTATE classes and codes that mean "the database cannot serve now", not "the request is wrong". */
const unavailableSqlStates = [
  /^08/, // connection exception
  /^53/, // insufficient resources (too many connections, out of memory, disk full)
  /^57P0[1-4]$/, // admin/crash shutdown, cannot connect now, database dropped
  /^57014$/, // query canceled: our statement timeout fired
  /^40001$/, // serialization failure
  /^40P01$/, // deadlock detected
  /^55P03$/ // lock not available
]

/** SQLSTATEs caused by the input itself (e.g. a byte Postgres text cannot hold). */
const badInputSqlStates = [/^22021$/, /^22P05$/, /^2200[CDE]$/]

const networkErrorCodes = new Set(['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH', 'ENETUNREACH', 'ECONNABORTED'])

/** pg's own messages when the pool or a connection gives up (they carry no code). */
const poolFailureMessages = [
  /timeout exceeded when trying to connect/i,
  /Connection terminated/i,
  /Client has encountered a connection error/i,
  /Cannot use a pool after calling end/i,
  /connection timeout/i
]

/** Errors Fastify raises before a route runs, with the answer each deserves. */
const frameworkErrors: Record<string, ApiError> = {
  FST_ERR_BAD_URL: badRequest('the URL is malformed: invalid percent-encoding or UTF-8'),
  // Longer than any id routed (MAX_ID_LENGTH): no such resource exists.
  FST_ERR_MAX_PARAM_LENGTH: notFound('resource')
}

interface ErrorLike {
  code?: unknown
  message?: unknown
  statusCode?: unknown
  /** Set by Fastify on a schema's refusal: Ajv's errors, and which part of the request failed (querystring, params, headers). */
  validation?: Array<{ instancePath?: string }>
  validationContext?: string
}

/** A route's request schemas by part (Fastify's routeOptions.schema: querystring, params, headers...). */
export type RequestSchemas = Record<string, unknown>

/**
 * The sentence of the parameter a schema refused: its schema's (ACCEPTS),
 * found by the part of the request and the parameter's name. A parameter
 * without one (none, test/bad-input.test.ts makes sure) gets a bare one.
 */
function refusedParameterMessage (err: ErrorLike, schemas: RequestSchemas = {}): string {
  const name = err.validation?.[0]?.instancePath?.split('/')[1] ?? ''
  const part = schemas[err.validationContext ?? ''] as { properties?: Record<string, Record<string, unknown>> } | undefined
  const sentence = part?.properties?.[name]?.[ACCEPTS]
  return typeof sentence === 'string' ? sentence : 'a parameter of the request is not valid'
}

export function isDatabaseUnavailable (err: unknown): boolean {
  if (typeof err !== 'object' || err === null) return false
  const { code, message } = err as ErrorLike
  if (typeof code === 'string') {
    if (networkErrorCodes.has(code)) return true
    if (unavailableSqlStates.some((state) => state.test(code))) return true
  }
  return typeof message === 'string' && poolFailureMessages.some((pattern) => pattern.test(message))
}

/**
 * Maps anything thrown while serving a request to the error the client sees.
 * Framework errors keep their 4xx status; a schema's refusal of a parameter
 * says that parameter's sentence (ACCEPTS), found in the route's `schemas`;
 * database trouble becomes 503; everything unforeseen becomes a bare 500
 * `internal`.
 */
export function toApiError (err: unknown, schemas?: RequestSchemas): ApiError {
  if (err instanceof ApiError) return err
  const frameworkError = frameworkErrors[(err as ErrorLike)?.code as string]
  if (frameworkError !== undefined) return frameworkError
  if (isDatabaseUnavailable(err)) return new ApiError('unavailable', 'the database is unavailable, try again shortly')
  const { code, message, statusCode, validation } = (typeof err === 'object' && err !== null ? err : {}) as ErrorLike
  if (typeof code === 'string' && badInputSqlStates.some((state) => state.test(code))) {
    return badRequest('the request contains characters the database cannot store')
  }
  if (validation !== undefined) return badRequest(refusedParameterMessage(err as ErrorLike, schemas))
  if (typeof statusCode === 'number' && statusCode >= 400 && statusCode < 500) {
    if (statusCode === 404) return notFound('resource')
    // Framework messages describe the request, never the server.
    const text = typeof message === 'string' && message !== '' && typeof code === 'string'
      ? message
      : 'bad request'
    return new ApiError(statusCode === 401 ? 'unauthorized' : 'bad_request', text, statusCode)
  }
  if (typeof statusCode === 'number' && statusCode === 503) return overloaded
  return new ApiError('internal', 'internal server error')
}
