/*
 * ocp-api-client: the typed client of ocp-api, for browsers and Node (SSE
 * read over fetch: no EventSource needed). Reads, the live event stream,
 * and list-then-watch in one call: as snapshots (live*) or as a read then
 * its events (follow*). The package's bin is the ocp-api command (cli.ts).
 */
import { createReader, type ClientOptions, type RunsQuery } from './client.ts'
import { followRun, followRuns, followThread, liveRun, liveRuns, liveThread, type FollowOptions, type LiveOptions, type OnSnapshot } from './live.ts'
import type { RunDetailEnvelope, RunList, ThreadDetailEnvelope } from './types.ts'

export { ApiError, CursorExpired } from './errors.ts'
export { MAX_PAGE_LIMIT } from './types.ts'
export type { ClientOptions, EventFilter, EventsQuery, PageQuery, Read, RunsQuery, StreamStatus, TokenSource, WatchOptions } from './client.ts'
export type { FollowOptions, Followed, Live, LiveOptions, OnSnapshot } from './live.ts'
export type * from './types.ts'

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
    liveRuns: (query: RunsQuery, onSnapshot: OnSnapshot<RunList>, liveOptions?: LiveOptions) => liveRuns(reader, query, onSnapshot, liveOptions),
    /** A run's detail, then each of its events: `{ kind: 'read', body }` first (and after a 410), then `{ kind: 'event', event }`. */
    followRun: (runId: string, followOptions?: FollowOptions) => followRun(reader, runId, followOptions),
    /** A thread and its messages, then each of its events. */
    followThread: (threadId: string, followOptions?: FollowOptions) => followThread(reader, threadId, followOptions),
    /** A page of the run list, then every event. */
    followRuns: (query: RunsQuery, followOptions?: FollowOptions) => followRuns(reader, query, followOptions)
  }
}
