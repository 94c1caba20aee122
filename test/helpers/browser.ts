import { existsSync, mkdirSync } from 'node:fs'
import { join } from 'node:path'
import { chromium, type Browser, type Page } from 'playwright-core'
import tap, { type Test } from 'tap'
import { root } from './run.ts'

/*
 * The web UI in a real browser: Debian's chromium, driven by playwright-core
 * (never a downloaded browser). One browser per test file; a page per test,
 * failing the test on any script error and on any console error or warning
 * (a refused policy, a wasted preload, a failed request all land there).
 * Screenshots land in artifacts/ui/.
 */

const CHROMIUM = process.env.CHROMIUM_BIN ?? '/usr/bin/chromium'
const screenshots = join(root, 'artifacts', 'ui')

let browser: Browser | undefined
/** The errors and warnings each open page has logged, and no test has yet asserted on. */
const problemsOf = new WeakMap<Page, string[]>()
tap.teardown(async () => { await browser?.close() })

export interface OpenPageOptions {
  /** Called on the page before it navigates: to listen to its requests, or add init scripts. */
  beforeGoto?: (page: Page) => void
  /** What says the page is ready; the UI's live indicator by default. */
  readySelector?: string
  /** Console errors and warnings the test provokes on purpose (a request refused while the service is down, say). */
  expectedConsole?: RegExp[]
}

/**
 * What a browser logs of the requests a page makes across a service's
 * restart, each retried by the page: refused while nothing listens, and
 * reset when sent on a kept-alive connection just as the old service closes
 * it (idle, as far as the service knew: a race of HTTP keep-alive itself).
 */
export const SERVICE_RESTART = /Failed to load resource: net::ERR_CONNECTION_(REFUSED|RESET)/

/**
 * How long a page may take to be ready, or to show a state it reaches by
 * itself (not live, live again): generous, as waitUntil is. CI's two
 * cores once took over 15 s to ready one of seven pages opened at once; a
 * wait is only long when something is already wrong. What the UI promises
 * in time (LIVE_WITHIN_MS) is tested with its own bound.
 */
export const READY_MS = 60_000

/** Opens `url` in a new page and waits until it is ready (by default, until it says it is live). */
export async function openPage (t: Test, url: string, options: OpenPageOptions = {}): Promise<Page> {
  if (!existsSync(CHROMIUM)) throw new Error(`chromium not found at ${CHROMIUM}: apt-get install chromium (or set CHROMIUM_BIN)`)
  browser ??= await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--no-first-run', '--disable-sync']
  })
  const page = await browser.newPage({ viewport: { width: 1100, height: 900 } })
  const problems = recordProblems(page, options.expectedConsole ?? [])
  problemsOf.set(page, problems)
  t.teardown(async () => {
    await page.close()
    // On the file's root: the test has ended by now, and a throw here would skip the teardowns after this one.
    if (problems.length > 0) tap.fail(`${t.name}: ${url} logged errors or warnings`, { problems })
  })
  options.beforeGoto?.(page)
  await page.goto(url)
  await page.locator(options.readySelector ?? '.live.is-live').waitFor({ timeout: READY_MS })
  return page
}

/** Asserts that `page` (opened by openPage) has logged no error or warning so far; those it has are reported here, not again when it closes. */
export function assertNoProblems (t: Test, page: Page, what: string) {
  const problems = problemsOf.get(page)!
  t.same(problems.splice(0), [], `${what}: no script error, no console error or warning`)
}

/** Script errors and console errors and warnings on `page`, as they happen, but for those `expected` matches. */
function recordProblems (page: Page, expected: RegExp[] = []): string[] {
  const problems: string[] = []
  page.on('pageerror', (error) => problems.push(`script error: ${error.message}`))
  page.on('console', (message) => {
    const type = message.type()
    if (type !== 'error' && type !== 'warning') return
    const location = message.location().url
    const text = `console ${type}: ${message.text()}${location === '' ? '' : ` (${location})`}`
    if (!expected.some((pattern) => pattern.test(text))) problems.push(text)
  })
  return problems
}

export async function screenshot (page: Page, name: string) {
  mkdirSync(screenshots, { recursive: true })
  await page.screenshot({ path: join(screenshots, `${name}.png`), fullPage: true })
}
