import { existsSync, mkdirSync } from 'node:fs'
import { join } from 'node:path'
import { chromium, type Browser, type Page } from 'playwright-core'
import t, { type Test } from 'tap'
import { root } from './run.js'

/*
 * The web UI in a real browser: Debian's chromium, driven by playwright-core
 * (never a downloaded browser). One browser per test file; a page per test,
 * failing the test on any script error. Screenshots land in artifacts/ui/.
 */

const CHROMIUM = process.env.CHROMIUM_BIN ?? '/usr/bin/chromium'
const screenshots = join(root, 'artifacts', 'ui')

let browser: Browser | undefined
t.teardown(async () => { await browser?.close() })

/** Opens `url` in a new page and waits until it says it is live. */
export async function openPage (t: Test, url: string, beforeGoto?: (page: Page) => void): Promise<Page> {
  if (!existsSync(CHROMIUM)) throw new Error(`chromium not found at ${CHROMIUM}: apt-get install chromium (or set CHROMIUM_BIN)`)
  browser ??= await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--no-first-run', '--disable-sync']
  })
  const page = await browser.newPage({ viewport: { width: 1100, height: 900 } })
  const errors: string[] = []
  page.on('pageerror', (error) => errors.push(error.message))
  t.teardown(async () => {
    await page.close()
    if (errors.length > 0) throw new Error(`script errors on the page: ${errors.join('; ')}`)
  })
  beforeGoto?.(page)
  await page.goto(url)
  await page.locator('.live.is-live').waitFor({ timeout: 5000 })
  return page
}

export async function screenshot (page: Page, name: string) {
  mkdirSync(screenshots, { recursive: true })
  await page.screenshot({ path: join(screenshots, `${name}.png`), fullPage: true })
}
