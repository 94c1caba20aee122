import fp from 'fastify-plugin'
import { existsSync } from 'node:fs'
import { readFile } from 'node:fs/promises'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { notFound } from '../../errors.js'

/** The ui/ folder: beside plugins/ when run from the sources (plugins/app/), above dist/ when compiled (dist/plugins/app/). */
function uiDirectory (): string {
  const here = dirname(fileURLToPath(import.meta.url))
  const fromSources = join(here, '..', '..', 'ui')
  /* c8 ignore next: the compiled layout is what npm start and the image run; the tests run the sources */
  return existsSync(join(fromSources, 'index.html')) ? fromSources : join(here, '..', '..', '..', 'ui')
}

const files = {
  '/': { file: 'index.html', type: 'text/html; charset=utf-8' },
  '/ui/style.css': { file: 'style.css', type: 'text/css; charset=utf-8' },
  '/ui/app.js': { file: 'build/app.js', type: 'text/javascript; charset=utf-8' }
} as const

/**
 * The web UI (ui/): a runs list, a run detail and a thread timeline, kept
 * live by the event stream. Three static files, read once and kept.
 */
export default fp(async function uiPlugin (app) {
  const dir = uiDirectory()
  const cache = new Map<string, Buffer>()
  for (const [path, { file, type }] of Object.entries(files)) {
    app.get(path, { schema: { hide: true } }, async (_request, reply) => {
      let body = cache.get(file)
      if (body === undefined) {
        // build/app.js exists once the client is built (npm run build, or before the tests).
        body = await readFile(join(dir, file)).catch(() => { throw notFound('the UI is not built: run npm run build') })
        cache.set(file, body)
      }
      return reply.type(type).header('cache-control', 'no-cache').send(body)
    })
  }
}, { name: 'ui' })
