import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { Type } from 'typebox'
import { eventIdErrorsNamed } from '../../errors.ts'
import { assertPositionKept, listEvents, type EventFilter } from '../../events/index.ts'
import { requestCaller } from '../../plugins/app/auth/index.ts'
import { queryScope } from '../../plugins/app/auth/stream-tokens.ts'
import {
  AfterEventId, CACHE_CONTROL_DOCS, ConditionalHeaders, DEFAULT_EVENTS_LIMIT, eventIdErrors, EventsQuery, notModified, parseEventId, parseLimit,
  readResponse, StreamHeaders, StreamQuery
} from '../../schemas/api.ts'

/** The filters given (an empty one is refused by the schema). */
function toFilter (query: { run_id?: string, thread_id?: string }): EventFilter {
  return {
    ...(query.run_id !== undefined ? { runId: query.run_id } : {}),
    ...(query.thread_id !== undefined ? { threadId: query.thread_id } : {})
  }
}

/** What a page's after_event_id that cannot be served answers. */
const AFTER_EVENT_ID_ERRORS = eventIdErrorsNamed('after_event_id')

/** The stream's errors: those of any event id route but the 503, answered as a retry (plugins/app/errors.ts). */
const { 503: _retried, ...streamErrors } = eventIdErrors

const eventRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const { events } = app

  app.get('/events/stream', {
    sse: { kind: 'manual' },
    config: { eventStream: () => true, streamScope: (request) => queryScope(request.query) },
    schema: {
      operationId: 'streamEvents',
      tags: ['events'],
      summary: 'The live event stream (Server-Sent Events)',
      description: 'Each event is `id: <event_id>` and `data: <Event as one line of JSON>`. Resumes after the Last-Event-ID header if sent, else ' +
        'after `after_event_id`, else from the current end. Sends `retry:` once, `: keep-alive` comments when quiet, and id-only blocks that move ' +
        'a filtered client\'s event id. Every committed event matching the filters is delivered exactly once, in ascending event_id. An event id older ' +
        'than the history kept (EVENTS_RETENTION) answers 410 `cursor_expired` before the stream starts: refetch what you show, then subscribe ' +
        'from the X-Event-Cursor of that read. Never a 503 or a 429: a stream refused for a transient reason (the database unavailable, this ' +
        'instance at SSE_MAX_STREAMS, shutting down, overloaded) or its caller at SSE_MAX_STREAMS_PER_CALLER (`too_many_requests`) is a 200 with ' +
        '`retry:` and a comment saying why, then the end, so that an EventSource retries by itself.',
      querystring: StreamQuery,
      headers: StreamHeaders,
      response: {
        200: {
          description: 'A text/event-stream of Event envelopes (or, refused for a transient reason, a retry and the end)',
          content: { 'text/event-stream': { schema: Type.Ref('Event') } }
        },
        ...streamErrors
      }
    }
  }, async (request, reply) => {
    // A browser EventSource reconnects to its original URL, whose
    // after_event_id is stale: the header it adds must win.
    const header = request.headers['last-event-id']?.trim()
    const eventIdName = header ? 'Last-Event-ID' : 'after_event_id'
    const resumeAfter = header
      ? parseEventId(header, StreamHeaders.properties['last-event-id'])
      : request.query.after_event_id === undefined ? undefined : parseEventId(request.query.after_event_id, AfterEventId)
    const from = resumeAfter === undefined ? 'tail' : { afterId: resumeAfter, errors: eventIdErrorsNamed(eventIdName) }
    await events.streams.open(reply, toFilter(request.query), from, requestCaller(request))
  })

  app.get('/events', {
    schema: {
      operationId: 'listEvents',
      tags: ['events'],
      summary: 'A page of events, for clients that cannot hold a stream open',
      description: 'Events after `after_event_id` (by default, from the oldest event kept) matching the filters, ascending, at most `limit` ' +
        `(${DEFAULT_EVENTS_LIMIT} by default). Only settled events are listed (never one above an id still in flight). X-Event-Cursor is where to ` +
        'resume: the last event returned when the page is full, else the settled position. An event id older than the history kept (EVENTS_RETENTION) ' +
        'answers 410 `cursor_expired`.',
      querystring: EventsQuery,
      headers: ConditionalHeaders,
      response: { 200: readResponse('EventList', 'A page of events', CACHE_CONTROL_DOCS.events), ...notModified, ...eventIdErrors }
    }
  }, async (request, reply) => {
    const { after_event_id: after } = request.query
    const limit = parseLimit(request.query.limit) ?? DEFAULT_EVENTS_LIMIT
    const afterId = after === undefined ? undefined : parseEventId(after, AfterEventId)
    const page = await listEvents(app.db, afterId, toFilter(request.query), limit, await events.ready())
    if (afterId !== undefined) assertPositionKept(AFTER_EVENT_ID_ERRORS, afterId, page.state)
    // A full page after an explicit event id is final; one from the floor moves with it (EVENTS_RETENTION).
    const kind = page.full && afterId !== undefined ? 'immutable' : 'recent'
    return reply.header('x-event-cursor', page.eventCursor).sendCacheable(page.body, kind)
  })
}

export default eventRoutes
