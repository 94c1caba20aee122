import type { FastifyReply, FastifyRequest, HookHandlerDoneFunction } from 'fastify'
import fp from 'fastify-plugin'
import { allowedHostsOf, authenticationOn } from '../../config.ts'
import { hostNotAllowed } from '../../errors.ts'

/** The probes: they answer no data, and an orchestrator's name the instance by its address. */
const PROBES = new Set(['/health', '/ready'])

/** A Host header's name: lowercase, without its port; an IPv6 address keeps its brackets. */
function nameOf (host: string): string {
  const name = host.toLowerCase()
  return name.startsWith('[') ? name.slice(0, name.indexOf(']') + 1) : name.replace(/:\d*$/, '')
}

/**
 * Authentication off, guarded (docs/operating.md, "Authentication off").
 * AUTH_MODE=none (config.ts refuses an address other than loopback without
 * it) is said loudly at start. And DNS rebinding: a page that points its
 * own name at this address reads the API as its own origin, so a request
 * is answered only when its Host names the service as configured
 * (allowedHostsOf: loopback's names, HOST's, ALLOWED_HOSTS'), any port;
 * else 421 `misdirected_request`, before anything else of ours runs. With
 * authentication on, Host is not checked: a rebinding page sends no token.
 * ALLOWED_HOSTS=* turns the check off; the probes are never checked.
 */
export default fp(async function allowedHostsPlugin (app) {
  const { HOST, AUTH_MODE } = app.config
  if (AUTH_MODE === 'none') {
    app.log.warn({ HOST, AUTH_MODE }, 'authentication is off (AUTH_MODE=none): every run, task, thread, message and event is served to anyone who ' +
      'reaches this port')
  }
  const allowed = allowedHostsOf(app.config)
  if (authenticationOn(app.config) || allowed === undefined) return
  app.addHook('onRequest', (request: FastifyRequest, _reply: FastifyReply, done: HookHandlerDoneFunction) => {
    const host = request.headers.host
    if (PROBES.has(request.routeOptions.url ?? '') || (host !== undefined && allowed.has(nameOf(host)))) { done(); return }
    done(hostNotAllowed(host))
  })
}, { name: 'allowed-hosts', decorators: { fastify: ['config'] } })
