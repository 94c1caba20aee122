import { Type, type TObject } from 'typebox'
import { badRequest } from '../errors.js'

/* The request and response shapes of the routes of SPEC section 4. */

/** Longest path parameter routed: a longer id answers 404 without a query. */
export const MAX_ID_LENGTH = 1024

/**
 * An identifier in a path. SPEC leaves the format open, so any text is
 * accepted except NUL, which no Postgres text value can hold.
 */
const Id = (description: string) => Type.String({ minLength: 1, pattern: '^[^\\u0000]+$', description })

export const RunParams = Type.Object({ runID: Id('run_id of the run') })
export const ThreadParams = Type.Object({ threadID: Id('thread_id of the thread') })

/** An event id as a client writes it: digits, at most 16 of them. */
const EVENT_CURSOR_PATTERN = '^[0-9]{1,16}$'
const eventCursorDigits = new RegExp(EVENT_CURSOR_PATTERN)

/**
 * A client's cursor (after_event_id, or the Last-Event-ID header, which no
 * schema checks) as a number; anything but a non-negative integer event id
 * within 2^53 is a 400 naming the parameter.
 */
export function parseCursor (text: string, name: string): number {
  const value = eventCursorDigits.test(text) ? Number(text) : Number.NaN
  if (!Number.isSafeInteger(value)) throw badRequest(`${name} must be a non-negative integer event_id`)
  return value
}

/** Largest page a client may ask for with `limit`. */
export const MAX_PAGE_LIMIT = 1000

/**
 * A page size, as digits. Not a number type: Ajv's coercion turns "1e309"
 * into Infinity and lets it pass as an integer within any maximum.
 */
const Limit = (description: string) => Type.String({ pattern: '^[1-9][0-9]{0,3}$', description: `${description}: 1 to ${MAX_PAGE_LIMIT}` })

/** The `limit` query parameter as a number (undefined when absent); beyond MAX_PAGE_LIMIT is a 400. */
export function parseLimit (text: string | undefined): number | undefined {
  if (text === undefined) return undefined
  const limit = Number(text)
  if (limit > MAX_PAGE_LIMIT) throw badRequest(`limit must be between 1 and ${MAX_PAGE_LIMIT}`)
  return limit
}

/** Optional keyset paging (CONTRACT section 3); the next page's URL is in the `Link` header. */
export const PageQuery = Type.Object({
  limit: Type.Optional(Limit('Page size')),
  cursor: Type.Optional(Type.String({
    minLength: 1,
    maxLength: 512,
    pattern: '^[A-Za-z0-9_-]+$',
    description: 'Opaque position from the previous page\'s Link: rel="next" URL'
  }))
})

/** The run list's query: paging, and a filter on the run's status. */
export const RunsQuery = Type.Object({
  ...PageQuery.properties,
  status: Type.Optional(Type.String({
    minLength: 1,
    maxLength: 4096,
    pattern: '^[^\\u0000]+$',
    description: 'Only runs in this status, or in any of several separated by commas (`status=running,blocked`); the orchestrator\'s strings, matched exactly'
  }))
})

/** The statuses of `status=a,b` (empty items dropped, each once); undefined when absent; only commas is a 400. */
export function parseStatuses (text: string | undefined): string[] | undefined {
  if (text === undefined) return undefined
  const statuses = [...new Set(text.split(',').filter((status) => status !== ''))]
  if (statuses.length === 0) throw badRequest('status must name at least one status')
  return statuses
}

export const Health = Type.Object({ status: Type.Literal('ok') }, { $id: 'Health', additionalProperties: false })

export const RunList = Type.Object({
  runs: Type.Array(Type.Ref('RunListItem'), { description: 'Newest first: created_at desc, then run_id desc' })
}, { $id: 'RunList', additionalProperties: false })

export const RunDetailEnvelope = Type.Object({ run: Type.Ref('RunDetail') }, { $id: 'RunDetailEnvelope', additionalProperties: false })

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

/** The response wrappers, registered like the resources so documents name them. */
export const responseSchemas: TObject[] = [Health, RunList, RunDetailEnvelope, TaskList, BlockedTaskList, ThreadDetailEnvelope, EventList]

/** An event id given by a client: a non-negative integer, as text. */
export const EventCursor = Type.String({
  pattern: EVENT_CURSOR_PATTERN,
  description: 'An event_id: the stream resumes after it (0 replays from the first event); below the history kept, 410 `cursor_expired`'
})

const eventFilters = {
  run_id: Type.Optional(Type.String({ pattern: '^[^\\u0000]*$', description: 'Only events of this run' })),
  thread_id: Type.Optional(Type.String({ pattern: '^[^\\u0000]*$', description: 'Only events of this thread' }))
}

export const StreamQuery = Type.Object({
  after_event_id: Type.Optional(EventCursor),
  ...eventFilters,
  access_token: Type.Optional(Type.String({ description: 'A bearer token, for clients that cannot send headers (a browser EventSource); only when API_TOKENS is set. Never logged.' }))
})

export const DEFAULT_EVENTS_LIMIT = 100

export const EventsQuery = Type.Object({
  after_event_id: Type.Optional(EventCursor),
  ...eventFilters,
  limit: Type.Optional(Limit(`Page size, ${DEFAULT_EVENTS_LIMIT} by default`))
})

/** An error response: always the envelope; `description` says when it happens. */
export const errorResponse = (description: string) => Type.Ref('ErrorEnvelope', { description })

/** The error responses every /api route can give, besides its own 404. */
export const commonErrors = {
  400: errorResponse('`bad_request`: a malformed parameter or URL'),
  401: errorResponse('`unauthorized`: a missing or unknown bearer token (only when API_TOKENS is set)'),
  500: errorResponse('`internal`: an unexpected failure (a bug)'),
  503: errorResponse('`unavailable`: the database is unreachable or too slow, or the service is overloaded or shutting down')
}

/** The errors of a route that takes an event cursor. */
export const eventCursorErrors = {
  ...commonErrors,
  410: errorResponse('`cursor_expired`: the cursor is older than the event history kept (EVENTS_RETENTION); refetch what you show, then resume from the X-Event-Cursor of that read')
}

export const notFoundErrors = { ...commonErrors, 404: errorResponse('`not_found`: no such run or thread') }

// ---- HTTP caching (CONTRACT section 7; plugins/app/http-cache.ts) -----------

/** The request header of a conditional read. */
export const ConditionalHeaders = Type.Object({
  'if-none-match': Type.Optional(Type.String({ description: 'ETags of bodies the client holds, or `*`: 304 with no body while the body would be the same (weak tags compared weakly; a malformed field is ignored)' }))
})

/** What the Cache-Control of each kind of read says, for the docs. */
export const CACHE_CONTROL_DOCS = {
  state: '`no-cache` (with API_TOKENS: `private, no-cache`): keep it, but revalidate (If-None-Match) before every use',
  events: 'A full page after an explicit after_event_id is final: `public, max-age=31536000, immutable`; any other page `public, max-age=5`. With API_TOKENS, `private` instead of `public`, and Vary: Authorization'
} as const

/** A JSON read's 200: its body, and the headers that say where it was read and how it may be cached. */
export const readResponse = (ref: string, description: string, cacheControl: string) => ({
  ...Type.Ref(ref, { description }),
  headers: {
    'x-event-cursor': Type.String({ description: 'The event stream position the body was read at: subscribe with after_event_id=<it> and nothing between is missed' }),
    etag: Type.String({ description: 'A strong tag of the body; send it in If-None-Match to revalidate' }),
    'cache-control': Type.String({ description: cacheControl })
  }
})

/** The 304 of a conditional read. */
export const notModified = {
  304: Type.Null({ description: 'Not Modified: the body would be the one If-None-Match names. No body; ETag, Cache-Control and X-Event-Cursor (the current position) are sent' })
}
