import { ApiError, CursorExpired, errorFromResponse, networkError } from './errors.ts'
import { readSse } from './sse.ts'
import type { AuthInfo, BlockedTaskList, Event, EventList, RunDetailEnvelope, RunList, StreamToken, TaskDetailEnvelope, TaskList, ThreadDetailEnvelope } from './types.ts'

/**
 * Where the bearer token comes from: the token itself, or a function asked
 * before each request (a short-lived identity-provider token that a caller
 * renews, say); undefined or '' sends none.
 */
export type TokenSource = string | undefined | (() => string | undefined | Promise<string | undefined>)

export interface ClientOptions {
  /** The service's base URL, e.g. `http://127.0.0.1:8080` (in a page: `location.origin`). */
  url: string
  /** A bearer token (a static token of API_TOKENS, or a JWT of an issuer in AUTH_ISSUERS), or a function that returns one. Sent as the Authorization header, never in a URL. */
  token?: TokenSource
  /** watch()'s default for its `streamTokens` option (default false). */
  streamTokens?: boolean
  /** The fetch to use (default: the global one). */
  fetch?: typeof fetch
  /** How many read bodies to keep, one per URL, for `If-None-Match` (default 100). */
  cacheSize?: number
}

/** Keyset paging: `cursor` is the page key of the next page, from the `Link: rel="next"` header (not an event id). */
export interface PageQuery {
  limit?: number
  cursor?: string
}

export interface RunsQuery extends PageQuery {
  /** Only runs in this status, or in any of these. */
  status?: string | string[]
  /** Only runs with at least one task in status `blocked` (waiting on an answer). */
  blocked?: boolean
}

export interface EventFilter {
  run_id?: string
  thread_id?: string
}

export interface EventsQuery extends EventFilter {
  after_event_id?: number
  limit?: number
}

/** A read's body with what its headers said. */
export interface Read<T> {
  body: T
  /** X-Event-Cursor: subscribe after it to miss nothing since this read. */
  eventCursor?: number
  /** The page key of the next page (pass it as `cursor`), when the `Link` header names one. */
  next?: string
  /** The service answered 304 (or the same bytes): the body is the one read before. */
  unchanged: boolean
}

/** What a stream (or a live loop's read) is doing, for a "live" indicator. */
export type StreamStatus =
  | { state: 'connecting' }
  | { state: 'live' }
  /** `reason` is never empty: the refusal's message (also in `error`), or why the stream ended. */
  | { state: 'retrying', delayMs: number, reason: string, error?: ApiError }

export interface WatchOptions {
  /** Resume after this event_id; 0: from the oldest event kept (never a 410 for it). Default: from now. */
  after?: number
  signal?: AbortSignal
  onStatus?: (status: StreamStatus) => void
  /** The longest wait between two reconnects (default 10 s). */
  maxDelayMs?: number
  /**
   * Open the stream with a stream token (GET /api/stream-token) scoped to
   * `filter`, in its URL, rather than with the client's token in the
   * Authorization header: the long-lived token then never reaches the
   * stream's connections. One is kept until shortly before it expires; a
   * reconnect it is refused for (401) fetches a fresh one and tries again
   * at once, and only a second 401 in a row ends the watch. Without a
   * token (the service needs none) the stream opens as usual.
   * Default: the client's `streamTokens` option.
   */
  streamTokens?: boolean
}

/** A stream token is taken for a new connection until this long before it expires. */
const STREAM_TOKEN_MARGIN_MS = 15_000

const DEFAULT_RETRY_MS = 500
/** A stream that stayed open this long was healthy, even if quiet: its end is no reason to back off. */
const HEALTHY_STREAM_MS = 10_000

/** Waits `ms`, or less if `signal` aborts. */
export function delay (ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) { resolve(); return }
    const done = () => { clearTimeout(timer); signal?.removeEventListener('abort', done); resolve() }
    const timer = setTimeout(done, ms)
    signal?.addEventListener('abort', done, { once: true })
  })
}

/** Exponential backoff with jitter: attempt 0 waits about `baseMs`. */
export function backoff (attempt: number, baseMs: number, maxMs: number): number {
  const ceiling = Math.min(maxMs, baseMs * 2 ** Math.min(attempt, 20))
  return Math.round(ceiling / 2 + (Math.random() * ceiling) / 2)
}

/** The page key (the `cursor` parameter) of a `Link: <...>; rel="next"` header (RFC 8288); null when there is none. */
function nextPageKey (link: string | null): string | null {
  const target = /<([^>]*)>\s*;\s*rel="?next"?/.exec(link ?? '')?.[1]
  return target === undefined ? null : new URL(target, 'http://link.invalid').searchParams.get('cursor')
}

function query (params: Record<string, string | number | undefined>): string {
  const search = new URLSearchParams()
  for (const [name, value] of Object.entries(params)) if (value !== undefined) search.set(name, String(value))
  const text = search.toString()
  return text === '' ? '' : `?${text}`
}

const id = (value: string) => encodeURIComponent(value)

export type Reader = ReturnType<typeof createReader>

/** The reads and the stream of one service. Every read resolves to the 200 body, or rejects with an ApiError. */
export function createReader (options: ClientOptions) {
  const base = options.url.replace(/\/+$/, '')
  const fetcher = options.fetch ?? ((input, init) => fetch(input, init))
  const cacheSize = options.cacheSize ?? 100
  let tokenSource: TokenSource = options.token
  /** The last body read per URL, with its ETag: sent back as If-None-Match. */
  const cache = new Map<string, { etag?: string, text: string, body: unknown }>()

  /** The token to send now; undefined for none. */
  async function currentToken (): Promise<string | undefined> {
    const token = typeof tokenSource === 'function' ? await tokenSource() : tokenSource
    return token === '' ? undefined : token
  }

  /**
   * Another token from now on (signed in as someone else), or none (signed
   * out). The bodies kept for If-None-Match are dropped: they were read
   * with the old one. Loops already running send the new token with their
   * next request.
   */
  function setToken (token: TokenSource): void {
    tokenSource = token
    cache.clear()
  }

  /** GET `path`; with the client's token as a bearer header unless `anonymous` (a URL that carries its own credential). */
  async function send (path: string, headers: Record<string, string>, signal?: AbortSignal, anonymous = false): Promise<Response> {
    const url = `${base}${path}`
    let response: Response
    try {
      const token = anonymous ? undefined : await currentToken()
      response = await fetcher(url, { headers: { ...(token === undefined ? {} : { authorization: `Bearer ${token}` }), ...headers }, signal })
    } catch (error) {
      /* c8 ignore next: closed while a request was under way (timing) */
      if (signal?.aborted) throw error
      throw networkError(error, url)
    }
    if (!response.ok && response.status !== 304) throw await errorFromResponse(response, url)
    return response
  }

  /** GET `path` as JSON, with If-None-Match when an earlier body of it is kept. */
  async function read<T> (path: string, signal?: AbortSignal): Promise<Read<T>> {
    const kept = cache.get(path)
    const response = await send(path, { accept: 'application/json', ...(kept?.etag ? { 'if-none-match': kept.etag } : {}) }, signal)
    const cursorHeader = response.headers.get('x-event-cursor')
    const next = nextPageKey(response.headers.get('link'))
    const meta = {
      ...(cursorHeader === null ? {} : { eventCursor: Number(cursorHeader) }),
      ...(next === null ? {} : { next })
    }
    cache.delete(path) // re-inserted below: the map's order is least recently used first
    if (response.status === 304 && kept !== undefined) {
      cache.set(path, kept)
      return { body: kept.body as T, ...meta, unchanged: true }
    }
    const text = await response.text()
    const unchanged = kept !== undefined && kept.text === text
    const body = unchanged ? kept.body : JSON.parse(text)
    cache.set(path, { etag: response.headers.get('etag') ?? undefined, text, body })
    if (cache.size > cacheSize) cache.delete(cache.keys().next().value!)
    return { body: body as T, ...meta, unchanged }
  }

  const statusParam = (status: RunsQuery['status']) => (Array.isArray(status) ? status.join(',') : status) || undefined

  const reads = {
    runsRead: (q: RunsQuery = {}, signal?: AbortSignal) => read<RunList>(`/api/runs${query({ status: statusParam(q.status), blocked: q.blocked === true ? 'true' : undefined, limit: q.limit, cursor: q.cursor })}`, signal),
    runRead: (runId: string, signal?: AbortSignal) => read<RunDetailEnvelope>(`/api/runs/${id(runId)}`, signal),
    tasksRead: (runId: string, q: PageQuery = {}, signal?: AbortSignal) => read<TaskList>(`/api/runs/${id(runId)}/tasks${query({ limit: q.limit, cursor: q.cursor })}`, signal),
    taskRead: (runId: string, taskId: string, signal?: AbortSignal) => read<TaskDetailEnvelope>(`/api/runs/${id(runId)}/tasks/${id(taskId)}`, signal),
    blockedRead: (runId: string, signal?: AbortSignal) => read<BlockedTaskList>(`/api/runs/${id(runId)}/blocked`, signal),
    threadRead: (threadId: string, signal?: AbortSignal) => read<ThreadDetailEnvelope>(`/api/threads/${id(threadId)}`, signal),
    eventsRead: (q: EventsQuery = {}, signal?: AbortSignal) => read<EventList>(`/api/events${query({ after_event_id: q.after_event_id, run_id: q.run_id || undefined, thread_id: q.thread_id || undefined, limit: q.limit })}`, signal)
  }
  const body = <T>(read: Promise<Read<T>>) => read.then((result) => result.body)

  /** The filter as the service takes it: an empty one is none (the service refuses `?run_id=`). */
  const filterParams = (filter: EventFilter) => ({ run_id: filter.run_id || undefined, thread_id: filter.thread_id || undefined })

  /**
   * A stream token: short-lived, signed by the service, and good only to
   * open streams within `filter` (a run's, a thread's; none: every stream),
   * as `stream_token` in a stream's URL. Asked for with the client's token,
   * never kept by the service's caches (no-store).
   */
  async function streamToken (filter: EventFilter = {}, signal?: AbortSignal): Promise<StreamToken> {
    const response = await send(`/api/stream-token${query(filterParams(filter))}`, { accept: 'application/json' }, signal)
    return await response.json() as StreamToken
  }

  /**
   * The stream's URL (for a browser EventSource, which cannot send
   * headers): with `streamToken` as `stream_token` when given. It never
   * carries the client's own token: see signedStreamUrl.
   */
  function streamUrl (filter: EventFilter = {}, after?: number, streamToken?: string): string {
    return `${base}/api/events/stream${query({ ...filterParams(filter), after_event_id: after, stream_token: streamToken || undefined })}`
  }

  /**
   * The stream's URL with a fresh stream token for `filter`, for an
   * EventSource: `new EventSource(await client.signedStreamUrl({ run_id }))`.
   * Its token opens new connections for a few minutes (an open one stays
   * open): on an error after that, ask for another URL. Without a token
   * (the service needs none), the plain URL.
   */
  async function signedStreamUrl (filter: EventFilter = {}, after?: number, signal?: AbortSignal): Promise<string> {
    if (await currentToken() === undefined) return streamUrl(filter, after)
    return streamUrl(filter, after, (await streamToken(filter, signal)).token)
  }

  /** What the service says of authentication (GET /api/auth, which needs no token): whether it is on, and the identity provider a page signs in with, if any. */
  async function auth (signal?: AbortSignal): Promise<AuthInfo> {
    const response = await send('/api/auth', { accept: 'application/json' }, signal, true)
    return await response.json() as AuthInfo
  }

  /** Where to start to get every event kept that matches `filter`: just before the oldest such event, else the read's position. */
  async function oldestKeptCursor (filter: EventFilter, signal: AbortSignal): Promise<number> {
    const page = await reads.eventsRead({ ...filter, limit: 1 }, signal)
    const [oldest] = page.body.events
    /* c8 ignore next: ?? 0 only for a service that sends no X-Event-Cursor */
    return oldest === undefined ? page.eventCursor ?? 0 : oldest.event_id - 1
  }

  /**
   * The events matching `filter`, live, in ascending event_id, each once:
   * reconnects with backoff and resumes after the last id received. A
   * refusal that retrying may fix (no answer, 503, a 200 stream that ends at
   * once) is retried; a 410 throws CursorExpired (but for `after: 0`, which
   * then starts from the oldest event kept), any other refusal ApiError.
   */
  async function * watch (filter: EventFilter = {}, watchOptions: WatchOptions = {}): AsyncGenerator<Event, void, undefined> {
    const { signal, onStatus } = watchOptions
    const maxDelayMs = watchOptions.maxDelayMs ?? 10_000
    const useStreamTokens = watchOptions.streamTokens ?? options.streamTokens ?? false
    /** The stream token kept for the next connection, and when (by this clock) to stop taking it. */
    let kept: { token: string, until: number } | undefined
    /** The last attempt's stream token was refused (401): one more, with a fresh token, before giving up. */
    let refusedToken = false
    let retryMs = DEFAULT_RETRY_MS
    let attempt = 0
    let last = watchOptions.after
    // Every event kept was asked for (after 0): until the stream moves on from 0, a 410 only says that the oldest kept is past 0.
    let fromOldest = last === 0
    let findOldest = false
    const retry = async (reason: string, error?: ApiError) => {
      const delayMs = backoff(attempt++, retryMs, maxDelayMs)
      onStatus?.({ state: 'retrying', delayMs, reason, ...(error === undefined ? {} : { error }) })
      await delay(delayMs, signal)
    }
    while (!signal?.aborted) {
      onStatus?.({ state: 'connecting' })
      const controller = new AbortController()
      const abort = () => controller.abort()
      signal?.addEventListener('abort', abort, { once: true })
      try {
        // Without an event id to resume after, "from now" is fixed first, by the position of the smallest read (any read carries one), so that a reconnect resumes from there.
        /* c8 ignore next: ?? 0 only for a service that sends no X-Event-Cursor */
        last ??= (await reads.runsRead({ limit: 1 }, controller.signal)).eventCursor ?? 0
        if (findOldest) {
          last = await oldestKeptCursor(filter, controller.signal)
          findOldest = false
        }
        let token: string | undefined
        if (useStreamTokens && await currentToken() !== undefined) {
          if (kept === undefined || Date.now() >= kept.until) {
            const grant = await streamToken(filter, controller.signal)
            kept = { token: grant.token, until: Date.parse(grant.expires_at) - STREAM_TOKEN_MARGIN_MS }
          }
          token = kept.token
        }
        const path = streamUrl(filter, last, token).slice(base.length)
        let response: Response
        try {
          response = await send(path, { accept: 'text/event-stream' }, controller.signal, token !== undefined)
        } catch (error) {
          // A stream token refused (expired, or its key rotated): a fresh one, at once, but only once in a row.
          if (token === undefined || !(error instanceof ApiError) || error.status !== 401 || refusedToken) throw error
          refusedToken = true
          kept = undefined
          continue
        }
        refusedToken = false
        const openedAt = Date.now()
        let announced = false
        let received = false
        let said = ''
        for await (const block of readSse(response.body!)) {
          // A stream refused for a transient reason opens with a block that says why (a comment), then ends: not live.
          if (!announced && block.comment === undefined) {
            onStatus?.({ state: 'live' })
            announced = true
          }
          if (block.retry !== undefined) retryMs = block.retry
          if (block.comment !== undefined) said = block.comment
          if (block.id !== undefined && /^\d+$/.test(block.id)) {
            received = true
            fromOldest = false
            last = Number(block.id)
          }
          if (block.data !== undefined) yield JSON.parse(block.data) as Event
        }
        // The stream ended: at once if it had been healthy, else (a refusal sent as a stream that ends) after a backoff.
        if (received || Date.now() - openedAt >= HEALTHY_STREAM_MS) attempt = 0
        if (!signal?.aborted) await retry(said === '' ? 'the stream ended' : `the stream ended: ${said}`)
      } catch (error) {
        if (signal?.aborted) return
        if (error instanceof CursorExpired && fromOldest) {
          findOldest = true
          continue
        }
        if (error instanceof CursorExpired || (error instanceof ApiError && !error.transient)) throw error
        /* c8 ignore next: a connection reset mid-stream (the body's reader throws a TypeError), not reproducible on loopback */
        const failure = error instanceof ApiError ? error : networkError(error, `${base}/api/events/stream`)
        await retry(failure.detail, failure)
      } finally {
        signal?.removeEventListener('abort', abort)
        controller.abort() // the consumer stopped iterating, or the stream ended: release the connection
      }
    }
  }

  return {
    url: base,
    ...reads,
    runs: (q?: RunsQuery, signal?: AbortSignal) => body(reads.runsRead(q, signal)),
    run: (runId: string, signal?: AbortSignal) => body(reads.runRead(runId, signal)),
    tasks: (runId: string, q?: PageQuery, signal?: AbortSignal) => body(reads.tasksRead(runId, q, signal)),
    task: (runId: string, taskId: string, signal?: AbortSignal) => body(reads.taskRead(runId, taskId, signal)),
    blocked: (runId: string, signal?: AbortSignal) => body(reads.blockedRead(runId, signal)),
    thread: (threadId: string, signal?: AbortSignal) => body(reads.threadRead(threadId, signal)),
    events: (q?: EventsQuery, signal?: AbortSignal) => body(reads.eventsRead(q, signal)),
    auth,
    streamToken,
    streamUrl,
    signedStreamUrl,
    setToken,
    watch
  }
}
