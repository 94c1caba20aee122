import type { onRequestHookHandler } from 'fastify'
import fp from 'fastify-plugin'
import helmet, { type HelmetOptions } from 'helmet'
import type { IncomingMessage, ServerResponse } from 'node:http'

/**
 * The security headers of pages (the web UI, /docs), as helmet sets them
 * with these options. The content security policy allows only this origin,
 * plus the inline styles and data: images the /docs page uses.
 */
export const helmetOptions: HelmetOptions = {
  contentSecurityPolicy: {
    directives: {
      defaultSrc: ["'self'"],
      scriptSrc: ["'self'"],
      styleSrc: ["'self'", "'unsafe-inline'"],
      imgSrc: ["'self'", 'data:'],
      connectSrc: ["'self'"],
      objectSrc: ["'none'"],
      frameAncestors: ["'none'"]
    }
  },
  // The API is read by browser UIs on other origins (CORS_ORIGINS).
  crossOriginResourcePolicy: { policy: 'cross-origin' },
  hsts: false // TLS is terminated in front of the service, which sets it
}

/**
 * The headers helmet sets with these options: they depend on nothing else
 * (no nonces), so they are computed once, by helmet itself, on a response
 * that only records them. (@fastify/helmet rebuilds helmet's middleware,
 * parsing the policy, on every request: a tenth of /health's time in the
 * profile of BENCHMARKS.md. test/security-headers.test.ts checks that the
 * headers are exactly those @fastify/helmet sets with the same options.)
 */
export function securityHeaders (): Record<string, string> {
  const headers: Record<string, string> = {}
  const recorder = {
    setHeader: (name: string, value: unknown) => { headers[name.toLowerCase()] = String(value) },
    removeHeader: () => {}
  }
  helmet(helmetOptions)({} as IncomingMessage, recorder as unknown as ServerResponse, (err) => {
    /* c8 ignore next: helmet rejects only invalid options, and these are constant */
    if (err !== undefined) throw err
  })
  return headers
}

/**
 * What every answer carries, an answer of the API being data that a
 * browser never renders as a page: no sniffing it into HTML or script, and
 * a policy that allows nothing and no framing (what OWASP's REST Security
 * Cheat Sheet asks of APIs; frame-ancestors is what X-Frame-Options was).
 * Helmet's other headers govern documents: the page's policy, referrers,
 * opener and agent-cluster isolation, DNS prefetch, the old IE and Flash
 * switches, and the cross-origin resource policy (which CORS reads, the
 * API's only cross-origin use, never consult). On the probes, the API and
 * its errors they only cost: the twelve were a quarter of /health's time,
 * and each header costs about 0.2 µs a request (BENCHMARKS.md).
 */
export const API_SECURITY_HEADERS: Readonly<Record<string, string>> = {
  'content-security-policy': "default-src 'none'; frame-ancestors 'none'",
  'x-content-type-options': 'nosniff'
}

/** Routes that answer data, never a page: the API, the probes, the metrics and the OpenAPI document. */
const DATA_ROUTES = new Set(['/health', '/ready', '/metrics', '/openapi.json'])
export const servesPages = (url: string) => !url.startsWith('/api/') && !DATA_ROUTES.has(url)

/**
 * Security headers: the API's on every answer, errors and unknown routes
 * included (their bodies are the JSON envelope); helmet's whole set on the
 * routes that serve pages (the web UI, /docs), added by a hook of those
 * routes, so that no request pays for a choice.
 */
export default fp(async function helmetPlugin (app) {
  const pageHeaders = securityHeaders()
  app.addHook('onRequest', (_request, reply, done) => {
    reply.headers(API_SECURITY_HEADERS)
    done()
  })
  const setPageHeaders: onRequestHookHandler = (_request, reply, done) => {
    reply.headers(pageHeaders)
    done()
  }
  app.addHook('onRoute', (route) => {
    if (servesPages(route.url)) route.onRequest = [...[route.onRequest ?? []].flat(), setPageHeaders]
  })
}, { name: 'helmet' })
