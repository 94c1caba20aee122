#!/usr/bin/env node
// The `ocp-api` command of this repository (the client package's own bin,
// client/src/cli.ts, is the same command). Its TypeScript source
// (client/src/ocp-api.ts) where Node strips its types (a checkout; never
// under node_modules); else the compiled JavaScript: dist/client/src/ (npm
// run build, the image) or client/dist/ (npm run build -w client); else
// the source through tsx (a devDependency: never needed once built).
import { existsSync } from 'node:fs'

const source = new URL('../client/src/ocp-api.ts', import.meta.url)
const compiled = ['../dist/client/src/ocp-api.js', '../client/dist/ocp-api.js'].map((path) => new URL(path, import.meta.url)).find((url) => existsSync(url))
/** The source through tsx; undefined when tsx is not installed (a production install). */
async function throughTsx () {
  const tsx = await import('tsx/esm/api').catch(() => undefined)
  if (tsx === undefined) return undefined
  tsx.register()
  return import(`${source.href}?tsx`) // a new URL: the loader keeps the failed import of the first
}

let cli
/* c8 ignore start: run as a process, whose coverage is not collected */
if (existsSync(source)) cli = await import(source.href).catch(() => undefined)
if (cli === undefined && compiled !== undefined) cli = await import(compiled.href)
if (cli === undefined && existsSync(source)) cli = await throughTsx()
if (cli === undefined) {
  process.stderr.write('ocp-api: not built: run npm run build (or npm run build -w client)\n')
  process.exit(1)
}
/* c8 ignore stop */
await cli.run()
