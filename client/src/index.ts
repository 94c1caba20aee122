/*
 * ocp-api-client: the typed client of ocp-api, for browsers and Node (SSE
 * read over fetch: no EventSource needed). Reads, the live event stream,
 * and list-then-watch in one call.
 */
import { createReader, type ClientOptions, type RunsQuery } from './client.js'
import { liveRun, liveRuns, liveThread, type LiveOptions, type OnSnapshot } from './live.js'
import type { RunDetailEnvelope, RunList, ThreadDetailEnvelope } from './types.js'

export { ApiError, CursorExpired } from './errors.js'
export type { ClientOptions, EventFilter, EventsQuery, PageQuery, Read, RunsQuery, StreamStatus, WatchOptions } from './client.js'
export type { Live, LiveOptions, OnSnapshot } from './live.js'
export type * from './types.js'

export type Client = ReturnType<typeof createClient>

/** A client of the service at `options.url`. */
export function createClient (options: ClientOptions) {
  const reader = createReader(options)
  return {
    ...reader,
    /** A run's detail, kept current: `onSnapshot` gets each new whole read. */
    liveRun: (runId: string, onSnapshot: OnSnapshot<RunDetailEnvelope>, liveOptions?: LiveOptions) => liveRun(reader, runId, onSnapshot, liveOptions),
    /** A thread and its messages, kept current. */
    liveThread: (threadId: string, onSnapshot: OnSnapshot<ThreadDetailEnvelope>, liveOptions?: LiveOptions) => liveThread(reader, threadId, onSnapshot, liveOptions),
    /** A page of the run list, kept current (`read.next` is the next page's key, its `cursor`). */
    liveRuns: (query: RunsQuery, onSnapshot: OnSnapshot<RunList>, liveOptions?: LiveOptions) => liveRuns(reader, query, onSnapshot, liveOptions)
  }
}
