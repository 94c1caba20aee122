import type { FastifyInstance } from 'fastify'
import t, { type Test } from 'tap'
import { build } from './helpers/app.ts'
import { openPage, READY_MS, screenshot } from './helpers/browser.ts'
import { insertGraph, makeTask, writer } from './helpers/fixtures.ts'
import { insertEvents } from './helpers/sse.ts'

// The web UI as a dashboard over a real control plane's history: 2,000 runs,
// a status filter, paging by the Link header with the page and filter in the
// address, and the activity page. Paging never loads the whole list: the
// assertions are on the requests the page makes.

const RUNS = 2000
const STATUSES = ['running', 'done', 'failed', 'blocked']
const PAGE_SIZE = 50

t.before(async () => {
  const db = await writer()
  const base = Date.parse('2026-01-01T00:00:00Z')
  const rows = Array.from({ length: RUNS }, (_, i) => ({
    run_id: `run-${String(i).padStart(4, '0')}`,
    goal: `Goal ${i}`,
    summary: '',
    status: STATUSES[i % STATUSES.length]!,
    created_at: new Date(base + i * 1000),
    updated_at: new Date(base + i * 1000)
  }))
  for (let i = 0; i < rows.length; i += 500) await db.insertInto('runs').values(rows.slice(i, i + 500)).execute()
  // Two runs wait for an answer: one on two tasks, one on one.
  await insertGraph({
    tasks: [
      makeTask({ run_id: 'run-1997', status: 'blocked' }), makeTask({ run_id: 'run-1997', status: 'blocked' }), makeTask({ run_id: 'run-1997', status: 'done' }),
      makeTask({ run_id: 'run-1001', status: 'blocked' }), makeTask({ run_id: 'run-1002', status: 'running' })
    ]
  })
})

async function serve (t: Test): Promise<{ app: FastifyInstance, url: string }> {
  const app = await build(t, { EVENTS_POLL_INTERVAL_MS: 50, SSE_RETRY_MS: 300 })
  await app.listen({ port: 0, host: '127.0.0.1' })
  return { app, url: `http://127.0.0.1:${(app.server.address() as { port: number }).port}` }
}

/** In the page (its own types are the DOM's, not this file's): when the first row is in the document, on the page's clock. */
const FIRST_ROW_CLOCK = `new MutationObserver((records, observer) => {
  if (document.querySelector('tr[data-run]') === null) return
  window.firstRowAt = performance.now()
  observer.disconnect()
}).observe(document, { childList: true, subtree: true })`

/** The /api/runs requests the page made, as URLs. */
function runListRequests (page: import('playwright-core').Page): URL[] {
  const seen: URL[] = []
  page.on('request', (request) => {
    const url = new URL(request.url())
    if (url.pathname === '/api/runs') seen.push(url)
  })
  return seen
}

t.test('2,000 runs: the first page draws at once, one page of 50 is read; paging follows the Link and keeps the address', async (t) => {
  const { url } = await serve(t)
  let requests: URL[] = []
  const page = await openPage(t, `${url}/`, {
    beforeGoto: (p) => {
      requests = runListRequests(p)
      // When the first row is in the document, on the page's own clock (0 = navigation start).
      void p.addInitScript({ content: FIRST_ROW_CLOCK })
    }
  })
  await page.locator('tr[data-run]').first().waitFor()
  const drawnAt = await page.evaluate<number>('window.firstRowAt')
  t.comment(`first page drawn by ${Math.round(drawnAt)} ms after navigation began (in-page clock; a figure, not asserted)`)
  // What the first draw waited for: the page, then the modules and the preloaded first page side by side.
  t.comment(`(start, end) ms: ${await page.evaluate<string>(`[...performance.getEntriesByType('navigation'), ...performance.getEntriesByType('resource')]
    .map((e) => e.name.replace(location.origin, '') + ' ' + Math.round(e.startTime) + '-' + Math.round(e.responseEnd)).join(', ')`)}`)
  t.equal(requests.length, 1, 'the first page is read once: the page\'s fetch takes the preloaded answer')
  await page.goto(`${url}/?again`)
  await page.locator('tr[data-run]').first().waitFor()
  t.comment(`loaded again (warm browser): first page drawn by ${Math.round(await page.evaluate<number>('window.firstRowAt'))} ms`)
  t.equal(await page.locator('tr[data-run]').count(), PAGE_SIZE, 'one page of runs drawn')
  t.equal(await page.locator('tr[data-run]').first().getAttribute('data-run'), 'run-1999', 'newest first')
  t.ok(requests.length >= 1 && requests.every((request) => request.searchParams.get('limit') === String(PAGE_SIZE)), 'every list read asks for one page')
  await screenshot(page, 'runs-dashboard')

  // Three pages on: each through the Link, each one request of one page.
  for (let n = 1; n <= 3; n++) {
    const before = requests.length
    await page.locator('a[rel="next"]').click()
    await page.locator(`tr[data-run="run-${String(1999 - n * PAGE_SIZE).padStart(4, '0')}"]`).waitFor()
    t.match(page.url(), /#\/\?cursor=[A-Za-z0-9_-]+$/, `page ${n + 1}: the address holds the cursor`)
    t.same(requests.slice(before).map((request) => request.searchParams.get('limit')), [String(PAGE_SIZE)], `page ${n + 1}: one read of ${PAGE_SIZE}`)
  }
  const runsRead = requests.length * PAGE_SIZE
  t.ok(runsRead < RUNS / 4, `${requests.length} list reads in all: never the whole list`)

  await page.reload()
  await page.locator(`tr[data-run="run-${String(1999 - 3 * PAGE_SIZE).padStart(4, '0')}"]`).waitFor()
  t.pass('reload shows the same page')
  await page.goBack()
  await page.locator(`tr[data-run="run-${String(1999 - 2 * PAGE_SIZE).padStart(4, '0')}"]`).waitFor()
  t.pass('back shows the page before')
  await page.locator('a[rel="first"]').click()
  await page.locator('tr[data-run="run-1999"]').waitFor()
  t.pass('the newest page again')
})

t.test('the status filter: one status or several, kept in the address through paging, reload and back', async (t) => {
  const { url } = await serve(t)
  const page = await openPage(t, `${url}/`)
  await page.locator('tr[data-run]').first().waitFor()
  await page.locator('input[name="status"]').fill('failed, blocked')
  await page.locator('form.filter button').click()
  await page.waitForURL(/#\/\?status=failed%2Cblocked$/)
  await page.locator('h1', { hasText: 'Runs: failed, blocked' }).waitFor()
  await page.locator('tr[data-run="run-1999"]').waitFor() // 1999 % 4 = 3: blocked
  const statuses = await page.locator('tr[data-run] .status').allTextContents()
  t.equal(statuses.length, PAGE_SIZE)
  t.same([...new Set(statuses)].sort(), ['blocked', 'failed'], 'only those statuses')

  await page.locator('a[rel="next"]').click()
  await page.waitForURL(/#\/\?status=failed%2Cblocked&cursor=/)
  await page.locator(`tr[data-run="run-${String(1999 - 2 * PAGE_SIZE).padStart(4, '0')}"]`).waitFor()
  t.same([...new Set(await page.locator('tr[data-run] .status').allTextContents())].sort(), ['blocked', 'failed'], 'the next page keeps the filter')
  await page.reload()
  await page.locator(`tr[data-run="run-${String(1999 - 2 * PAGE_SIZE).padStart(4, '0')}"]`).waitFor()
  t.pass('reload keeps page and filter')
  await page.goBack()
  await page.goBack()
  await page.locator('h1', { hasText: /^Runs$/ }).waitFor()
  t.pass('back returns to every run')

  await page.goto(`${url}/#/?status=no-such-status`)
  await page.locator('.empty', { hasText: 'No runs in this status.' }).waitFor()
  await page.locator('a.clear').click()
  await page.locator('tr[data-run="run-1999"]').waitFor()
  t.pass('an empty filter says so, and clears')
})

t.test('runs waiting for an answer: each row says how many tasks wait; "needs an answer" lists only those runs, kept in the address', async (t) => {
  const { url } = await serve(t)
  const page = await openPage(t, `${url}/`)
  await page.locator('tr[data-run="run-1997"]').waitFor()
  t.equal(await page.locator('tr[data-run="run-1997"] .waiting').textContent(), '2 waiting for an answer')
  t.equal(await page.locator('tr[data-run="run-1996"] .waiting').count(), 0, 'a run with nothing blocked says nothing')
  t.equal(await page.locator('input[name="status"]').getAttribute('placeholder'), 'e.g. blocked,done', 'the status filter suggests statuses the runs shown have')

  await page.getByLabel('Needs an answer').check()
  await page.waitForURL(/#\/\?blocked=true$/)
  await page.locator('h1', { hasText: 'Runs: needing an answer' }).waitFor()
  await page.locator('tr[data-run="run-1001"]').waitFor()
  t.same(await page.locator('tr[data-run]').evaluateAll((rows) => rows.map((row) => row.getAttribute('data-run'))), ['run-1997', 'run-1001'], 'only the runs with a blocked task')
  t.equal(await page.locator('tr[data-run="run-1001"] .waiting').textContent(), '1 waiting for an answer')
  t.equal(await page.locator('a[rel="next"]').count(), 0, 'one page')
  await page.reload()
  await page.locator('tr[data-run="run-1001"]').waitFor()
  t.ok(await page.getByLabel('Needs an answer').isChecked(), 'reload keeps the filter')

  await page.locator('input[name="status"]').fill('failed')
  await page.locator('form.filter button').click()
  await page.waitForURL(/#\/\?status=failed&blocked=true$/)
  await page.locator('.empty', { hasText: 'No run is waiting for an answer.' }).waitFor()
  t.pass('with a status too, both filters hold')
  await page.goBack()
  await page.locator('tr[data-run="run-1001"]').waitFor()
  await page.getByLabel('Needs an answer').uncheck()
  await page.waitForURL(/#\/$/)
  await page.locator('tr[data-run="run-1999"]').waitFor()
  t.pass('and unchecked, every run again')
})

t.test('the activity page: the latest events across runs, live, each linking to its run or thread', async (t) => {
  const { url } = await serve(t)
  await insertEvents(...Array.from({ length: 120 }, (_, i) => ({ event_type: 'task_done', run_id: 'run-0001', summary: `old ${i}` })))
  const page = await openPage(t, `${url}/#/activity`)
  await page.locator('li[data-event]').first().waitFor()
  t.equal(await page.locator('li[data-event]').count(), 100, 'the latest 100')
  t.match(await page.locator('li[data-event]').first().textContent(), /old 119/, 'newest first')
  const [runEvent, threadEvent] = await insertEvents(
    { event_type: 'task_failed', run_id: 'run-0002', summary: 'it broke' },
    { event_type: 'thread_reply', run_id: 'run-0003', thread_id: 'thread-9', summary: 'a reply' })
  await page.locator(`li[data-event="${threadEvent}"]`).waitFor({ timeout: READY_MS }) // live, with no promise of how soon (ui.test.ts tests that)
  t.equal(await page.locator('li[data-event]').first().getAttribute('data-event'), String(threadEvent), 'live, on top')
  t.equal(await page.locator(`li[data-event="${threadEvent}"] a`).first().getAttribute('href'), '#/threads/thread-9')
  t.equal(await page.locator(`li[data-event="${threadEvent}"] a`).nth(1).getAttribute('href'), '#/runs/run-0003')
  t.equal(await page.locator('li[data-event]').count(), 100, 'still 100')
  await screenshot(page, 'activity')
  await page.locator(`li[data-event="${runEvent}"] a`).click()
  await page.locator('h1', { hasText: 'Goal 2' }).waitFor()
  t.match(page.url(), /#\/runs\/run-0002$/, 'an event links to its run')
})
