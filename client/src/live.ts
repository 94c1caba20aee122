import { backoff, delay, type EventFilter, type Reader, type Read, type RunsQuery, type StreamStatus } from './client.ts'
import { ApiError, CursorExpired } from './errors.ts'
import type { Event, RunDetailEnvelope, RunList, ThreadDetailEnvelope } from './types.ts'

export interface LiveOptions {
  /** The loop ended on a refusal retrying cannot fix (`error.terminal`: 400, 401, 403, 404); nothing more is read. Any other failure is retried, and reported to onStatus. */
  onError?: (error: ApiError) => void
  onStatus?: (status: StreamStatus) => void
  /** The longest wait between two attempts (default 10 s). */
  maxDelayMs?: number
}

export interface FollowOptions {
  signal?: AbortSignal
  onStatus?: (status: StreamStatus) => void
  /** The longest wait between two attempts (default 10 s). */
  maxDelayMs?: number
}

export interface Live {
  close: () => void
}

/** A whole read and what its headers said (its next page, the position it was read at). */
export type OnSnapshot<T> = (body: T, read: Read<T>) => void

/** What a follow loop yields: a whole read (the first, and a fresh one after a 410), or one event after it. */
export type Followed<T> =
  | { kind: 'read', body: T, read: Read<T> }
  | { kind: 'event', event: Event }

type ReadFunction<T> = (signal?: AbortSignal) => Promise<Read<T>>

/**
 * Reads until one succeeds; undefined once `signal` aborts. A refusal
 * retrying cannot fix (ApiError.terminal) throws; any other is reported as
 * `retrying` and retried with backoff (slowly when it is not transient).
 */
async function readRetrying<T> (read: ReadFunction<T>, options: FollowOptions): Promise<Read<T> | undefined> {
  const { signal } = options
  for (let attempt = 0; !signal?.aborted; attempt++) {
    try {
      const result = await read(signal)
      /* c8 ignore next: closed while a read was under way (timing) */
      return signal?.aborted ? undefined : result
    } catch (error) {
      /* c8 ignore next 2: closed mid-read (timing); anything but an ApiError is a bug, for the caller */
      if (signal?.aborted) return undefined
      if (!(error instanceof ApiError) || error.terminal) throw error
      const delayMs = backoff(attempt, error.transient ? 500 : 2000, options.maxDelayMs ?? 10_000)
      options.onStatus?.({ state: 'retrying', delayMs, reason: error.detail, error })
      await delay(delayMs, signal)
    }
  }
  return undefined
}

/**
 * List-then-watch, as items: a whole read, then each event matching
 * `filter` after that read's X-Event-Cursor (so none is missed nor seen
 * twice). On 410 cursor_expired it reads again (yielding that read) and
 * watches from there. Failures retrying may fix are retried; a refusal it
 * cannot (ApiError.terminal: an unknown id, a refused token) throws. Ends
 * when `signal` aborts, or when the consumer stops iterating.
 */
export async function * follow<T> (client: Reader, read: ReadFunction<T>, filter: EventFilter, options: FollowOptions = {}): AsyncGenerator<Followed<T>, void, undefined> {
  const { signal } = options
  const maxDelayMs = options.maxDelayMs ?? 10_000
  while (!signal?.aborted) {
    const result = await readRetrying(read, options)
    if (result === undefined) return
    yield { kind: 'read', body: result.body, read: result }
    let after = result.eventCursor
    while (!signal?.aborted) {
      try {
        for await (const event of client.watch(filter, { ...options, after, maxDelayMs })) {
          after = event.event_id
          yield { kind: 'event', event }
        }
        return // watch ends only when signal aborts
      } catch (error) {
        /* c8 ignore next: closed while the stream was refused (timing) */
        if (signal?.aborted) return
        if (error instanceof CursorExpired) break // the history moved past the cursor: read again, watch from there
        /* c8 ignore next: anything but an ApiError is a bug */
        if (!(error instanceof ApiError) || error.terminal) throw error
        // Neither transient nor terminal (a 500): slowly, from the last event.
        const delayMs = backoff(0, 2000, maxDelayMs)
        options.onStatus?.({ state: 'retrying', delayMs, reason: error.detail, error })
        await delay(delayMs, signal)
      }
    }
  }
}

/**
 * Snapshots, kept current: read, hand out the body, subscribe from the
 * read's X-Event-Cursor, and read again on events (one read at a time;
 * events arriving during a read cause one more). On 410 cursor_expired it
 * reads and subscribes again. Only whole reads are handed out, never a body
 * patched from events, and a body equal to the last one is not handed out
 * again; after a quiet period the last one handed out equals a fresh read.
 * A refusal retrying cannot fix ends it, through onError.
 */
export function live<T> (client: Reader, read: ReadFunction<T>, filter: EventFilter, onSnapshot: OnSnapshot<T>, options: LiveOptions = {}): Live {
  const controller = new AbortController()
  const { signal } = controller
  const loopOptions: FollowOptions = { signal, maxDelayMs: options.maxDelayMs ?? 10_000, ...(options.onStatus === undefined ? {} : { onStatus: options.onStatus }) }
  let latest: Read<T> | undefined
  let delivered: T | undefined
  let refreshing: Promise<void> | undefined
  let again = false

  /** Ends the loop, once: a terminal refusal, or (a bug in onSnapshot) anything else. */
  const end = (error: unknown) => {
    /* c8 ignore next: a second failure while the first ended the loop (timing) */
    if (signal.aborted) return
    controller.abort()
    /* c8 ignore next: only a bug in onSnapshot is not an ApiError */
    options.onError?.(error instanceof ApiError ? error : new ApiError(0, 'internal', `the live loop stopped: ${(error as Error).message}`, client.url))
  }

  /** Coalesced: while a read runs, any number of calls cause one more read after it. */
  function refresh (): Promise<void> {
    if (refreshing !== undefined) {
      again = true
      return refreshing
    }
    refreshing = (async () => {
      do {
        again = false
        const result = await readRetrying(read, loopOptions)
        if (result === undefined) return
        latest = result
        if (result.body !== delivered) {
          delivered = result.body
          onSnapshot(result.body, result)
        }
      } while (again && !signal.aborted)
    })().finally(() => { refreshing = undefined })
    return refreshing
  }

  // follow's own reads (the first, and after a 410) go through refresh too: one read at a time.
  const readLatest = async () => {
    await refresh()
    return latest!
  }
  void (async () => {
    for await (const item of follow(client, readLatest, filter, loopOptions)) {
      if (item.kind === 'event') refresh().catch(end)
    }
  })().catch(end)
  return { close: () => controller.abort() }
}

/** A run's detail, live. */
export const liveRun = (client: Reader, runId: string, onSnapshot: OnSnapshot<RunDetailEnvelope>, options?: LiveOptions): Live =>
  live(client, (signal) => client.runRead(runId, signal), { run_id: runId }, onSnapshot, options)

/** A thread with its messages, live. */
export const liveThread = (client: Reader, threadId: string, onSnapshot: OnSnapshot<ThreadDetailEnvelope>, options?: LiveOptions): Live =>
  live(client, (signal) => client.threadRead(threadId, signal), { thread_id: threadId }, onSnapshot, options)

/** A page of the run list, live (any event may change it). */
export const liveRuns = (client: Reader, query: RunsQuery, onSnapshot: OnSnapshot<RunList>, options?: LiveOptions): Live =>
  live(client, (signal) => client.runsRead(query, signal), {}, onSnapshot, options)

/** A run's detail, then each of its events (list-then-watch). */
export const followRun = (client: Reader, runId: string, options?: FollowOptions): AsyncGenerator<Followed<RunDetailEnvelope>, void, undefined> =>
  follow(client, (signal) => client.runRead(runId, signal), { run_id: runId }, options)

/** A thread with its messages, then each of its events. */
export const followThread = (client: Reader, threadId: string, options?: FollowOptions): AsyncGenerator<Followed<ThreadDetailEnvelope>, void, undefined> =>
  follow(client, (signal) => client.threadRead(threadId, signal), { thread_id: threadId }, options)

/** A page of the run list, then every event (any may change it). */
export const followRuns = (client: Reader, query: RunsQuery, options?: FollowOptions): AsyncGenerator<Followed<RunList>, void, undefined> =>
  follow(client, (signal) => client.runsRead(query, signal), {}, options)
