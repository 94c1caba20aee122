import { backoff, delay, type EventFilter, type Reader, type Read, type RunsQuery, type StreamStatus } from './client.js'
import { ApiError, CursorExpired } from './errors.js'
import type { RunDetailEnvelope, RunList, ThreadDetailEnvelope } from './types.js'

export interface LiveOptions {
  /** A read or stream refused for a reason retrying will not fix (404, 401, 400): the loop retries it slowly all the same. */
  onError?: (error: ApiError) => void
  onStatus?: (status: StreamStatus) => void
  /** The longest wait between two attempts (default 10 s). */
  maxDelayMs?: number
}

export interface Live {
  close: () => void
}

/** A whole read and what its headers said (its next page, the position it was read at). */
export type OnSnapshot<T> = (body: T, read: Read<T>) => void

/**
 * List-then-watch: read, hand out the body, subscribe from the read's
 * X-Event-Cursor, and read again on events (one read at a time; events
 * arriving during a read cause one more). On 410 cursor_expired it reads
 * and subscribes again. Only whole reads are handed out, never a body
 * patched from events, and a body equal to the last one is not handed out
 * again; after a quiet period the last one handed out equals a fresh read.
 */
export function live<T> (client: Reader, read: (signal: AbortSignal) => Promise<Read<T>>, filter: EventFilter, onSnapshot: OnSnapshot<T>, options: LiveOptions = {}): Live {
  const controller = new AbortController()
  const { signal } = controller
  const maxDelayMs = options.maxDelayMs ?? 10_000
  let latest: Read<T> | undefined
  let delivered: T | undefined
  let refreshing: Promise<void> | undefined
  let again = false

  /** Reads until one succeeds (or the loop is closed). */
  async function readOnce (): Promise<void> {
    for (let attempt = 0; !signal.aborted; attempt++) {
      try {
        const result = await read(signal)
        /* c8 ignore next: closed while a read was under way (timing) */
        if (signal.aborted) return
        latest = result
        if (result.body !== delivered) {
          delivered = result.body
          onSnapshot(result.body, result)
        }
        return
      } catch (error) {
        /* c8 ignore next 2: closed mid-read (timing); anything but an ApiError is a bug, for the loop's catch */
        if (signal.aborted) return
        if (!(error instanceof ApiError)) throw error
        if (!error.transient) options.onError?.(error)
        const delayMs = backoff(attempt, error.transient ? 500 : 2000, maxDelayMs)
        options.onStatus?.({ state: 'retrying', delayMs, error })
        await delay(delayMs, signal)
      }
    }
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
        await readOnce()
      } while (again && !signal.aborted)
    })().finally(() => { refreshing = undefined })
    return refreshing
  }

  async function loop (): Promise<void> {
    while (!signal.aborted) {
      await refresh()
      if (signal.aborted) return
      try {
        const events = client.watch(filter, {
          after: latest?.eventCursor,
          signal,
          maxDelayMs,
          ...(options.onStatus === undefined ? {} : { onStatus: options.onStatus })
        })
        for await (const _event of events) void refresh()
      } catch (error) {
        /* c8 ignore next: closed while the stream was refused (timing) */
        if (signal.aborted) return
        if (error instanceof CursorExpired) continue // the history moved past our cursor: read again, subscribe from there
        /* c8 ignore next: anything but an ApiError is a bug, for the loop's catch */
        if (!(error instanceof ApiError)) throw error
        options.onError?.(error)
        await delay(backoff(0, 2000, maxDelayMs), signal)
      }
    }
  }

  void loop().catch((error: unknown) => {
    /* c8 ignore next 2: only a bug in onSnapshot or onError lands here */
    options.onError?.(new ApiError(0, 'internal', `the live loop stopped: ${(error as Error).message}`, client.url))
  })
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
