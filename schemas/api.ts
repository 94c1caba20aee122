import { Type, type TObject, type TSchema } from 'typebox'
import { ACCEPTS, invalidParameter } from '../errors.ts'

/* The request and response shapes of the routes of docs/reference.md, "Endpoints". */

/** Longest path parameter routed: a longer id answers 404 without a query. */
export const MAX_ID_LENGTH = 1024

/*
 * The parameters the routes validate: each schema carries the one sentence
 * a 400 about it says, however it is wrong (ACCEPTS, errors.ts); a check a
 * schema cannot make (a parse*, below) throws the same sentence.
 */

/**
 * An identifier, in a path or as a filter. Its format is the orchestrator's, so
 * any text is accepted except NUL, which no Postgres text value can hold;
 * an empty one is refused (`?run_id=` filters nothing, it is a mistake).
 */
const Id = (name: string, description: string) => Type.String({
  minLength: 1,
  pattern: '^[^\\u0000]+$',
  description,
  [ACCEPTS]: `${name} must be a non-empty id with no NUL character`
})

export const RunParams = Type.Object({ runID: Id('run_id', 'run_id of the run') })
export const TaskParams = Type.Object({ ...RunParams.properties, taskID: Id('task_id', 'task_id of the task, within the run') })
export const ThreadParams = Type.Object({ threadID: Id('thread_id', 'thread_id of the thread') })

/** An event id as a client writes it: digits, at most 16 of them (and within 2^53: parseEventId). */
const EVENT_ID_PATTERN = '^[0-9]{1,16}$'
const eventIdDigits = new RegExp(EVENT_ID_PATTERN)
const eventIdAccepts = (name: string) => `${name} must be an event_id: an integer from 0 to ${Number.MAX_SAFE_INTEGER}`

/** An event id given by a client in the query: a non-negative integer, as text. */
export const AfterEventId = Type.String({
  pattern: EVENT_ID_PATTERN,
  description: 'An event_id: the stream resumes after it (0 replays from the first event); below the history kept, 410 `cursor_expired`; beyond ' +
    'the last event_id ever handed out, 400',
  [ACCEPTS]: eventIdAccepts('after_event_id')
})

/** The event stream's request headers: an EventSource's resume point (checked by parseEventId: blank is no header). */
export const StreamHeaders = Type.Object({
  'last-event-id': Type.Optional(Type.String({
    description: 'The last event_id received; wins over after_event_id',
    [ACCEPTS]: eventIdAccepts('Last-Event-ID')
  }))
})

/**
 * A client's event id (after_event_id, or the Last-Event-ID header, as
 * `schema` says) as a number; anything but a non-negative integer event id
 * within 2^53 is the schema's 400.
 */
export function parseEventId (text: string, schema: TSchema): number {
  const value = eventIdDigits.test(text) ? Number(text) : Number.NaN
  if (!Number.isSafeInteger(value)) throw invalidParameter(schema)
  return value
}

/** Largest page a client may ask for with `limit`. */
export const MAX_PAGE_LIMIT = 1000

/**
 * A page size, as digits (at most MAX_PAGE_LIMIT: parseLimit). Not a number
 * type: Ajv's coercion turns "1e309" into Infinity and lets it pass as an
 * integer within any maximum.
 */
const PageLimit = Type.String({
  pattern: '^[1-9][0-9]{0,3}$',
  description: `Page size: 1 to ${MAX_PAGE_LIMIT}`,
  [ACCEPTS]: `limit must be an integer from 1 to ${MAX_PAGE_LIMIT}`
})

/** The `limit` query parameter as a number (undefined when absent); beyond MAX_PAGE_LIMIT is a 400. */
export function parseLimit (text: string | undefined): number | undefined {
  if (text === undefined) return undefined
  const limit = Number(text)
  if (limit > MAX_PAGE_LIMIT) throw invalidParameter(PageLimit)
  return limit
}

/** The opaque position of a list's next page (docs/reference.md, "Ordering and pages"; decoded in routes/api/runs.ts). */
/** A page key: where the next page of a keyset-paged list starts (the `cursor` parameter on the wire; not an event id). */
export const PageKeyParam = Type.String({
  minLength: 1,
  maxLength: 512,
  pattern: '^[A-Za-z0-9_-]+$',
  description: 'A page key (opaque): where the next page starts, from the previous page\'s Link: rel="next" URL',
  [ACCEPTS]: 'cursor must be the page key of a Link: rel="next" URL, unchanged'
})

/** Optional keyset paging (docs/reference.md, "Ordering and pages"); the next page's URL is in the `Link` header. */
export const PageQuery = Type.Object({
  limit: Type.Optional(PageLimit),
  cursor: Type.Optional(PageKeyParam)
})

const RunStatuses = Type.String({
  minLength: 1,
  maxLength: 4096,
  pattern: '^[^\\u0000]+$',
  description: 'Only runs in this status, or in any of several separated by commas (`status=running,failed`); the orchestrator\'s strings, matched exactly',
  [ACCEPTS]: 'status must name one or more run statuses, separated by commas'
})

/** Whether the run list keeps only runs waiting on an answer. */
const RunsBlocked = Type.Union([Type.Literal('true'), Type.Literal('false')], {
  description: '`true`: only runs with at least one task in status `blocked` (task_counts.blocked > 0); `false`: every run, as without it',
  [ACCEPTS]: 'blocked must be true or false'
})

/** The run list's query: paging, and filters on the run's status and on its having a blocked task. */
export const RunsQuery = Type.Object({
  ...PageQuery.properties,
  status: Type.Optional(RunStatuses),
  blocked: Type.Optional(RunsBlocked)
})

/** The statuses of `status=a,b` (empty items dropped, each once); undefined when absent; only commas is a 400. */
export function parseStatuses (text: string | undefined): string[] | undefined {
  if (text === undefined) return undefined
  const statuses = [...new Set(text.split(',').filter((status) => status !== ''))]
  if (statuses.length === 0) throw invalidParameter(RunStatuses)
  return statuses
}

export const Health = Type.Object({ status: Type.Literal('ok') }, { $id: 'Health', additionalProperties: false })

export const RunList = Type.Object({
  runs: Type.Array(Type.Ref('RunListItem'), { description: 'Newest first: created_at desc, then run_id desc' })
}, { $id: 'RunList', additionalProperties: false })

export const RunDetailEnvelope = Type.Object({ run: Type.Ref('RunDetail') }, { $id: 'RunDetailEnvelope', additionalProperties: false })

export const TaskDetailEnvelope = Type.Object({ task: Type.Ref('TaskDetail') }, { $id: 'TaskDetailEnvelope', additionalProperties: false })

export const TaskList = Type.Object({
  tasks: Type.Array(Type.Ref('Task'), { description: 'Ordered by created_at, then task_id' })
}, { $id: 'TaskList', additionalProperties: false })

export const BlockedTaskList = Type.Object({
  blocked: Type.Array(Type.Ref('BlockedTask'), { description: 'Ordered by created_at, then task_id' })
}, { $id: 'BlockedTaskList', additionalProperties: false })

export const ThreadDetailEnvelope = Type.Object({ thread: Type.Ref('ThreadDetail') }, { $id: 'ThreadDetailEnvelope', additionalProperties: false })

export const EventList = Type.Object({
  events: Type.Array(Type.Ref('Event'), { description: 'Ascending event_id' })
}, { $id: 'EventList', additionalProperties: false })

/** What a stream token opens: the filters it was asked for; none: every stream. */
export const StreamScope = Type.Object({
  run_id: Type.Optional(Type.String({ description: 'Only the streams of this run (its events, and its Durable Streams route)' })),
  thread_id: Type.Optional(Type.String({ description: 'Only the streams of this thread' }))
}, { $id: 'StreamScope', additionalProperties: false, description: 'A stream opens if every filter named here is the stream\'s own' })

export const StreamToken = Type.Object({
  token: Type.String({ description: 'Pass it as `stream_token` in the URL of /api/events/stream or a /api/streams route (or as a bearer token there)' }),
  expires_at: Type.String({ format: 'date-time', description: 'After it the token opens no new stream; a stream already open stays open' }),
  scope: Type.Ref('StreamScope')
}, { $id: 'StreamToken', additionalProperties: false })

export const SignIn = Type.Object({
  issuer: Type.String(),
  authorization_endpoint: Type.String(),
  token_endpoint: Type.String(),
  client_id: Type.String(),
  scope: Type.String()
}, { $id: 'SignIn', additionalProperties: false, description: 'The identity provider the web UI signs in with (authorization code with PKCE)' })

export const AuthInfo = Type.Object({
  required: Type.Boolean({ description: 'Whether /api routes need a token' }),
  sign_in: Type.Union([Type.Ref('SignIn'), Type.Null()])
}, { $id: 'AuthInfo', additionalProperties: false })

/** The response wrappers, registered like the resources so documents name them. */
export const responseSchemas: TObject[] = [
  Health, RunList, RunDetailEnvelope, TaskDetailEnvelope, TaskList, BlockedTaskList, ThreadDetailEnvelope, EventList, StreamScope, StreamToken, SignIn, AuthInfo
]

/**
 * The credentials a stream's URL may carry, for clients that cannot send
 * headers (a browser EventSource). Never logged nor traced.
 */
const streamCredentials = {
  stream_token: Type.Optional(Type.String({
    description: 'A stream token (GET /api/stream-token) whose scope covers this stream; only when authentication is on',
    [ACCEPTS]: 'stream_token must be one stream token, from GET /api/stream-token'
  })),
  access_token: Type.Optional(Type.String({
    description: 'A long-lived bearer token in the URL: refused unless AUTH_ALLOW_TOKEN_IN_URL is set (URLs land in browser history, proxy logs ' +
      'and Referer headers); use stream_token',
    [ACCEPTS]: 'access_token must be one bearer token'
  }))
}

const eventFilters = {
  run_id: Type.Optional(Id('run_id', 'Only events of this run')),
  thread_id: Type.Optional(Id('thread_id', 'Only events of this thread'))
}

export const StreamQuery = Type.Object({
  after_event_id: Type.Optional(AfterEventId),
  ...eventFilters,
  ...streamCredentials
})

export const DEFAULT_EVENTS_LIMIT = 100

/** The stream a stream token is for: the filters its streams will have (none: every stream). */
export const StreamTokenQuery = Type.Object({ ...eventFilters })

export const EventsQuery = Type.Object({
  after_event_id: Type.Optional(AfterEventId),
  ...eventFilters,
  limit: Type.Optional({ ...PageLimit, description: `Page size, ${DEFAULT_EVENTS_LIMIT} by default: 1 to ${MAX_PAGE_LIMIT}` })
})

// ---- Durable Streams (docs/reference.md, "Durable Streams"; routes/api/streams.ts) ------------

/** Where a Durable Streams read starts (parsed by events/durable/offsets.ts). */
export const StreamOffsetParam = Type.String({
  description: 'Where to read from: `-1` (the default) the oldest event kept, `now` the tail, or a `Stream-Next-Offset` this service sent (any replica\'s)',
  [ACCEPTS]: 'offset must be -1 (the oldest event kept), now (the tail), or a Stream-Next-Offset this service sent, and a live read must give one'
})

/** The Stream-Cursor value a Durable Streams client echoes as `cursor` (parsed by events/durable/offsets.ts). */
export const StreamCursorParam = Type.String({
  description: 'The last `Stream-Cursor` received (echoed so that caches collapse requests)',
  [ACCEPTS]: 'cursor must be a Stream-Cursor this service sent'
})

export const DurableStreamQuery = Type.Object({
  offset: Type.Optional(StreamOffsetParam),
  live: Type.Optional(Type.Union([Type.Literal('long-poll'), Type.Literal('sse')], {
    description: 'Absent: catch-up (a page, at once). `long-poll`: wait for events (at most DURABLE_STREAMS_LONG_POLL_MS). `sse`: a Server-Sent Events stream',
    [ACCEPTS]: 'live must be long-poll or sse'
  })),
  cursor: Type.Optional(StreamCursorParam),
  ...streamCredentials
})

/** An error response: always the envelope; `description` says when it happens. */
export const errorResponse = (description: string) => Type.Ref('ErrorEnvelope', { description })

/** The error responses every /api route can give, besides its own 404. */
export const commonErrors = {
  400: errorResponse('`bad_request`: a malformed parameter or URL, or a query parameter the route does not take'),
  401: errorResponse('`unauthorized`: a missing, unknown, expired or refused token (only when authentication is on); WWW-Authenticate says why'),
  421: errorResponse('`misdirected_request`: a Host header that names none of the service\'s names ' +
    '(localhost, 127.0.0.1, [::1], HOST\'s, ALLOWED_HOSTS\'), or none at all (only when authentication is off: DNS rebinding)'),
  500: errorResponse('`internal`: an unexpected failure (a bug)'),
  503: errorResponse('`unavailable`: the database is unreachable or too slow, or the service is overloaded or shutting down')
}

/** The errors of a route that takes an event id. */
export const eventIdErrors = {
  ...commonErrors,
  400: errorResponse('`bad_request`: a malformed parameter or URL, or an event id beyond the last event_id ever handed out'),
  410: errorResponse('`cursor_expired`: the cursor is older than the event history kept (EVENTS_RETENTION); refetch what you show, then resume ' +
    'from the X-Event-Cursor of that read')
}

export const notFoundErrors = { ...commonErrors, 404: errorResponse('`not_found`: no such run or thread') }

/** The errors of a task's read: its run, or the task within it, may not exist. */
export const taskNotFoundErrors = {
  ...commonErrors,
  404: errorResponse('`not_found`: no such run (`run not found`), or no such task in the run (`task not found`)')
}

// ---- HTTP caching (docs/reference.md, "HTTP caching"; plugins/app/http-cache.ts) -----------

/** The request header of a conditional read. */
export const ConditionalHeaders = Type.Object({
  'if-none-match': Type.Optional(Type.String({
    description: 'ETags of bodies the client holds, or `*`: 304 with no body while the body would be the same (weak tags compared weakly; a ' +
      'malformed field is ignored)',
    [ACCEPTS]: 'If-None-Match must be a list of ETags, or *'
  }))
})

/** What the Cache-Control of each kind of read says, for the docs. */
export const CACHE_CONTROL_DOCS = {
  state: '`no-cache` (with authentication on: `private, no-cache`): keep it, but revalidate (If-None-Match) before every use',
  events: 'A full page after an explicit after_event_id is final: `public, max-age=31536000, immutable`; any other page `public, max-age=5`. With ' +
    'authentication on, `private` instead of `public`, and Vary: Authorization'
} as const

/** A JSON read's 200: its body, and the headers that say where it was read and how it may be cached. */
export const readResponse = (ref: string, description: string, cacheControl: string) => ({
  ...Type.Ref(ref, { description }),
  headers: {
    'x-event-cursor': Type.String({
      description: 'The event stream position the body was read at: subscribe with after_event_id=<it> and nothing between is missed'
    }),
    etag: Type.String({ description: 'A strong tag of the body; send it in If-None-Match to revalidate' }),
    'cache-control': Type.String({ description: cacheControl })
  }
})

/** The 304 of a conditional read. */
export const notModified = {
  304: Type.Null({
    description: 'Not Modified: the body would be the one If-None-Match names. No body; ETag, Cache-Control and X-Event-Cursor (the current position) are sent'
  })
}
