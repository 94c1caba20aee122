import type { FastifyInstance } from 'fastify'
import { sql } from 'kysely'
import { createHash } from 'node:crypto'
import t, { type Test } from 'tap'
import { UI_INLINE_SCRIPT_HASHES } from '../plugins/external/helmet.ts'
import { build } from './helpers/app.ts'
import { assertNoProblems, openPage, READY_MS, screenshot, SERVICE_RESTART } from './helpers/browser.ts'
import { insertGraph, json, makeArtifact, makeAttempt, makeMessage, makeRun, makeTask, makeThread, writer } from './helpers/fixtures.ts'
import { insertEvents } from './helpers/sse.ts'
import { waitUntil } from './helpers/wait.ts'

// The web UI in a real browser (Debian's chromium, driven by playwright-core):
// pages render, reflect committed changes live, and recover from a restart.
// Screenshots of each page land in artifacts/ui/ (not committed).

const LIVE_WITHIN_MS = 2000

t.before(() => insertGraph({
  runs: [makeRun({ run_id: 'run-ui', goal: 'Migrate billing to the new ledger', summary: 'Port the invoicing jobs' }), makeRun({ run_id: 'run-other', goal: 'Another run' })],
  tasks: [
    makeTask({ run_id: 'run-ui', task_id: 'task-schema', title: 'Write the ledger schema', status: 'done' }),
    makeTask({ run_id: 'run-ui', task_id: 'task-backfill', title: 'Backfill March invoices', status: 'running', default_to: 'carol' }),
    makeTask({ run_id: 'run-ui', task_id: 'task-rounding', title: 'Decide JPY rounding', status: 'blocked', latest_attempt_no: 1 })
  ],
  task_attempts: [makeAttempt({ run_id: 'run-ui', task_id: 'task-rounding', thread_id: 'thread-ui', assigned_to: 'bob' })],
  threads: [makeThread({ run_id: 'run-ui', task_id: 'task-rounding', thread_id: 'thread-ui', subject: 'Rounding of JPY invoices' })],
  messages: [makeMessage({ thread_id: 'thread-ui', message_id: 'msg-q', kind: 'question', from_agent: 'bob', summary: 'Which rounding for JPY invoices?', body: 'Line level or invoice level?', payload_json: json({ options: ['line', 'invoice'] }) })],
  artifacts: [makeArtifact({ message_id: 'msg-q', path: 'notes/rounding.md' })]
}))

async function serve (t: Test, port = 0): Promise<{ app: FastifyInstance, url: string, port: number }> {
  const app = await build(t, { EVENTS_POLL_INTERVAL_MS: 50, SSE_RETRY_MS: 300 })
  await app.listen({ port, host: '127.0.0.1' })
  const address = app.server.address() as { port: number }
  return { app, url: `http://127.0.0.1:${address.port}`, port: address.port }
}

/** Commits a change and its event in one transaction, as an orchestrator does. */
async function commitTaskStatus (taskId: string, status: string) {
  const db = await writer()
  await db.transaction().execute(async (trx) => {
    await trx.updateTable('tasks').set({ status, updated_at: new Date() }).where('run_id', '=', 'run-ui').where('task_id', '=', taskId).execute()
    await trx.insertInto('events').values({ event_type: `task_${status}`, run_id: 'run-ui', task_id: taskId }).execute()
  })
}

t.test('the runs list: every run with its counts, linking to its detail', async (t) => {
  const { url } = await serve(t)
  const page = await openPage(t, `${url}/`)
  await page.locator('tr[data-run="run-ui"]').waitFor()
  const row = page.locator('tr[data-run="run-ui"]')
  t.match(await row.textContent(), /Migrate billing to the new ledger/)
  t.match(await row.locator('.legend').textContent(), /1 blocked · 1 done · 1 running/)
  t.equal(await row.locator('.waiting').textContent(), '1 waiting for an answer')
  t.equal(await page.locator('input[name="status"]').getAttribute('placeholder'), 'e.g. running', 'the status filter suggests a status the runs have')
  await screenshot(page, 'runs')
  await row.locator('a').click()
  await page.locator('h1', { hasText: 'Migrate billing' }).waitFor()
  t.match(page.url(), /#\/runs\/run-ui$/, 'the address reflects the page')
  await page.goBack()
  await page.locator('tr[data-run="run-ui"]').waitFor()
  t.pass('back returns to the list')
})

t.test('the run detail reflects a committed status change within 2 s, without reload; blocked tasks show their question', async (t) => {
  const { url } = await serve(t)
  const page = await openPage(t, `${url}/#/runs/run-ui`)
  const backfill = page.locator('tr[data-task="task-backfill"] .task-status')
  t.equal(await backfill.textContent(), 'running')
  const blocked = page.locator('[data-blocked="task-rounding"]')
  t.match(await blocked.textContent(), /Question: Which rounding for JPY invoices\?/)
  t.match(await blocked.textContent(), /Attempt 1, assigned to bob/)
  t.match(await blocked.textContent(), /notes\/rounding\.md/)
  await screenshot(page, 'run-detail')

  const navigations: string[] = []
  page.on('framenavigated', (frame) => navigations.push(frame.url()))
  await page.locator('tr[data-task="task-schema"]').evaluate((row) => row.setAttribute('data-drawn-first', ''))
  const started = Date.now()
  await commitTaskStatus('task-backfill', 'done')
  await page.locator('tr[data-task="task-backfill"] .task-status', { hasText: 'done' }).waitFor({ timeout: LIVE_WITHIN_MS })
  t.ok(Date.now() - started <= LIVE_WITHIN_MS, `shown after ${Date.now() - started} ms`)
  t.match(await page.locator('.legend').first().textContent(), /2 done/)
  t.same(navigations, [], 'no reload')
  t.equal(await page.locator('tr[data-task="task-schema"][data-drawn-first]').count(), 1, 'the row of a task that did not change is left as it was')
  t.same(await page.locator('tr[data-task]').evaluateAll((rows) => rows.map((row) => row.getAttribute('data-task'))), ['task-schema', 'task-backfill', 'task-rounding'], 'and the rows keep their order')
})

t.test('a refetch revalidates: the browser sends its ETag, and an unchanged run detail comes back 304', async (t) => {
  const { app, url } = await serve(t)
  const page = await openPage(t, `${url}/#/runs/run-ui`)
  await page.locator('h1', { hasText: 'Migrate billing to the new ledger' }).waitFor()
  const notModified = async () => {
    const text = await app.metrics.getSingleMetricAsString('http_requests_total')
    return /route="\/api\/runs\/:runID",status_code="304"\} (\d+)/.exec(text)?.[1] ?? '0'
  }
  t.equal(await notModified(), '0')
  // An event of the run that changes nothing it shows: the page refetches, and the body is the same.
  await insertEvents({ event_type: 'noted', run_id: 'run-ui' })
  await waitUntil(async () => await notModified() !== '0', 'the refetch to be answered 304')
  t.ok(Number(await notModified()) >= 1, 'the refetch was answered 304')
  t.equal(await page.locator('h1').first().textContent(), 'Migrate billing to the new ledger', 'and the page still shows the run')
})

t.test('the thread timeline shows a new message within 2 s', async (t) => {
  const { url } = await serve(t)
  const page = await openPage(t, `${url}/#/threads/thread-ui`)
  t.equal(await page.locator('[data-message]').count(), 1)
  const db = await writer()
  const started = Date.now()
  await db.transaction().execute(async (trx) => {
    await trx.insertInto('messages').values(makeMessage({ thread_id: 'thread-ui', message_id: 'msg-answer', kind: 'answer', from_agent: 'orchestrator', to_agent: 'bob', summary: 'Round at the invoice level' })).execute()
    await trx.insertInto('events').values({ event_type: 'thread_reply', run_id: 'run-ui', task_id: 'task-rounding', thread_id: 'thread-ui' }).execute()
  })
  await page.locator('[data-message="msg-answer"]', { hasText: 'Round at the invoice level' }).waitFor({ timeout: LIVE_WITHIN_MS })
  t.ok(Date.now() - started <= LIVE_WITHIN_MS, `shown after ${Date.now() - started} ms`)
  const payload = page.locator('[data-message="msg-q"] details', { has: page.locator('summary', { hasText: 'payload' }) })
  await payload.locator('summary').click()
  t.ok(await payload.locator('pre').isVisible(), 'the payload expands')
  t.match(await payload.locator('pre').textContent(), /"invoice"/)
  await screenshot(page, 'thread')
})

t.test('the page recovers after the service restarts', async (t) => {
  const first = await serve(t)
  const page = await openPage(t, `${first.url}/#/runs/run-ui`, { expectedConsole: [SERVICE_RESTART] })
  // Every word the header says from here on.
  await page.evaluate(`{
    const live = document.getElementById('live')
    const said = globalThis.said = []
    new MutationObserver(() => { said.push(live.textContent) }).observe(live, { childList: true, characterData: true, subtree: true })
  }`)
  await first.app.close()
  await page.locator('.live:not(.is-live)').waitFor({ timeout: READY_MS })
  t.match(await page.locator('.live').textContent(), /Reconnecting|Offline/, 'it says it is not live')
  // A change committed while the service is down, then the service returns on the same port.
  await commitTaskStatus('task-schema', 'failed')
  await page.waitForFunction(() => (globalThis as unknown as { said: string[] }).said.length >= 3, undefined, { timeout: READY_MS })
  await serve(t, first.port)
  // Reconnecting and catching up are not the live promise (LIVE_WITHIN_MS): the bound of a state it reaches by itself.
  await page.locator('.live.is-live').waitFor({ timeout: READY_MS })
  const said = await page.evaluate(() => (globalThis as unknown as { said: string[] }).said)
  const untilLive = said.slice(0, said.findIndex((text) => text.startsWith('Live')))
  t.ok(untilLive.length >= 3 && untilLive.every((text) => /^(Reconnecting…|Offline · retrying…)/.test(text)),
    `between retries it never says "Connecting…" again, only why it is not live (${JSON.stringify(untilLive)})`)
  await page.locator('tr[data-task="task-schema"] .task-status', { hasText: 'failed' }).waitFor({ timeout: READY_MS })
  t.pass('live again, and it caught up on the change made while it was away')
  await commitTaskStatus('task-schema', 'done')
  await page.locator('tr[data-task="task-schema"] .task-status', { hasText: 'done' }).waitFor({ timeout: LIVE_WITHIN_MS })
  t.pass('and follows new changes')
  const [other] = await insertEvents({ run_id: 'run-other' })
  t.ok(other, 'events of other runs do not disturb it')
})

t.test('the page recovers by itself when the history has moved past its cursor (410 cursor_expired)', async (t) => {
  const first = await serve(t)
  // Refused twice: the stream, and the run's events from the first (its timeline), which then start from the oldest kept.
  const page = await openPage(t, `${first.url}/#/runs/run-ui`, { expectedConsole: [SERVICE_RESTART, /Failed to load resource: the server responded with a status of 410 .*\/api\/events(\/stream)?\?/] })
  const refused: string[] = []
  page.on('response', (response) => { if (response.status() === 410) refused.push(response.url()) })
  await first.app.close()
  await page.locator('.live:not(.is-live)').waitFor({ timeout: READY_MS })
  // While the page is away: a change, and a history whose floor (EVENTS_RETENTION) is past the page's cursor.
  await commitTaskStatus('task-rounding', 'failed')
  const db = await writer()
  await sql`update event_log_state set history_floor = (select max(event_id) from events)`.execute(db)
  t.teardown(() => sql`update event_log_state set history_floor = 0`.execute(db))
  await serve(t, first.port)
  await page.locator('tr[data-task="task-rounding"] .task-status', { hasText: 'failed' }).waitFor({ timeout: READY_MS })
  await page.locator('.live.is-live').waitFor({ timeout: READY_MS })
  t.match(refused, [/\/api\/events\/stream\?run_id=run-ui&after_event_id=\d+$/, /\/api\/events\?after_event_id=0&run_id=run-ui&limit=1000$/], 'its stream was refused with 410, then the events before the history kept')
  t.pass('it refetched the run, and is live again')
  await commitTaskStatus('task-rounding', 'blocked')
  await page.locator('tr[data-task="task-rounding"] .task-status', { hasText: 'blocked' }).waitFor({ timeout: LIVE_WITHIN_MS })
  t.pass('subscribed from the new cursor: it shows a change made afterwards')
})

t.test('the UI files are served with their types; / is the page', async (t) => {
  const { app } = await serve(t)
  const index = await app.inject('/')
  t.equal(index.statusCode, 200)
  t.match(index.headers['content-type'], /^text\/html/)
  t.match(index.body, /<script type="module" src="\/ui\/build\/ui\/app.js">/)
  t.match((await app.inject('/ui/build/ui/app.js')).headers['content-type'], /^text\/javascript/)
  t.match((await app.inject('/ui/build/client/src/index.js')).headers['content-type'], /^text\/javascript/, 'and the client it imports')
  for (const path of ['/ui/build/../../package.json', '/ui/build/client/src/nope.ts', '/ui/build/secret/x.js']) {
    t.equal((await app.inject(path)).statusCode, 404, path)
  }
  t.equal((await app.inject('/ui/build/client/src/missing.js')).statusCode, 404, 'a module not built')
  t.match((await app.inject('/ui/style.css')).headers['content-type'], /^text\/css/)
  t.ok((await app.inject('/')).headers['content-security-policy'], 'with a content security policy')
})

t.test('the UI files carry a tag: a reload revalidates each with a 304 instead of fetching it again', async (t) => {
  const { app } = await serve(t)
  for (const path of ['/', '/ui/style.css', '/ui/build/ui/app.js', '/ui/build/client/src/client.js']) {
    const first = await app.inject(path)
    t.equal(first.headers['cache-control'], 'no-cache', `${path}: kept, and revalidated before each use`)
    t.match(first.headers.etag, /^"[A-Za-z0-9_-]{22}"$/)
    const again = await app.inject({ url: path, headers: { 'if-none-match': first.headers.etag as string } })
    t.equal(again.statusCode, 304, `${path}: 304 while unchanged`)
    t.equal(again.body, '')
    t.equal((await app.inject({ url: path, headers: { 'if-none-match': '"another"' } })).statusCode, 200, `${path}: 200 for another tag`)
  }
})

t.test('the page preloads the runs list\'s first page with its modules, by a script its policy allows by hash', async (t) => {
  const { app } = await serve(t)
  const page = await app.inject('/')
  const scripts = [...page.body.matchAll(/<script>(.*?)<\/script>/gs)].map(([, text]) => text!)
  t.match(scripts, [/\/api\/runs\?limit=50/], 'one inline script: the preload')
  t.same(scripts.map((text) => `'sha256-${createHash('sha256').update(text).digest('base64')}'`), UI_INLINE_SCRIPT_HASHES, 'UI_INLINE_SCRIPT_HASHES are its hashes')
  t.ok(page.headers['content-security-policy']?.toString().includes(`script-src 'self' ${UI_INLINE_SCRIPT_HASHES.join(' ')};`), 'and the policy allows it')
})

t.test('no page logs an error or a warning: the runs list, each page by a link to it, /docs', async (t) => {
  const { url } = await serve(t)
  const pages = [
    { path: '/', readySelector: 'tr[data-run="run-ui"]' },
    { path: '/#/?status=blocked', readySelector: '.empty' },
    { path: '/#/runs/run-ui', readySelector: '[data-task="task-backfill"]' },
    { path: '/#/threads/thread-ui', readySelector: '[data-message="msg-q"]' },
    { path: '/#/activity', readySelector: '.live.is-live' },
    { path: '/docs', readySelector: '#operations-runs-listRuns' },
    { path: '/docs/', readySelector: '#operations-runs-listRuns' }
  ]
  const opened = await Promise.all(pages.map(async ({ path, readySelector }) => ({ path, page: await openPage(t, `${url}${path}`, { readySelector }) })))
  // Some arrive late: the browser warns of a preload nobody read 3 s after the page's load event.
  await new Promise((resolve) => setTimeout(resolve, 4000))
  for (const { path, page } of opened) assertNoProblems(t, page, path)
})

t.test('relative times tick: a run\'s "started N s ago" moves on without a redraw', async (t) => {
  const { url } = await serve(t)
  const now = new Date().toISOString()
  await insertGraph({ runs: [makeRun({ run_id: 'run-just-started', goal: 'Just started', created_at: now, updated_at: now })] })
  const page = await openPage(t, `${url}/#/runs/run-just-started`)
  const started = page.locator('.meta time').first()
  await started.evaluate((element) => element.setAttribute('data-drawn-first', ''))
  const before = await started.textContent()
  t.match(before, /^\d+ s ago$/)
  // Drawn again each second, at the timer's own phase: a stamp may be up to
  // a second stale (more on a busy machine), so wait for it to move on.
  const later = Number.parseInt(before!) + 2
  const stamp = page.locator('time[data-drawn-first]')
  await waitUntil(async () => Number.parseInt(await stamp.textContent() ?? '') >= later, `"${later} s ago"`, READY_MS)
  const after = await stamp.textContent()
  t.match(after, /^\d+ s ago$/, 'the same element, not a new snapshot\'s')
  t.ok(Number.parseInt(after!) >= later, `${before}, then ${after}`)
})

t.test('the activity page\'s "updated" moves with each event that arrives', async (t) => {
  const { url } = await serve(t)
  const page = await openPage(t, `${url}/#/activity`)
  const live = page.locator('.live')
  const before = await live.textContent()
  t.match(before, /^Live · updated /)
  // Past the second the stamp shows (toLocaleTimeString).
  await new Promise((resolve) => setTimeout(resolve, 1100))
  const [eventId] = await insertEvents({ event_type: 'task_done', run_id: 'run-ui', summary: 'a new event' })
  await page.locator(`li[data-event="${eventId}"]`).waitFor({ timeout: LIVE_WITHIN_MS })
  const after = await live.textContent()
  t.match(after, /^Live · updated /)
  t.not(after, before, `${before}, then ${after}`)
})
