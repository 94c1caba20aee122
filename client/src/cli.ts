#!/usr/bin/env node
// The package's bin, `ocp-api` (package.json "bin"): the command of ocp-api.ts, run as a process.
import { run } from './ocp-api.ts'
await run()
