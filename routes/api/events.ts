import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { Type } from 'typebox'
import { eventsAfter, listEvents, settledNow, type EventFilter, type StoredEvent } from '../../db/events.js'
import { ApiError } from '../../errors.js'
import { Subscriber, type SubscriberOptions } from '../../plugins/app/events/subscriber.js'
import { commonErrors, DEFAULT_EVENTS_LIMIT, EventsQuery, parseCursor, parseLimit, StreamQuery } from '../../schemas/api.js'

/** Events read per catch-up query of a stream that resumes from an older cursor. */
export const CATCH_UP_PAGE_SIZE = 500

/** Empty filters mean "no filter": `?run_id=` is what a UI sends before it knows the run. */
function toFilter (query: { run_id?: string, thread_id?: string }): EventFilter {
  return {
    ...(query.run_id ? { runId: query.run_id } : {}),
    ...(query.thread_id ? { threadId: query.thread_id } : {})
  }
}

const eventRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const { SSE_MAX_BUFFERED_BYTES, SSE_MAX_STREAMS, SSE_RETRY_MS, SSE_SLOW_CLIENT_TIMEOUT_MS } = app.config
  const hub = app.events
  const subscriberOptions: SubscriberOptions = {
    // Never past the hub's settled head: what lies above it reaches the stream live.
    readAfter: (afterId, filter) => eventsAfter(app.db, afterId, filter, CATCH_UP_PAGE_SIZE, hub.head),
    pageSize: CATCH_UP_PAGE_SIZE,
    maxBufferedBytes: SSE_MAX_BUFFERED_BYTES,
    slowClientMs: SSE_SLOW_CLIENT_TIMEOUT_MS,
    onDrop: (subscriber, reason, err) => app.log.warn({ err, filter: subscriber.filter, lastId: subscriber.lastId }, `event stream ended: ${reason}`)
  }

  app.get('/events/stream', {
    sse: { kind: 'manual', heartbeat: false },
    schema: {
      operationId: 'streamEvents',
      tags: ['events'],
      summary: 'The live event stream (Server-Sent Events)',
      description: 'Each event is `id: <event_id>` and `data: <Event as one line of JSON>`. Resumes after the Last-Event-ID header if sent, else after `after_event_id`, else from the current end. Sends `retry:` once, `: keep-alive` comments when quiet, and id-only blocks that move a filtered client\'s cursor. Every committed event matching the filters is delivered exactly once, in ascending event_id.',
      querystring: StreamQuery,
      headers: Type.Object({
        'last-event-id': Type.Optional(Type.String({ description: 'The last event_id received; wins over after_event_id' }))
      }),
      response: {
        200: {
          description: 'A text/event-stream of Event envelopes',
          content: { 'text/event-stream': { schema: Type.Ref('Event') } }
        },
        ...commonErrors
      }
    }
  }, async (request, reply) => {
    // A browser EventSource reconnects to its original URL, whose
    // after_event_id is stale: the header it adds must win.
    const header = request.headers['last-event-id']?.trim()
    const resumeAfter = header
      ? parseCursor(header, 'Last-Event-ID')
      : request.query.after_event_id === undefined ? undefined : parseCursor(request.query.after_event_id, 'after_event_id')
    const filter = toFilter(request.query)

    if (hub.size >= SSE_MAX_STREAMS) {
      reply.header('retry-after', 5)
      throw new ApiError('unavailable', `this instance already serves ${SSE_MAX_STREAMS} event streams, retry shortly or on another instance`)
    }
    const known = await hub.ready()
    const subscriber = new Subscriber(reply.raw, filter, resumeAfter ?? 0, subscriberOptions)
    // Subscribed before reading the table: whatever the hub polls from now
    // on reaches this subscriber, and whatever it polled before, the reads
    // below see (see README, "The event stream", for the argument).
    hub.subscribe(subscriber)
    reply.sse.onClose(() => hub.unsubscribe(subscriber))

    let firstPage: StoredEvent[] = []
    try {
      if (resumeAfter === undefined) subscriber.lastId = await settledNow(app.db, known)
      else firstPage = await eventsAfter(app.db, resumeAfter, filter, CATCH_UP_PAGE_SIZE, hub.head)
    } catch (err) {
      hub.unsubscribe(subscriber)
      throw err // before any byte is sent: the client gets the 503 envelope
    }

    if (!reply.sse.isConnected) return
    reply.sse.keepAlive()
    reply.sse.sendHeaders()
    subscriber.write(`retry: ${SSE_RETRY_MS}\n\n`)
    await subscriber.catchUp(firstPage)
  })

  app.get('/events', {
    schema: {
      operationId: 'listEvents',
      tags: ['events'],
      summary: 'A page of events, for clients that cannot hold a stream open',
      description: `Events after \`after_event_id\` (0, the first event, by default) matching the filters, ascending, at most \`limit\` (${DEFAULT_EVENTS_LIMIT} by default). Only settled events are listed (never one above an id still in flight). X-Event-Cursor is where to resume: the last event returned when the page is full, else the settled position.`,
      querystring: EventsQuery,
      response: { 200: Type.Ref('EventList', { description: 'A page of events' }), ...commonErrors }
    }
  }, async (request, reply) => {
    const { after_event_id: after } = request.query
    const limit = parseLimit(request.query.limit) ?? DEFAULT_EVENTS_LIMIT
    const afterId = after === undefined ? 0 : parseCursor(after, 'after_event_id')
    const page = await listEvents(app.db, afterId, toFilter(request.query), limit, await hub.ready())
    return reply.header('x-event-cursor', page.cursor).sendRawJson(page.body)
  })
}

export default eventRoutes
