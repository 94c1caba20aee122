import type { FastifyHelmetOptions } from '@fastify/helmet'
import fp from 'fastify-plugin'
import { createRequire } from 'node:module'

/**
 * Security headers on every response (nosniff, frame denial, referrer
 * policy...), as helmet sets them with these options. The content security
 * policy allows only this origin, plus the inline styles and data: images
 * the /docs page uses.
 */
export const helmetOptions: FastifyHelmetOptions = {
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

type Middleware = (req: unknown, res: { setHeader: (name: string, value: unknown) => void, removeHeader: (name: string) => void }, next: (err?: unknown) => void) => void

/**
 * The headers helmet sets with these options: they depend on nothing else
 * (no nonces), so they are computed once, by the helmet that
 * @fastify/helmet itself depends on. (@fastify/helmet rebuilds helmet's
 * middleware, parsing the policy, on every request: a tenth of /health's
 * time in the profile of BENCHMARKS.md.)
 */
export function securityHeaders (): Record<string, string> {
  const fromFastifyHelmet = createRequire(createRequire(import.meta.url).resolve('@fastify/helmet'))
  const helmet = fromFastifyHelmet('helmet') as (options: object) => Middleware
  const headers: Record<string, string> = {}
  helmet(helmetOptions)({}, { setHeader: (name, value) => { headers[name.toLowerCase()] = String(value) }, removeHeader: () => {} }, (err) => {
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
