import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import type { FastifyReply, FastifyRequest } from 'fastify'
import { Type } from 'typebox'
import { DURABLE_READ_HEADERS, readOf, type DurableAnswer, type DurableQuery, type EventFilter } from '../../events/index.ts'
import { requestCaller } from '../../plugins/app/auth/index.ts'
import type { StreamScope } from '../../plugins/app/auth/stream-tokens.ts'
import { NO_STORE } from '../../plugins/app/http-cache.ts'
import { commonErrors, ConditionalHeaders, DurableStreamQuery, errorResponse, RunParams, ThreadParams } from '../../schemas/api.ts'

/*
 * The event log under the Durable Streams protocol, read path only
 * (docs/reference.md, "Durable Streams"): /api/streams/events, /runs/{run_id} and
 * /threads/{thread_id}; catch-up, long-poll and SSE. The protocol is the
 * event log's (events/durable/): this file declares the routes and writes
 * the answer it is handed.
 */

/** Whether a read of a stream asks for SSE (`live=sse`): the only one that streams. */
const readsSse = (request: FastifyRequest) => (request.query as { live?: string }).live === 'sse'

const streamHeaders = {
  'stream-next-offset': Type.String({ description: 'Where the next read starts: a settled position, as an opaque offset' }),
  'stream-up-to-date': Type.String({ enum: ['true'], description: 'Present (`true`) when the answer reaches the tail of the log' }),
  'stream-cursor': Type.String({ description: 'Live answers only: the Stream-Cursor value to echo as `cursor`' }),
  etag: Type.String({ description: 'Pages only (not offset=now, 204, SSE): a strong tag; If-None-Match with it answers 304' }),
  'cache-control': Type.String({
    description: 'Pages: `public, max-age=60, stale-while-revalidate=300` (`private` when authentication is on); ' +
    '`offset=now`, 204, HEAD: `no-store`; SSE: `no-cache`'
  })
}

const streamErrors = {
  ...commonErrors,
  400: errorResponse('`bad_request`: a malformed parameter or URL, or an offset beyond the last one ever handed out'),
  404: errorResponse('`not_found`: no such run or thread'),
  410: errorResponse('`cursor_expired`: the offset is older than the event history kept (EVENTS_RETENTION), or may name an event the database lost ' +
    'in a failover or a crash; read again from offset=-1')
}

const readResponses = {
  200: {
    description: 'A JSON array of Event envelopes (catch-up and long-poll), or, with live=sse, a text/event-stream of `data` events (arrays of ' +
      'envelopes) each followed by a `control` event `{streamNextOffset, streamCursor, upToDate}`',
    content: {
      'application/json': { schema: Type.Array(Type.Ref('Event')) },
      'text/event-stream': { schema: Type.String() }
    },
    headers: streamHeaders
  },
  204: Type.Null({
    description: 'Long-poll: no event arrived in time; Stream-Next-Offset, Stream-Up-To-Date and Stream-Cursor say where to poll ' +
    'next. Never cached',
    headers: streamHeaders
  }),
  304: Type.Null({ description: 'Not Modified: the page would be the one If-None-Match names' }),
  ...streamErrors,
  429: errorResponse('`too_many_requests`: a long-poll from a caller already holding its share of this instance\'s long-polls ' +
    '(DURABLE_STREAMS_MAX_LONG_POLLS_PER_CALLER), with Retry-After; an SSE read past its share is a `retry:` instead'),
  503: errorResponse('`unavailable`: the database is unreachable or too slow, the service is overloaded or shutting down, or a long-poll finds ' +
    'this instance at DURABLE_STREAMS_MAX_LONG_POLLS (Retry-After); an SSE read is a `retry:` instead')
}

const STREAMS = [
  { url: '/streams/events', name: 'Events', what: 'every event', params: undefined, filter: (): EventFilter => ({}) },
  {
    url: '/streams/runs/:runID',
    name: 'Run',
    what: 'the events of one run',
    params: RunParams,
    filter: (params: { runID?: string }): EventFilter => ({ runId: params.runID! })
  },
  {
    url: '/streams/threads/:threadID',
    name: 'Thread',
    what: 'the events of one thread',
    params: ThreadParams,
    filter: (params: { threadID?: string }): EventFilter => ({ threadId: params.threadID! })
  }
] as const

/** A stream's filter as the scope a stream token must cover. */
const streamScope = (filter: EventFilter): StreamScope => ({ run_id: filter.runId, thread_id: filter.threadId })

const durableStreamRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const { events } = app

  /** Writes an answer: a page (cacheable), another reply (never stored), or the SSE stream it plans. */
  function write (reply: FastifyReply, answer: DurableAnswer, caller: string): unknown {
    if ('stream' in answer) return events.streams.open(reply, answer.stream.filter, answer.stream.start, caller, answer.stream.options)
    reply.code(answer.status).headers(answer.headers)
    if (answer.page !== undefined) return reply.type(answer.type!).sendCacheable(answer.page.json, 'stream', answer.page.next)
    reply.header('cache-control', NO_STORE)
    if (answer.type !== undefined) reply.type(answer.type)
    return reply.send(answer.body)
  }

  /** Not async: the answer's own promise is the handler's (one async frame less for each request of a crowd). */
  function read (request: FastifyRequest, reply: FastifyReply, filter: EventFilter): Promise<unknown> {
    const caller = requestCaller(request)
    try {
      const read = readOf(request.query as DurableQuery)
      reply.headers(DURABLE_READ_HEADERS)
      return events.durable.answer(read, filter, caller, reply.raw).then((answer) => write(reply, answer, caller))
    } catch (err) {
      return Promise.reject(err)
    }
  }

  for (const stream of STREAMS) {
    const params = stream.params === undefined ? {} : { params: stream.params }
    app.get(stream.url, {
      exposeHeadRoute: false,
      sse: { kind: 'manual' },
      // A transient refusal of an SSE read is answered as a retry, as on the event stream.
      config: {
        eventStream: readsSse,
        ignoresUnknownQuery: true,
        streamScope: (request) => streamScope(stream.filter(request.params as Record<string, string>))
      },
      schema: {
        operationId: `readDurableStream${stream.name}`,
        tags: ['streams'],
        summary: `Durable Streams: ${stream.what}`,
        description: 'The event log under the Durable Streams protocol (read path; docs/reference.md, "Durable Streams"): any Durable Streams ' +
          'client reads it. Each message is an Event envelope, in ascending event_id, exactly once. Offsets are opaque, ordered, and valid on every replica.',
        ...params,
        querystring: DurableStreamQuery,
        headers: ConditionalHeaders,
        response: readResponses
      }
    }, (request, reply) => read(request, reply, stream.filter(request.params as Record<string, string>)))

    app.head(stream.url, {
      config: { ignoresUnknownQuery: true, streamScope: (request) => streamScope(stream.filter(request.params as Record<string, string>)) },
      schema: {
        operationId: `headDurableStream${stream.name}`,
        tags: ['streams'],
        summary: `Durable Streams: the tail of ${stream.what}`,
        ...params,
        response: {
          200: Type.Null({
            description: 'The stream exists; Stream-Next-Offset is its tail. `no-store`',
            headers: { 'stream-next-offset': streamHeaders['stream-next-offset'] }
          }),
          ...streamErrors
        }
      }
    }, async (request, reply) => write(reply, await events.durable.head(stream.filter(request.params as Record<string, string>)), requestCaller(request)))
  }
}

export default durableStreamRoutes
