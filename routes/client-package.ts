import type { FastifyPluginAsync } from 'fastify'
import { readFile } from 'node:fs/promises'
import { basename, dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import pkg from '../package.json' with { type: 'json' }
import { ApiError } from '../errors.ts'
import { entityTag, noneMatchHits } from '../plugins/app/http-cache.ts'

/** dist/, where the build leaves the package: above routes/ compiled (dist/routes/), beside it from the sources. */
function distDirectory (): string {
  const parent = join(dirname(fileURLToPath(import.meta.url)), '..')
  /* c8 ignore next: the compiled layout is what npm start and the image run; the tests run the sources */
  return basename(parent) === 'dist' ? parent : join(parent, 'dist')
}

/**
 * The client package (ocp-api-client, with the ocp-api command) at
 * /client/ocp-api-client.tgz, as `npm pack` made it at build time (`npm run
 * build:client`, part of `npm run build`: dist/ocp-api-client-<version>.tgz).
 * Only the package of this service's own version is served, so that a
 * client fetched from a service speaks its version of the API: `npx -y
 * <service>/client/ocp-api-client.tgz wait RUN` from any CI job that reaches
 * the service. Public even with authentication on (routes outside /api are):
 * it is code, the same for everyone, and the CLI then sends its token.
 */
const clientPackageRoutes: FastifyPluginAsync = async (app) => {
  const file = `ocp-api-client-${pkg.version}.tgz`
  const path = join(distDirectory(), file)
  let kept: { body: Buffer, tag: string } | undefined
  app.get('/client/ocp-api-client.tgz', { schema: { hide: true } }, async (request, reply) => {
    if (kept === undefined) {
      const body = await readFile(path).catch(() => {
        throw new ApiError('not_found', `the client package is not built: run npm run build (it makes dist/${file})`)
      })
      kept = { body, tag: entityTag(body) }
    }
    // The URL names no version, and an upgrade of the service changes what
    // it serves: any cache revalidates it before each use (a 304, by its tag).
    reply.header('cache-control', 'public, no-cache').header('etag', kept.tag)
    if (noneMatchHits(request.headers['if-none-match'], kept.tag)) return reply.code(304).send()
    return reply.type('application/gzip').header('content-disposition', `attachment; filename="${file}"`).send(kept.body)
  })
}

export default clientPackageRoutes
