import type { FastifyPluginAsync, FastifyReply } from 'fastify'
import { existsSync } from 'node:fs'
import { readFile } from 'node:fs/promises'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { authenticationOn, issuersOf } from '../config.ts'
import { notFound } from '../errors.ts'
import { entityTag, noneMatchHits } from '../plugins/app/http-cache.ts'

/** The ui/ folder: beside routes/ when run from the sources, above dist/ when compiled (dist/routes/). */
function uiDirectory (): string {
  const here = dirname(fileURLToPath(import.meta.url))
  const fromSources = join(here, '..', 'ui')
  /* c8 ignore next: the compiled layout is what npm start and the image run; the tests run the sources */
  return existsSync(join(fromSources, 'index.html')) ? fromSources : join(here, '..', '..', 'ui')
}

const files = {
  '/': { file: 'index.html', type: 'text/html; charset=utf-8' },
  '/ui/style.css': { file: 'style.css', type: 'text/css; charset=utf-8' }
} as const

/**
 * The page's inline script: it preloads the runs list's first page, which,
 * with authentication on, a preload (it cannot send the token) only gets
 * refused, logging an error in the browser's console.
 */
const PRELOAD_SCRIPT = /\n[ ]*<script>[^<]*<\/script>/

/** The compiled modules (ui/build/): the page's script and ocp-api-client, which it imports. */
const BUILT_MODULE = /^(ui|client\/src)\/[a-z-]+\.js$/

/**
 * The web UI (ui/): a runs list, a run's page (with its timeline), a
 * task's story, a thread and the latest activity, kept live by
 * ocp-api-client. Static files, read once and kept.
 */
const uiRoutes: FastifyPluginAsync = async (app) => {
  const dir = uiDirectory()
  const preload = !authenticationOn(app.config)
  const signsIn = authenticationOn(app.config) && issuersOf(app.config).some((issuer) => issuer.ui_client_id !== undefined)
  /**
   * The page's policy lets it reach its own origin only; its sign-in with
   * an identity provider (authorization code with PKCE) trades the code at
   * the provider's token endpoint, whose origin is added to connect-src
   * (known once discovery answered; until then the sign-in is not offered).
   */
  async function allowTokenEndpoint (reply: FastifyReply) {
    const signIn = await app.jwtIssuers.signIn().catch(() => null)
    if (signIn === null) return
    // Helmet's, set by its hook of the page routes (plugins/external/helmet.ts).
    const policy = reply.getHeader('content-security-policy') as string
    reply.header('content-security-policy', policy.replace("connect-src 'self'", `connect-src 'self' ${new URL(signIn.token_endpoint).origin}`))
  }
  const cache = new Map<string, { body: Buffer, tag: string }>()
  // no-cache with a tag: a browser keeps each file and revalidates it, so a
  // reload costs a 304 per file, not the file.
  async function send (reply: FastifyReply, file: string, type: string) {
    let kept = cache.get(file)
    if (kept === undefined) {
      // build/ exists once the UI is compiled (npm run build, or before the tests).
      let body = await readFile(join(dir, file)).catch(() => { throw notFound('the UI is not built: run npm run build') })
      if (file === 'index.html' && !preload) body = Buffer.from(body.toString('utf8').replace(PRELOAD_SCRIPT, ''))
      kept = { body, tag: entityTag(body) }
      cache.set(file, kept)
    }
    reply.header('cache-control', 'no-cache').header('etag', kept.tag)
    if (noneMatchHits(reply.request.headers['if-none-match'], kept.tag)) return reply.code(304).send()
    return reply.type(type).send(kept.body)
  }
  for (const [path, { file, type }] of Object.entries(files)) {
    app.get(path, { schema: { hide: true } }, async (_request, reply) => {
      if (signsIn && file === 'index.html') await allowTokenEndpoint(reply)
      return send(reply, file, type)
    })
  }
  app.get<{ Params: { '*': string } }>('/ui/build/*', { schema: { hide: true } }, async (request, reply) => {
    const module = request.params['*']
    if (!BUILT_MODULE.test(module)) throw notFound('file')
    return send(reply, `build/${module}`, 'text/javascript; charset=utf-8')
  })
}

export default uiRoutes
