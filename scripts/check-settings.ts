/*
 * `npm run demo` (with --demo) and `npm start` run this before they build:
 * the environment checked as the service (and the demo) will check it, and
 * PORT free (config.ts, checkSettings), so that a bad setting is said at
 * once, in one line, not after the build.
 */
import { checkSettings } from '../config.ts'

try {
  await checkSettings(process.env, { demo: process.argv.includes('--demo') })
} catch (err) {
  console.error((err as Error).message)
  process.exit(1)
}
