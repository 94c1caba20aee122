import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { Type } from 'typebox'
import { eventsAfterKept, listEvents, settledNow, type EventFilter, type StoredEvent } from '../../db/events.js'
import { ApiError, cursorExpired } from '../../errors.js'
import { Subscriber, type SubscriberOptions } from '../../plugins/app/events/subscriber.js'
import { DEFAULT_EVENTS_LIMIT, eventCursorErrors, EventsQuery, parseCursor, parseLimit, StreamQuery } from '../../schemas/api.js'

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
  /**
   * Up to a page of events after a cursor named `name`, never past the
   * hub's settled head (what lies above it reaches the stream live); a
   * cursor below the history's floor (read in the same statement) has
   * missed events: 410.
   */
  async function readAfter (afterId: number, filter: EventFilter, name: string): Promise<StoredEvent[]> {
    const { floor, events } = await eventsAfterKept(app.db, afterId, filter, CATCH_UP_PAGE_SIZE, hub.head)
    if (afterId < floor) throw cursorExpired(name, afterId, floor)
    return events
  }
  const subscriberOptions: SubscriberOptions = {
    // A stream still catching up when the history's floor passes it ends: its client's reconnect gets the 410.
    readAfter: (afterId, filter) => readAfter(afterId, filter, 'the stream\'s position'),
    pageSize: CATCH_UP_PAGE_SIZE,
    maxBufferedBytes: SSE_MAX_BUFFERED_BYTES,
    slowClientMs: SSE_SLOW_CLIENT_TIMEOUT_MS,
    onDrop: (subscriber, reason, err) => {
      const details = { filter: subscriber.filter, lastId: subscriber.lastId }
      if (err instanceof ApiError && err.code === 'cursor_expired') {
        app.log.info(details, 'event stream ended: the history\'s floor passed it while it caught up (EVENTS_RETENTION); its client\'s reconnect is answered 410')
      } else {
        app.log.warn({ err, ...details }, `event stream ended: ${reason}`)
      }
    }
  }

  app.get('/events/stream', {
    sse: { kind: 'manual', heartbeat: false },
    schema: {
      operationId: 'streamEvents',
      tags: ['events'],
      summary: 'The live event stream (Server-Sent Events)',
      description: 'Each event is `id: <event_id>` and `data: <Event as one line of JSON>`. Resumes after the Last-Event-ID header if sent, else after `after_event_id`, else from the current end. Sends `retry:` once, `: keep-alive` comments when quiet, and id-only blocks that move a filtered client\'s cursor. Every committed event matching the filters is delivered exactly once, in ascending event_id. A cursor older than the history kept (EVENTS_RETENTION) answers 410 `cursor_expired` before the stream starts: refetch what you show, then subscribe from the X-Event-Cursor of that read.',
      querystring: StreamQuery,
      headers: Type.Object({
        'last-event-id': Type.Optional(Type.String({ description: 'The last event_id received; wins over after_event_id' }))
      }),
      response: {
        200: {
          description: 'A text/event-stream of Event envelopes',
          content: { 'text/event-stream': { schema: Type.Ref('Event') } }
        },
        ...eventCursorErrors
      }
    }
  }, async (request, reply) => {
    // A browser EventSource reconnects to its original URL, whose
    // after_event_id is stale: the header it adds must win.
    const header = request.headers['last-event-id']?.trim()
    const cursorName = header ? 'Last-Event-ID' : 'after_event_id'
    const resumeAfter = header
      ? parseCursor(header, cursorName)
      : request.query.after_event_id === undefined ? undefined : parseCursor(request.query.after_event_id, cursorName)
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
      else firstPage = await readAfter(resumeAfter, filter, cursorName)
    } catch (err) {
      hub.unsubscribe(subscriber)
      throw err // before any byte is sent: the client gets the 410 or 503 envelope
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
      description: `Events after \`after_event_id\` (by default, from the oldest event kept) matching the filters, ascending, at most \`limit\` (${DEFAULT_EVENTS_LIMIT} by default). Only settled events are listed (never one above an id still in flight). X-Event-Cursor is where to resume: the last event returned when the page is full, else the settled position. A cursor older than the history kept (EVENTS_RETENTION) answers 410 \`cursor_expired\`.`,
      querystring: EventsQuery,
      response: { 200: Type.Ref('EventList', { description: 'A page of events' }), ...eventCursorErrors }
    }
  }, async (request, reply) => {
    const { after_event_id: after } = request.query
    const limit = parseLimit(request.query.limit) ?? DEFAULT_EVENTS_LIMIT
    const afterId = after === undefined ? undefined : parseCursor(after, 'after_event_id')
    const page = await listEvents(app.db, afterId, toFilter(request.query), limit, await hub.ready())
    if (afterId !== undefined && afterId < page.floor) throw cursorExpired('after_event_id', afterId, page.floor)
    return reply.header('x-event-cursor', page.cursor).sendRawJson(page.body)
  })
}

export default eventRoutes
