import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import type { FastifyReply, FastifyRequest, RouteHandlerMethod } from 'fastify'
import { Type, type Static } from 'typebox'
import { ApiError, CursorBeyondError, CursorLostError, invalidParameter, notFound, offsetBeyond } from '../../errors.js'
import { countSent, durableSseFormat, encodeOffset, nextStreamCursor, parseOffset, parseStreamCursor, streamSubjectExists, type EventFilter, type StoredEvent, type StreamOffset, type StreamPage } from '../../events/index.js'
import { requestCaller } from '../../plugins/app/auth/index.js'
import type { StreamScope } from '../../plugins/app/auth/stream-tokens.js'
import { NO_STORE } from '../../plugins/app/http-cache.js'
import { commonErrors, ConditionalHeaders, DurableStreamQuery, errorResponse, RunParams, StreamOffsetParam, ThreadParams } from '../../schemas/api.js'

/*
 * The event log under the Durable Streams protocol, read path only
 * (docs/reference.md, "Durable Streams"): /api/streams/events, /runs/{run_id} and
 * /threads/{thread_id}; catch-up, long-poll and SSE. Everything is served
 * by the event log's one poller, fan-out and settled head (events/); this file
 * parses, validates and writes the protocol's headers.
 */

/** The content type of a JSON stream, exactly as the protocol writes it (no parameters; bodies go as bytes, to which Fastify adds no charset). */
const DURABLE_JSON = 'application/json'
const EMPTY_ARRAY = Buffer.from('[]')

/** How long a run or thread found to exist is remembered, so that a crowd of long-polls costs no query each. */
const KNOWN_SUBJECT_MS = 60_000
/** The most subjects remembered (then the memory starts over). */
const MAX_KNOWN_SUBJECTS = 100_000

declare module 'fastify' {
  interface FastifyContextConfig {
    /** The route's handler for a request that does not stream (see the onRoute hook below). */
    plainHandler?: RouteHandlerMethod
  }
}

/** Whether a read of a stream asks for SSE (`live=sse`): the only one that streams. */
const readsSse = (request: FastifyRequest) => (request.query as { live?: string }).live === 'sse'

const streamHeaders = {
  'stream-next-offset': Type.String({ description: 'Where the next read starts: a settled position, as an opaque offset' }),
  'stream-up-to-date': Type.String({ enum: ['true'], description: 'Present (`true`) when the answer reaches the head of the log' }),
  'stream-cursor': Type.String({ description: 'Live answers only: the interval cursor to echo as `cursor`' }),
  etag: Type.String({ description: 'Pages only (not offset=now, 204, SSE): a strong tag; If-None-Match with it answers 304' }),
  'cache-control': Type.String({ description: 'Pages: `public, max-age=60, stale-while-revalidate=300` (`private` when authentication is on); `offset=now`, 204, HEAD: `no-store`; SSE: `no-cache`' })
}

const streamErrors = {
  ...commonErrors,
  400: errorResponse('`bad_request`: a malformed parameter or URL, or an offset beyond the last one ever handed out'),
  404: errorResponse('`not_found`: no such run or thread'),
  410: errorResponse('`cursor_expired`: the offset is older than the event history kept (EVENTS_RETENTION), or may name an event the database lost in a failover or a crash; read again from offset=-1')
}

const readResponses = {
  200: {
    description: 'A JSON array of Event envelopes (catch-up and long-poll), or, with live=sse, a text/event-stream of `data` events (arrays of envelopes) each followed by a `control` event `{streamNextOffset, streamCursor, upToDate}`',
    content: {
      'application/json': { schema: Type.Array(Type.Ref('Event')) },
      'text/event-stream': { schema: Type.String() }
    },
    headers: streamHeaders
  },
  204: Type.Null({ description: 'Long-poll: no event arrived in time; Stream-Next-Offset, Stream-Up-To-Date and Stream-Cursor say where to poll next. Never cached', headers: streamHeaders }),
  304: Type.Null({ description: 'Not Modified: the page would be the one If-None-Match names' }),
  ...streamErrors,
  429: errorResponse('`too_many_requests`: a long-poll from a caller already holding its share of this instance\'s long-polls (STREAMS_MAX_LONG_POLLS_PER_CALLER), with Retry-After; an SSE read past its share is a `retry:` instead'),
  503: errorResponse('`unavailable`: the database is unreachable or too slow, the service is overloaded or shutting down, or a long-poll finds this instance at STREAMS_MAX_LONG_POLLS (Retry-After); an SSE read is a `retry:` instead')
}

const STREAMS = [
  { url: '/streams/events', name: 'Events', what: 'every event', params: undefined, filter: (): EventFilter => ({}) },
  { url: '/streams/runs/:runID', name: 'Run', what: 'the events of one run', params: RunParams, filter: (params: { runID?: string }): EventFilter => ({ runId: params.runID! }) },
  { url: '/streams/threads/:threadID', name: 'Thread', what: 'the events of one thread', params: ThreadParams, filter: (params: { threadID?: string }): EventFilter => ({ threadId: params.threadID! }) }
] as const

/** A stream's filter as the scope a stream token must cover. */
const streamScope = (filter: EventFilter): StreamScope => ({ run_id: filter.runId, thread_id: filter.threadId })

const durableStreamRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const { events } = app
  const { STREAMS_LONG_POLL_MS, STREAMS_SSE_MAX_MS } = app.config
  /** Runs and threads found to exist, and when (they are not deleted while watched; a minute bounds the error). */
  const known = { run: new Map<string, number>(), thread: new Map<string, number>() }
  /**
   * The checks in flight, by subject: a crowd arriving at once (5,000
   * long-polls of one run) shares one query, rather than each holding its
   * request in memory while its own query waits for a connection.
   */
  const checking = { run: new Map<string, Promise<boolean>>(), thread: new Map<string, Promise<boolean>>() }

  /** Throws 404 for a run or thread that does not exist; undefined (no promise) when it is known to. */
  function checkExists (filter: EventFilter): Promise<void> | undefined {
    const kind = filter.runId !== undefined ? 'run' : filter.threadId !== undefined ? 'thread' : undefined
    if (kind === undefined) return undefined
    const id = (kind === 'run' ? filter.runId : filter.threadId)!
    const now = Date.now()
    if ((known[kind].get(id) ?? -Infinity) > now - KNOWN_SUBJECT_MS) return undefined
    return queryExists(kind, id, filter, now)
  }

  async function queryExists (kind: 'run' | 'thread', id: string, filter: EventFilter, now: number): Promise<void> {
    let check = checking[kind].get(id)
    if (check === undefined) {
      check = streamSubjectExists(app.db, filter).finally(() => checking[kind].delete(id))
      checking[kind].set(id, check)
    }
    if (!await check) throw notFound(kind)
    /* c8 ignore next: the memory bound, reached after 100,000 distinct runs and threads within a minute */
    if (known[kind].size >= MAX_KNOWN_SUBJECTS) known[kind].clear()
    known[kind].set(id, now)
  }

  /** The protocol says `offset`, written as offsets are, and to start again from -1: the 410 and the 400 say so, not the event stream's advice. */
  function renameCursorErrors (err: unknown): never {
    if (err instanceof CursorLostError) {
      throw new ApiError('cursor_expired', 'offset may name an event the database lost in a failover or a crash (no event of it lies between that offset and the next one handed out): read again from offset=-1')
    }
    if (err instanceof ApiError && err.code === 'cursor_expired') {
      throw new ApiError('cursor_expired', 'offset is older than the event history kept (events before it are gone, EVENTS_RETENTION): read again from offset=-1')
    }
    if (err instanceof CursorBeyondError) throw offsetBeyond(encodeOffset(err.cursor), encodeOffset(err.last))
    throw err
  }

  /**
   * The last page's body, by its events: a crowd of long-polls answered
   * together gets the same events (the same objects), and then the same
   * string, which sendCacheable encodes and tags once.
   */
  let lastPage: { events: StoredEvent[], json: string } = { events: [], json: '[]' }
  function pageJson (events: StoredEvent[]): string {
    const last = lastPage.events
    if (events.length !== last.length || events.some((event, i) => event !== last[i])) {
      lastPage = { events, json: `[${events.map((event) => event.json).join(',')}]` }
    }
    return lastPage.json
  }

  /** A page with data, or a catch-up page: the JSON array, its offsets, an ETag covering both, cacheable by its URL. */
  function sendPage (reply: FastifyReply, page: StreamPage) {
    const next = encodeOffset(page.next)
    reply.header('stream-next-offset', next)
    if (page.upToDate) reply.header('stream-up-to-date', 'true')
    return reply.type(DURABLE_JSON).sendCacheable(pageJson(page.events), 'stream', next)
  }

  /**
   * A read: a crowd's re-poll (a long-poll of a run already known to
   * exist) goes to its wait with no await before it, since an async frame
   * kept for each waiting request is what a crowd's scavenges copy; every
   * other read goes on in readChecked.
   */
  function read (query: Static<typeof DurableStreamQuery>, reply: FastifyReply, filter: EventFilter, caller: string): Promise<unknown> {
    let offset: StreamOffset
    let cursor: number | undefined
    let checked: Promise<void> | undefined
    try {
      // The protocol: a live read names where it starts; only a catch-up may leave it out (then: -1).
      if (query.live !== undefined && query.offset === undefined) throw invalidParameter(StreamOffsetParam)
      offset = parseOffset(query.offset)
      cursor = parseStreamCursor(query.cursor)
      reply.header('cross-origin-resource-policy', 'cross-origin')
      checked = checkExists(filter)
    } catch (err) {
      return Promise.reject(err)
    }
    if (checked === undefined && query.live === 'long-poll') return longPoll(offset, cursor, reply, filter, caller)
    return readChecked(checked, query.live, offset, cursor, reply, filter, caller)
  }

  async function readChecked (checked: Promise<void> | undefined, live: Static<typeof DurableStreamQuery>['live'], offset: StreamOffset, cursor: number | undefined, reply: FastifyReply, filter: EventFilter, caller: string) {
    if (checked !== undefined) await checked
    if (live === 'sse') {
      const start = offset === 'now' ? 'tail' : offset === 'oldest' ? 'oldest' : { afterId: offset, name: 'offset' }
      const format = (head: () => number) => durableSseFormat(head, () => nextStreamCursor(Date.now(), cursor))
      return events.streams.open(reply, filter, start, caller, { format, maxMs: STREAMS_SSE_MAX_MS }).catch(renameCursorErrors)
    }
    if (live === 'long-poll') return longPoll(offset, cursor, reply, filter, caller)
    const page = await events.durable.page(offset, filter, 'offset', true).catch(renameCursorErrors)
    if (offset !== 'now') return sendPage(reply, page)
    // The tail moves: never cached, no ETag (the protocol's rule for offset=now).
    return reply.header('stream-next-offset', encodeOffset(page.next)).header('stream-up-to-date', 'true')
      .header('cache-control', NO_STORE).type(DURABLE_JSON).send(EMPTY_ARRAY)
  }

  /** A long-poll: the events that came, or 204 when none did in time; it holds one of `caller`'s slots meanwhile. */
  function longPoll (offset: StreamOffset, cursor: number | undefined, reply: FastifyReply, filter: EventFilter, caller: string) {
    // Stopped only when the client leaves before its answer (a 'close' after
    // the answer is every request's); one gone already (its 'close' told
    // before this listener) stops at once rather than at the timeout.
    const whenGone = (stop: () => void) => {
      if (reply.raw.destroyed) stop()
      else reply.raw.on('close', () => { if (!reply.raw.writableEnded) stop() })
    }
    return events.durable.longPoll(offset, filter, 'offset', STREAMS_LONG_POLL_MS, whenGone, caller).then((page) => {
      countSent(reply.raw, { sent: page.events.length })
      reply.header('stream-cursor', nextStreamCursor(Date.now(), cursor))
      if (page.events.length > 0) return sendPage(reply, page)
      return reply.code(204).header('stream-next-offset', encodeOffset(page.next)).header('stream-up-to-date', 'true')
        .header('cache-control', NO_STORE).send()
    }, renameCursorErrors)
  }

  // @fastify/sse wraps the handler of a route that may stream: every request
  // gets an SSE context, two listeners and one more async frame. Here only
  // live=sse streams; a long-poll or catch-up (a crowd's every request) runs
  // the route's own handler, kept in its config (plainHandler).
  app.addHook('onRoute', (route) => {
    const plain = route.config?.plainHandler
    if (plain === undefined) return
    const withSse = route.handler
    route.handler = function (request, reply) {
      return (readsSse(request) ? withSse : plain).call(this, request, reply)
    }
  })

  for (const stream of STREAMS) {
    const params = stream.params === undefined ? {} : { params: stream.params }
    // Not async itself: read's own promise is the answer (one async frame less for each request of a crowd).
    const handler = (request: FastifyRequest, reply: FastifyReply) => read(request.query as Static<typeof DurableStreamQuery>, reply, stream.filter(request.params as Record<string, string>), requestCaller(request))
    app.get(stream.url, {
      exposeHeadRoute: false,
      sse: { kind: 'manual' },
      // A transient refusal of an SSE read is answered as a retry, as on the event stream.
      config: { plainHandler: handler, eventStream: readsSse, ignoresUnknownQuery: true, streamScope: (request) => streamScope(stream.filter(request.params as Record<string, string>)) },
      schema: {
        operationId: `readDurableStream${stream.name}`,
        tags: ['streams'],
        summary: `Durable Streams: ${stream.what}`,
        description: 'The event log under the Durable Streams protocol (read path; docs/reference.md, "Durable Streams"): any Durable Streams client reads it. Each message is an Event envelope, in ascending event_id, exactly once. Offsets are opaque, ordered, and valid on every replica.',
        ...params,
        querystring: DurableStreamQuery,
        headers: ConditionalHeaders,
        response: readResponses
      }
    }, handler)

    app.head(stream.url, {
      config: { ignoresUnknownQuery: true, streamScope: (request) => streamScope(stream.filter(request.params as Record<string, string>)) },
      schema: {
        operationId: `headDurableStream${stream.name}`,
        tags: ['streams'],
        summary: `Durable Streams: the tail of ${stream.what}`,
        ...params,
        response: { 200: Type.Null({ description: 'The stream exists; Stream-Next-Offset is its tail. `no-store`', headers: { 'stream-next-offset': streamHeaders['stream-next-offset'] } }), ...streamErrors }
      }
    }, async (request, reply) => {
      const filter = stream.filter(request.params as Record<string, string>)
      await checkExists(filter)
      const page = await events.durable.page('now', filter, 'offset', true)
      return reply.header('stream-next-offset', encodeOffset(page.next)).header('cache-control', NO_STORE)
        .header('cross-origin-resource-policy', 'cross-origin').type(DURABLE_JSON).send()
    })
  }
}

export default durableStreamRoutes
