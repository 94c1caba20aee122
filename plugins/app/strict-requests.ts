import type { FastifyReply, FastifyRequest, HookHandlerDoneFunction, onRequestHookHandler } from 'fastify'
import fp from 'fastify-plugin'
import { methodNotAllowed, unknownParameter } from '../../errors.ts'
import { withRouteHook } from '../route-hooks.ts'

declare module 'fastify' {
  interface FastifyContextConfig {
    /**
     * Query parameters the route does not list are ignored rather than
     * refused: the Durable Streams routes, whose protocol has servers
     * ignore the ones they do not know (its extensions and clients add
     * some; the official conformance suite checks it).
     */
    ignoresUnknownQuery?: boolean
  }
}

/** The methods that write: no path of the API serves one. */
const WRITES = new Set(['POST', 'PUT', 'PATCH', 'DELETE'])
/** The methods a path of the API may serve, in the order Allow lists them. */
const READS = ['GET', 'HEAD']

/** A path's segments, without the empty one a trailing slash leaves (routed like the bare path). */
const segmentsOf = (path: string) => path.replace(/(?<=.)\/$/, '').split('/')

/** Whether a route's path (`/api/runs/:runID`) routes a request's path: each `:param` takes one non-empty segment. */
const routes = (pattern: string[], path: string[]) =>
  pattern.length === path.length && pattern.every((segment, i) => segment.startsWith(':') ? path[i] !== '' : segment === path[i])

/**
 * No request widens or narrows by mistake (docs/reference.md, "Errors"):
 *
 * - Every operation of the API (each route with an operationId: /api/*,
 *   /health, /ready, /metrics) refuses a query parameter its schema does
 *   not list with 400, naming it and those the route takes: a misspelt
 *   `?runid=` would otherwise stream every run's events. After
 *   authentication (a request without a token learns nothing of routes),
 *   before the parameters' own checks.
 * - A write (POST, PUT, PATCH, DELETE) to any /api path, routed or not,
 *   answers 405 `method_not_allowed` with the Allow of what the path
 *   serves, at once: no body is read, so none is refused for its size or
 *   type. Writes have no route, so they reach this hook on their way to
 *   the 404.
 */
export default fp(async function strictRequestsPlugin (app) {
  /** The paths of the API's reads, by method, as segments. */
  const readPaths = new Map<string, string[][]>(READS.map((method) => [method, []]))

  app.addHook('onRoute', (route) => {
    const path = route.url
    if (path === '/api' || path.startsWith('/api/')) {
      for (const method of [route.method].flat()) readPaths.get(method)?.push(segmentsOf(path))
    }
    const operation = route.schema as { operationId?: string, querystring?: { properties?: object } } | undefined
    if (operation?.operationId === undefined || route.config?.ignoresUnknownQuery === true) return
    const accepted = Object.keys(operation.querystring?.properties ?? {})
    const known = new Set(accepted)
    const refuseUnknown: onRequestHookHandler = (request, _reply, done) => {
      for (const name in request.query as Record<string, unknown>) {
        if (!known.has(name)) { done(unknownParameter(name, accepted)); return }
      }
      done()
    }
    route.onRequest = withRouteHook(route.onRequest, refuseUnknown)
  })

  /** What the path of a request serves (GET, HEAD), from the routes of the API. */
  function allowedAt (url: string): string[] {
    const path = segmentsOf(url.split('?', 1)[0]!)
    return READS.filter((method) => readPaths.get(method)!.some((pattern) => routes(pattern, path)))
  }

  app.addHook('onRequest', (request: FastifyRequest, reply: FastifyReply, done: HookHandlerDoneFunction) => {
    if (!WRITES.has(request.method) || !(request.url === '/api' || request.url.startsWith('/api/') || request.url.startsWith('/api?'))) { done(); return }
    const allowed = allowedAt(request.url)
    reply.header('allow', allowed.join(', '))
    done(methodNotAllowed(request.method, allowed))
  })
}, { name: 'strict-requests' })
