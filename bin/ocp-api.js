#!/usr/bin/env node
// The `ocp-api` command (cli/ocp-api.ts). In a checkout (after npm ci), its
// TypeScript source: through the TypeScript loader already running if any
// (a test's), else through tsx. In the image and after npm run build, the
// compiled dist/cli/ocp-api.js.
import { existsSync } from 'node:fs'

const source = new URL('../cli/ocp-api.ts', import.meta.url)
let cli
if (existsSync(source)) {
  cli = await import(source.href).catch(async () => {
    /* c8 ignore next 3: a plain node, with no TypeScript loader (the tests run the bin under theirs) */
    const { register } = await import('tsx/esm/api')
    register()
    return import(`${source.href}?tsx`) // a new URL: the loader keeps the failed import of the first
  })
} else /* c8 ignore start: the compiled layout (the image, npm run build) */ {
  cli = await import(new URL('../dist/cli/ocp-api.js', import.meta.url).href)
} /* c8 ignore stop */
await cli.run()
