/** A request the API refused, or could not be sent: one line says what, with the status and the URL. */
export class ApiError extends Error {
  override name = 'ApiError'
  /** The HTTP status; 0 when no answer came (the service unreachable). */
  readonly status: number
  /** The envelope's `code` (`not_found`, `bad_request`, `unauthorized`, `unavailable`, `cursor_expired`, `too_many_requests`, `internal`); `network` when no answer came, `http_error` when the answer was not the envelope (a proxy's page). */
  readonly code: string
  readonly url: string
  /** The envelope's message, or what went wrong. */
  readonly detail: string

  constructor (status: number, code: string, detail: string, url: string) {
    super(`${detail} (${status === 0 ? 'no answer' : `HTTP ${status}`} ${code}, ${url})`)
    this.status = status
    this.code = code
    this.detail = detail
    this.url = url
  }

  /** Whether trying again later may succeed: no answer, overloaded, unavailable, a proxy's gateway error. */
  get transient (): boolean {
    return this.status === 0 || this.status === 429 || this.status === 502 || this.status === 503 || this.status === 504
  }

  /** Whether the request itself is refused, so that retrying it cannot succeed: a bad parameter (400), a missing or refused token (401, 403), an unknown id (404). Every live loop ends on one. */
  get terminal (): boolean {
    return this.status === 400 || this.status === 401 || this.status === 403 || this.status === 404
  }
}

/** A 410 `cursor_expired`: the history kept has moved past the cursor. Refetch what you show and resume from that read's eventCursor. */
export class CursorExpired extends ApiError {
  override name = 'CursorExpired'

  /** The event id refused: the request's `after_event_id`. */
  get cursor (): number {
    return Number(new URL(this.url).searchParams.get('after_event_id'))
  }
}

/** The error for a non-2xx answer, from its envelope when it has one. */
export async function errorFromResponse (response: Response, url: string): Promise<ApiError> {
  let code = 'http_error'
  let detail = `${response.status} ${response.statusText}`.trim()
  try {
    const envelope = JSON.parse(await response.text()) as { error?: { code?: unknown, message?: unknown } }
    if (typeof envelope.error?.code === 'string') code = envelope.error.code
    if (typeof envelope.error?.message === 'string' && envelope.error.message !== '') detail = envelope.error.message
  } catch {} // not JSON: a proxy's error page; the status says enough
  return code === 'cursor_expired' ? new CursorExpired(response.status, code, detail, url) : new ApiError(response.status, code, detail, url)
}

/** The error for a request that got no answer (refused, reset, DNS). */
export function networkError (error: unknown, url: string): ApiError {
  const cause = (error as { cause?: { code?: string, message?: string } }).cause
  // Never empty: some failures carry no message (an abort, a reset), but every error has a name.
  const reason = cause?.code || cause?.message || (error as Error).message || (error as Error).name
  return new ApiError(0, 'network', `cannot reach the service: ${reason}`, url)
}
