import type { ServerResponse } from 'node:http'
import type { Db } from '../../db/schema.ts'
import { invalidParameter } from '../../errors.ts'
import { StreamOffsetParam } from '../../schemas/api.ts'
import type { EventHub } from '../hub.ts'
import type { Limit } from '../limits.ts'
import type { EventFilter, StoredEvent } from '../statements.ts'
import type { EventReader } from '../reader.ts'
import { countSent } from '../sent.ts'
import type { StreamOptions, StreamStart } from '../sse/streams.ts'
import { durableSseFormat } from './format.ts'
import { encodeOffset, nextStreamCursor, OFFSET_ERRORS, parseOffset, parseStreamCursor, type StreamOffset } from './offsets.ts'
import { DurableReads, type StreamPage } from './reads.ts'
import { SubjectChecks } from './subjects.ts'

/*
 * The Durable Streams protocol's read path (docs/reference.md, "Durable
 * Streams"), this folder's one entry: a request's parameters read into a
 * DurableRead, and its answer as data (status, headers, body, or the plan
 * of an SSE stream) for the route to write. Everything is served by the
 * event log's one poller, fan-out and tail.
 */

/** The content type of a JSON stream, exactly as the protocol writes it (no parameters; bodies go as bytes, to which Fastify adds no charset). */
export const DURABLE_JSON = 'application/json'
const EMPTY_ARRAY = Buffer.from('[]')

/** The headers of every GET whose parameters are valid, its errors included (the protocol's browser-security advice). */
export const DURABLE_READ_HEADERS: Readonly<Record<string, string>> = { 'cross-origin-resource-policy': 'cross-origin' }

/** A read's query parameters, as the route's schema (schemas/api.ts, DurableStreamQuery) lets them through. */
export interface DurableQuery {
  offset?: string
  live?: 'long-poll' | 'sse'
  cursor?: string
}

/** A read: a catch-up (a page at once), a long-poll or an SSE stream, from an offset, with the Stream-Cursor the client echoed. */
export interface DurableRead {
  live: 'catch-up' | 'long-poll' | 'sse'
  offset: StreamOffset
  cursor: number | undefined
}

/**
 * An answer that is not a stream. With `page`, a page of events: cached
 * as a stream page, its tag covering the body and its Stream-Next-Offset
 * (`next`); without, never stored (`no-store`), with `body` if any.
 */
export interface DurableReply {
  status: 200 | 204
  headers: Record<string, string>
  type?: typeof DURABLE_JSON
  page?: { json: string, next: string }
  body?: Buffer
}

/** An SSE read: the stream to open (EventStreams.open) once the reply is the route's. */
export interface DurableStreamPlan {
  stream: { filter: EventFilter, start: StreamStart, options: StreamOptions }
}

export type DurableAnswer = DurableReply | DurableStreamPlan

export interface DurableStreamsOptions {
  /** DURABLE_STREAMS_MAX_LONG_POLLS and DURABLE_STREAMS_MAX_LONG_POLLS_PER_CALLER. */
  longPolls: Limit
  /** DURABLE_STREAMS_LONG_POLL_MS: how long a long-poll waits. */
  longPollMs: number
  /** DURABLE_STREAMS_SSE_MAX_MS: when the server ends an SSE read. */
  sseMaxMs: number
}

/**
 * A request's parameters as a read; a malformed one is a 400 (the
 * protocol: a live read names where it starts; only a catch-up may leave
 * it out, and then reads from -1).
 */
export function readOf (query: DurableQuery): DurableRead {
  if (query.live !== undefined && query.offset === undefined) throw invalidParameter(StreamOffsetParam)
  return { live: query.live ?? 'catch-up', offset: parseOffset(query.offset), cursor: parseStreamCursor(query.cursor) }
}

/**
 * The protocol's reads of one process: whether the stream's run or thread
 * exists (subjects.ts), catch-up and long-poll pages (reads.ts), the SSE
 * mode's plan (format.ts), and each answer's headers and body.
 */
export class DurableStreams {
  readonly reads: DurableReads
  readonly #subjects: SubjectChecks
  /**
   * The last page's body, by its events: a crowd of long-polls answered
   * together gets the same events (the same objects), and then the same
   * string, which the reply encodes and tags once (sendCacheable).
   */
  #lastPage: { events: StoredEvent[], json: string } = { events: [], json: '[]' }

  private readonly options: DurableStreamsOptions

  constructor (db: Db, hub: EventHub, reader: EventReader, options: DurableStreamsOptions) {
    this.options = options
    this.reads = new DurableReads(db, hub, reader, options.longPolls)
    this.#subjects = new SubjectChecks(db)
  }

  /** Long-polls waiting for events. */
  get waiting (): number {
    return this.reads.waiting
  }

  /** Long-polls being answered, from their arrival to their answer (or their client's leaving). */
  get longPolls (): number {
    return this.reads.longPolls
  }

  /** Long-polls refused at DURABLE_STREAMS_MAX_LONG_POLLS (`instance`) and at DURABLE_STREAMS_MAX_LONG_POLLS_PER_CALLER (`caller`). */
  get refused (): DurableReads['refused'] {
    return this.reads.refused
  }

  /**
   * The answer to `read` of the stream `filter` selects, for `caller`
   * (whose share of long-polls it may take), on `response` (a long-poll
   * stops waiting when its client leaves). A crowd's re-poll (a long-poll
   * of a run already known to exist) goes to its wait with no await before
   * it, since an async frame kept for each waiting request is what a
   * crowd's scavenges copy; every other read goes on in #answerChecked.
   */
  answer (read: DurableRead, filter: EventFilter, caller: string, response: ServerResponse): Promise<DurableAnswer> {
    const checked = this.#subjects.check(filter)
    if (checked === undefined && read.live === 'long-poll') return this.#longPoll(read, filter, caller, response)
    return this.#answerChecked(checked, read, filter, caller, response)
  }

  /** A HEAD: the stream exists, and its tail. */
  async head (filter: EventFilter): Promise<DurableReply> {
    await this.#subjects.check(filter)
    const page = await this.reads.page('now', filter, true)
    return { status: 200, headers: { 'stream-next-offset': encodeOffset(page.next), ...DURABLE_READ_HEADERS }, type: DURABLE_JSON }
  }

  async #answerChecked (
    checked: Promise<void> | undefined, read: DurableRead, filter: EventFilter, caller: string, response: ServerResponse
  ): Promise<DurableAnswer> {
    if (checked !== undefined) await checked
    const { live, offset, cursor } = read
    if (live === 'sse') {
      const start: StreamStart = offset === 'now' ? 'tail' : offset === 'oldest' ? 'oldest' : { afterId: offset, errors: OFFSET_ERRORS }
      // Up to date means every event committed before the read (catchUpToNow); the
      // connection ends now and then, so that a cache in front collapses the reconnects.
      const format = (tail: () => number) => durableSseFormat(tail, () => nextStreamCursor(Date.now(), cursor))
      return { stream: { filter, start, options: { format, catchUpToNow: true, maxMs: this.options.sseMaxMs } } }
    }
    if (live === 'long-poll') return this.#longPoll(read, filter, caller, response)
    const page = await this.reads.page(offset, filter, true)
    if (offset !== 'now') return this.#page(page)
    // The tail moves: never cached, no ETag (the protocol's rule for offset=now).
    return { status: 200, headers: { 'stream-next-offset': encodeOffset(page.next), 'stream-up-to-date': 'true' }, type: DURABLE_JSON, body: EMPTY_ARRAY }
  }

  /** A long-poll: the events that came, or 204 when none did in time; it holds one of `caller`'s slots meanwhile. */
  #longPoll ({ offset, cursor }: DurableRead, filter: EventFilter, caller: string, response: ServerResponse): Promise<DurableReply> {
    // Stopped only when the client leaves before its answer (a 'close' after
    // the answer is every request's); one gone already (its 'close' told
    // before this listener) stops at once rather than at the timeout.
    const whenGone = (stop: () => void) => {
      if (response.destroyed) stop()
      else response.on('close', () => { if (!response.writableEnded) stop() })
    }
    return this.reads.longPoll(offset, filter, this.options.longPollMs, whenGone, caller).then((page) => {
      countSent(response, { sent: page.events.length })
      const streamCursor = nextStreamCursor(Date.now(), cursor)
      if (page.events.length > 0) return this.#page(page, streamCursor)
      return { status: 204, headers: { 'stream-cursor': streamCursor, 'stream-next-offset': encodeOffset(page.next), 'stream-up-to-date': 'true' } }
    })
  }

  /** A page with data, or a catch-up page: the JSON array and its offsets (a live one's Stream-Cursor too), cacheable by its URL. */
  #page (page: StreamPage, streamCursor?: string): DurableReply {
    const next = encodeOffset(page.next)
    const headers: Record<string, string> = streamCursor === undefined ? {} : { 'stream-cursor': streamCursor }
    headers['stream-next-offset'] = next
    if (page.upToDate) headers['stream-up-to-date'] = 'true'
    return { status: 200, headers, type: DURABLE_JSON, page: { json: this.#pageJson(page.events), next } }
  }

  #pageJson (events: StoredEvent[]): string {
    const last = this.#lastPage.events
    if (events.length !== last.length || events.some((event, i) => event !== last[i])) {
      this.#lastPage = { events, json: `[${events.map((event) => event.json).join(',')}]` }
    }
    return this.#lastPage.json
  }
}
