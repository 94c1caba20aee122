/*
 * The query parameters that carry a credential (the stream routes'), which
 * no log line, trace or metric may show. No imports: tracing.ts reads it
 * before the modules it instruments load.
 */

export const URL_CREDENTIALS = ['stream_token', 'access_token']

const CREDENTIAL_VALUE = new RegExp(`([?&](?:${URL_CREDENTIALS.join('|')})=)[^&#]*`, 'gi')

/** A URL (or path and query) with every credential's value replaced by `[redacted]`. */
export function withoutCredentials (url: string): string {
  return url.replace(CREDENTIAL_VALUE, '$1[redacted]')
}
