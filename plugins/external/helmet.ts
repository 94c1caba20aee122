import fp from 'fastify-plugin'
import helmet, { type HelmetOptions } from 'helmet'
import type { IncomingMessage, ServerResponse } from 'node:http'

/**
 * Security headers on every response (nosniff, frame denial, referrer
 * policy...), as helmet sets them with these options. The content security
 * policy allows only this origin, plus the inline styles and data: images
 * the /docs page uses.
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

export default fp(async function helmetPlugin (app) {
  const headers = securityHeaders()
  app.addHook('onRequest', (_request, reply, done) => {
    reply.headers(headers)
    done()
  })
}, { name: 'helmet' })
