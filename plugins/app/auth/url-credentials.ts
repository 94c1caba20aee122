/*
 * The query parameters that carry a credential (the stream routes'), which
 * no log line, trace or metric may show. No imports: tracing.ts reads it
 * before the modules it instruments load.
 */

export const URL_CREDENTIALS = ['stream_token', 'access_token']

const CREDENTIALS = new Set(URL_CREDENTIALS)

/** A parameter's name as a query parser reads it (`+` a space, each `%XX` its byte), lower-cased; a malformed escape stays as written. */
const decodedName = (name: string) => name.replace(/\+/g, ' ')
  .replace(/%([0-9a-f]{2})/gi, (_, hex: string) => String.fromCharCode(Number.parseInt(hex, 16))).toLowerCase()

/**
 * A URL (or path and query) with every credential's value replaced by
 * `[redacted]`: every parameter whose name, decoded as Fastify's query
 * parser decodes it, is one of URL_CREDENTIALS (`stream%5Ftoken`,
 * `%73tream_token` too), in any case, split at `;` as well as `&` (a parser
 * in front may split there): a superset of what the service accepts.
 */
export function withoutCredentials (url: string): string {
  const start = url.indexOf('?')
  if (start === -1) return url
  const parts = url.slice(start + 1).split(/([&;])/)
  for (let i = 0; i < parts.length; i += 2) {
    const part = parts[i]!
    const equals = part.indexOf('=')
    if (equals !== -1 && CREDENTIALS.has(decodedName(part.slice(0, equals)))) parts[i] = `${part.slice(0, equals)}=[redacted]`
  }
  return `${url.slice(0, start + 1)}${parts.join('')}`
}

/** A URL's path alone, without its query: what a trace's span carries. */
export const pathOf = (url: string) => {
  const start = url.indexOf('?')
  return start === -1 ? url : url.slice(0, start)
}
