import helmet from '@fastify/helmet'
import fp from 'fastify-plugin'

/**
 * Security headers on every response (nosniff, frame denial, referrer
 * policy...). The content security policy allows only this origin, plus
 * the inline styles and data: images the /docs page uses.
 */
export default fp(async function helmetPlugin (app) {
  await app.register(helmet, {
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
  })
}, { name: 'helmet' })
