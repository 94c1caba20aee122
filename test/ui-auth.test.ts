import type { FastifyInstance } from 'fastify'
import type { Page } from 'playwright-core'
import t, { type Test } from 'tap'
import type { Config } from '../config.ts'
import { build } from './helpers/app.ts'
import { assertNoProblems, openPage, READY_MS, screenshot, SERVICE_RESTART } from './helpers/browser.ts'
import { startIssuer } from './helpers/issuer.ts'
import { insertGraph, makeRun, makeTask, writer } from './helpers/fixtures.ts'

// The web UI with authentication on, in Chromium: it asks for a token (or
// signs in with the identity provider, authorization code with PKCE),
// keeps it for the tab's session, opens its streams with scoped stream
// tokens only, signs out, and says why when a token is refused.

const TOKEN = 'ui-auth-static-secret'
const LIVE_WITHIN_MS = 3000
/** What Chromium logs for a request refused with 401: a refused token, on purpose. */
const REFUSED = /Failed to load resource: the server responded with a status of 401/

t.before(() => insertGraph({
  runs: [makeRun({ run_id: 'run-ua', goal: 'Rotate the signing keys' }), makeRun({ run_id: 'run-ub', goal: 'Audit the access logs' })],
  tasks: [
    makeTask({ run_id: 'run-ua', task_id: 'task-rotate', title: 'Rotate the keys', status: 'running' }),
    makeTask({ run_id: 'run-ua', task_id: 'task-announce', title: 'Announce the rotation', status: 'ready' })
  ]
}))

async function serve (t: Test, overrides: Partial<Config>): Promise<{ app: FastifyInstance, url: string }> {
  const app = await build(t, { EVENTS_POLL_INTERVAL_MS: 50, SSE_RETRY_MS: 300, ...overrides })
  await app.listen({ port: 0, host: '127.0.0.1' })
  return { app, url: `http://127.0.0.1:${(app.server.address() as { port: number }).port}` }
}

async function commitTaskStatus (taskId: string, status: string) {
  const db = await writer()
  await db.transaction().execute(async (trx) => {
    await trx.updateTable('tasks').set({ status, updated_at: new Date() }).where('run_id', '=', 'run-ua').where('task_id', '=', taskId).execute()
    await trx.insertInto('events').values({ event_type: `task_${status}`, run_id: 'run-ua', task_id: taskId }).execute()
  })
}

/** Every URL the page asks for, and the Authorization header it sent. */
function recordRequests (page: Page): Array<{ url: string, authorization?: string }> {
  const requests: Array<{ url: string, authorization?: string }> = []
  page.on('request', (request) => {
    const authorization = request.headers().authorization
    requests.push({ url: request.url(), ...(authorization === undefined ? {} : { authorization }) })
  })
  return requests
}

const FORM = 'form.sign-in-token'

async function signInWith (page: Page, token: string) {
  await page.getByLabel('API token or identity-provider token (JWT)').fill(token)
  await page.getByRole('button', { name: 'Sign in', exact: true }).click()
}

t.test('without authentication: no sign-in, no sign out; the page preloads the runs list as before', async (t) => {
  const { app, url } = await serve(t, {})
  const page = await openPage(t, `${url}/`, { readySelector: 'tr[data-run="run-ua"]' })
  t.equal(await page.locator(FORM).count(), 0, 'no sign-in form')
  t.equal(await page.locator('.account').count(), 0, 'no sign-out control')
  t.match((await app.inject('/')).body, /<script>if \(/, 'the preload script is served')
  await page.waitForTimeout(3500) // the browser warns of a preload not used within 3 s
  assertNoProblems(t, page, 'without authentication')
})

t.test('static tokens: the form; a wrong token refused, saying so; the right one shows the runs, live, streams with stream tokens only; reload keeps it; sign out', async (t) => {
  const { app, url } = await serve(t, { API_TOKENS: TOKEN })
  t.notMatch((await app.inject('/')).body, /<script>/, 'no preload with authentication on: it could not carry the token')
  let requests: Array<{ url: string, authorization?: string }> = []
  const page = await openPage(t, `${url}/#/runs/run-ua`, {
    readySelector: FORM,
    expectedConsole: [REFUSED],
    beforeGoto: (page) => { requests = recordRequests(page) }
  })
  t.ok(await page.getByLabel('API token or identity-provider token (JWT)').isVisible(), 'the token field, labelled')
  t.equal(await page.getByRole('button', { name: /^Sign in with/ }).count(), 0, 'no identity provider to sign in with')
  t.equal(await page.locator('.account').count(), 0, 'no sign-out control while signed out')
  t.match(await page.locator('.live').textContent(), /Not signed in/)
  await screenshot(page, 'sign-in')

  await signInWith(page, 'not-the-token')
  const refusal = page.locator('.sign-in [role="alert"]')
  await refusal.waitFor()
  t.match(await refusal.textContent(), /^Your token was refused: the token is not one this service accepts\. Sign in again\.$/, 'the service\'s reason, in plain words')
  t.ok(await page.locator(FORM).isVisible(), 'and the form again')
  t.equal(await page.evaluate(() => sessionStorage.getItem('ocp-api.token')), null, 'the refused token is not kept')

  await signInWith(page, TOKEN)
  await page.locator('h1', { hasText: 'Rotate the signing keys' }).waitFor()
  await page.locator('.live.is-live').waitFor({ timeout: READY_MS })
  t.match(page.url(), /#\/runs\/run-ua$/, 'on the page asked for')
  t.match(await page.locator('.account').textContent(), /Signed in with a token/)
  const started = Date.now()
  await commitTaskStatus('task-rotate', 'done')
  await page.locator('tr[data-task="task-rotate"] .task-status', { hasText: 'done' }).waitFor({ timeout: LIVE_WITHIN_MS })
  t.pass(`the run detail is live: shown after ${Date.now() - started} ms`)
  await screenshot(page, 'signed-in-run')

  const streams = requests.filter((request) => request.url.includes('/api/events/stream'))
  t.ok(streams.length >= 1, 'it opened a stream')
  for (const stream of streams) {
    t.match(stream.url, /\/api\/events\/stream\?run_id=run-ua&after_event_id=\d+&stream_token=[^&]+$/, 'the stream carries a stream token')
    t.equal(stream.authorization, undefined, 'and no Authorization header')
  }
  t.match(requests.filter((request) => request.url.includes('/api/stream-token')), [{ url: /\/api\/stream-token\?run_id=run-ua$/, authorization: `Bearer ${TOKEN}` }], 'the stream token is scoped to the run, asked for with the token')
  t.notOk(requests.some((request) => request.url.includes(TOKEN) || request.url.includes('access_token')), 'the static token is in no URL')
  t.ok(requests.some((request) => request.url.endsWith('/api/runs/run-ua') && request.authorization === `Bearer ${TOKEN}`), 'reads send it as a header')

  await page.reload()
  await page.locator('h1', { hasText: 'Rotate the signing keys' }).waitFor()
  await page.locator('.live.is-live').waitFor({ timeout: READY_MS })
  t.equal(await page.locator(FORM).count(), 0, 'a reload keeps the session: no form')

  await page.getByRole('link', { name: 'Activity' }).click()
  await page.locator('h1', { hasText: 'Activity' }).waitFor()
  await page.locator('.live.is-live').waitFor({ timeout: READY_MS })
  t.match(requests.filter((request) => request.url.includes('/api/stream-token')).at(-1), { url: /\/api\/stream-token$/ }, 'the activity page: an all-events stream token')

  const signOutAnswer = page.waitForResponse((response) => response.url().endsWith('/api/auth/sign-out'))
  await page.getByRole('button', { name: 'Sign out' }).click()
  t.equal((await (await signOutAnswer).allHeaders())['clear-site-data'], '"cache", "storage"', 'the service has the browser clear its cache and storage')
  await page.locator(FORM).waitFor()
  t.equal(await page.locator('.account').count(), 0, 'signed out: the control is gone')
  t.equal(await page.evaluate(() => sessionStorage.getItem('ocp-api.token')), null, 'the token forgotten')
  await page.reload()
  await page.locator(FORM).waitFor()
  t.pass('a reload after signing out asks again')

  // Another tab (a new session) asks too.
  const other = await openPage(t, `${url}/`, { readySelector: FORM })
  t.equal(await other.locator('tr[data-run]').count(), 0)
})

t.test('a token refused mid-session (the service no longer takes it): back to the form, saying why', async (t) => {
  const first = await serve(t, { API_TOKENS: TOKEN })
  const page = await openPage(t, `${first.url}/`, { readySelector: FORM, expectedConsole: [REFUSED, SERVICE_RESTART] })
  await signInWith(page, TOKEN)
  await page.locator('tr[data-run="run-ua"]').waitFor()
  // The service restarts with other tokens on the same port: the page's next requests are refused.
  const port = Number(new URL(first.url).port)
  await first.app.close()
  const app = await build(t, { EVENTS_POLL_INTERVAL_MS: 50, SSE_RETRY_MS: 300, API_TOKENS: 'a-new-token' })
  await app.listen({ port, host: '127.0.0.1' })
  await commitTaskStatus('task-announce', 'running')
  const refusal = page.locator('.sign-in [role="alert"]')
  await refusal.waitFor({ timeout: READY_MS })
  t.match(await refusal.textContent(), /^Your token was refused: .+\. Sign in again\.$/)
  t.equal(await page.locator('.account').count(), 0)
})

t.test('the page\'s policy lets it reach the identity provider\'s token endpoint, once discovery named it', async (t) => {
  const connectSrc = async (app: FastifyInstance, path = '/') => String((await app.inject(path)).headers['content-security-policy']).split(';').find((directive) => directive.startsWith('connect-src'))
  const issuer = await startIssuer(t)
  const { app } = await serve(t, { AUTH_ISSUERS: JSON.stringify([{ issuer: issuer.url, audience: 'ocp-api', ui_client_id: 'ocp-ui' }]) })
  t.equal(await connectSrc(app), `connect-src 'self' ${new URL(issuer.url).origin}`, 'its origin in connect-src')
  t.equal(await connectSrc(app, '/ui/style.css'), "connect-src 'self'", 'on the page only')
  const { app: unreachable } = await serve(t, { AUTH_ISSUERS: JSON.stringify([{ issuer: 'http://127.0.0.1:9', audience: 'ocp-api', ui_client_id: 'ocp-ui' }]) })
  t.equal(await connectSrc(unreachable), "connect-src 'self'", 'a provider out of reach: the policy as it is (the page offers no sign-in with it)')
  const { app: noUi } = await serve(t, { AUTH_ISSUERS: JSON.stringify([{ issuer: issuer.url, audience: 'ocp-api' }]) })
  t.equal(await connectSrc(noUi), "connect-src 'self'", 'no ui_client_id: no sign-in, the policy as it is')
})

t.test('an identity provider: a pasted JWT; an expired one refused, saying so; "Sign in with" completes the PKCE flow', async (t) => {
  const issuer = await startIssuer(t)
  const { url } = await serve(t, { AUTH_ISSUERS: JSON.stringify([{ issuer: issuer.url, audience: 'ocp-api', ui_client_id: 'ocp-ui' }]) })
  let requests: Array<{ url: string, authorization?: string }> = []
  const page = await openPage(t, `${url}/#/runs/run-ua`, { readySelector: FORM, expectedConsole: [REFUSED], beforeGoto: (page) => { requests = recordRequests(page) } })
  const host = new URL(issuer.url).host
  const provider = page.getByRole('button', { name: `Sign in with ${host}` })
  t.ok(await provider.isVisible(), `a "Sign in with ${host}" button`)
  await screenshot(page, 'sign-in-provider')

  const expired = await issuer.sign({}, { expiresIn: -3600 })
  await signInWith(page, expired)
  const refusal = page.locator('.sign-in [role="alert"]')
  await refusal.waitFor()
  t.equal(await refusal.textContent(), 'Your token was refused: the token has expired. Sign in again.')

  const jwt = await issuer.sign({ email: 'grace@example.com' })
  await signInWith(page, jwt)
  await page.locator('h1', { hasText: 'Rotate the signing keys' }).waitFor()
  await page.locator('.live.is-live').waitFor({ timeout: READY_MS })
  t.match(await page.locator('.account').textContent(), /Signed in as grace@example\.com/)
  t.notOk(requests.some((request) => request.url.includes(jwt)), 'the JWT is in no URL')
  t.ok(requests.some((request) => /\/api\/events\/stream\?.*stream_token=/.test(request.url)), 'the stream opened with a stream token')
  await page.getByRole('button', { name: 'Sign out' }).click()
  await page.locator(FORM).waitFor()

  const navigations: string[] = []
  page.on('framenavigated', (frame) => { if (frame === page.mainFrame()) navigations.push(frame.url()) })
  await page.getByRole('button', { name: `Sign in with ${host}` }).click()
  await page.locator('h1', { hasText: 'Rotate the signing keys' }).waitFor({ timeout: READY_MS })
  await page.locator('.live.is-live').waitFor({ timeout: READY_MS })
  t.match(await page.locator('.account').textContent(), /Signed in as ada@example\.com/, 'signed in as the provider\'s user')
  t.equal(page.url(), `${url}/#/runs/run-ua`, 'the address cleaned of the code and state, on the page it started from')
  const authorize = new URL(navigations.find((address) => address.startsWith(`${issuer.url}/authorize`)) ?? requests.find((request) => request.url.startsWith(`${issuer.url}/authorize`))!.url)
  t.match(Object.fromEntries(authorize.searchParams), {
    response_type: 'code',
    client_id: 'ocp-ui',
    redirect_uri: `${url}/`,
    scope: 'openid',
    state: /^[\w-]{43}$/,
    code_challenge: /^[\w-]{43}$/,
    code_challenge_method: 'S256',
    nonce: /^[\w-]{43}$/
  }, 'the authorization request: code, PKCE S256, state and nonce')
  const kept = await page.evaluate(() => sessionStorage.getItem('ocp-api.token'))
  t.match(kept, /^ey/, 'the ID token, kept for the session')
  t.equal(await page.evaluate(() => sessionStorage.getItem('ocp-api.sign-in')), null, 'the sign-in\'s secrets are gone')
  t.notOk(requests.some((request) => request.url.includes(kept!) && !request.url.startsWith(issuer.url)), 'the ID token is in no URL')

  // A return with a state this tab did not send (a forged redirect) is refused.
  await page.goto(`${url}/?code=forged&state=forged`)
  await refusal.waitFor()
  t.match(await refusal.textContent(), /^Signing in failed: the identity provider's answer is not for a sign-in this tab started\.$/)
  t.equal(page.url(), `${url}/`, 'the address cleaned')
})
