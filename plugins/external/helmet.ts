import type { onRequestHookHandler } from 'fastify'
import fp from 'fastify-plugin'
import helmet, { type HelmetOptions } from 'helmet'
import type { IncomingMessage, ServerResponse } from 'node:http'
import { withRouteHook } from '../route-hooks.ts'

/**
 * The inline scripts of the web UI's page, by hash: the one in ui/index.html
 * that preloads the runs list's first page (test/ui.test.ts checks them).
 */
export const UI_INLINE_SCRIPT_HASHES = ["'sha256-3mCQY9DYLkTl+yGb2RrZ9VFPDl0KaP0elGxTsgR+U5w='"]

/**
 * The inline styles of /docs, by hash: the <style> of swagger-ui's logo,
 * which its standalone preset draws (test/security-headers.test.ts checks
 * them against @fastify/swagger-ui's files, so an upgrade that changes them
 * fails there, not only in a browser's console).
 */
export const DOCS_INLINE_STYLE_HASHES = ["'sha256-RL3ie0nH+Lzz2YNqQN83mnU0J1ot4QL7b99vMdIX99w='"]

/**
 * Helmet's options: its whole set goes on pages (the web UI, /docs), its
 * content security policy and nosniff on every answer (see below). The
 * policy allows only this origin, plus the inline script and styles above
 * by their hashes (never any inline code) and the data: images the /docs
 * page uses.
 */
export const helmetOptions: HelmetOptions = {
  contentSecurityPolicy: {
    directives: {
      defaultSrc: ["'self'"],
      scriptSrc: ["'self'", ...UI_INLINE_SCRIPT_HASHES],
      styleSrc: ["'self'", ...DOCS_INLINE_STYLE_HASHES],
      imgSrc: ["'self'", 'data:'],
      connectSrc: ["'self'"],
      objectSrc: ["'none'"],
      frameAncestors: ["'none'"]
    }
  },
  // The UI's files may be embedded by pages of other origins.
  crossOriginResourcePolicy: { policy: 'cross-origin' },
  hsts: false // TLS is terminated in front of the service, which sets it
}

/**
 * The headers helmet sets with these options: they depend on nothing else
 * (no nonces), so they are computed once, by helmet itself, on a response
 * that only records them. (@fastify/helmet rebuilds helmet's middleware,
 * parsing the policy, on every request: a visible share of a cheap
 * request's time in a profile. test/security-headers.test.ts checks that the
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
 * The policy of an answer that is data, never a document: nothing may load
 * from it or frame it (GitHub's API sends the same `default-src 'none'`;
 * OWASP's REST Security Cheat Sheet asks for `frame-ancestors 'none'`).
 * Short too: a crowd's long-polls write and parse it on every answer,
 * where helmet's page policy is 300 bytes.
 */
export const API_CONTENT_SECURITY_POLICY = "default-src 'none'; frame-ancestors 'none'"

/**
 * What every answer carries: a content security policy that lets it load
 * nothing and be framed by nothing (what X-Frame-Options was), and
 * helmet's nosniff, so that a browser never sniffs an answer into HTML or
 * script. Helmet's other headers govern documents: referrers, opener and
 * agent-cluster isolation, DNS prefetch, the old IE and Flash switches,
 * framing again, and the cross-origin resource policy (which CORS reads,
 * the API's only cross-origin use, never consult). On the probes, the API
 * and its errors they would only cost time on every answer.
 */
export function apiSecurityHeaders (helmets: Record<string, string>): Record<string, string> {
  return { 'content-security-policy': API_CONTENT_SECURITY_POLICY, 'x-content-type-options': helmets['x-content-type-options']! }
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
  const answerHeaders = apiSecurityHeaders(pageHeaders)
  app.addHook('onRequest', (_request, reply, done) => {
    reply.headers(answerHeaders)
    done()
  })
  const setPageHeaders: onRequestHookHandler = (_request, reply, done) => {
    reply.headers(pageHeaders)
    done()
  }
  app.addHook('onRoute', (route) => {
    if (servesPages(route.url)) route.onRequest = withRouteHook(route.onRequest, setPageHeaders)
  })
}, { name: 'helmet' })
