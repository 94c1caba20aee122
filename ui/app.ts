/*
 * The reference client of the API, on ocp-api-client: a runs list (status
 * and "needs an answer" filters, paging), a run detail, a thread timeline and the latest activity,
 * each kept live by the client's list-then-watch (it refetches what it shows
 * on events and starts over by itself on 410 cursor_expired). This file
 * draws, and signs in when the service needs a token (the end of the file).
 */
import { ApiError, createClient, CursorExpired, type Artifact, type AuthInfo, type Event, type Live, type RunDetailEnvelope, type RunList, type SignIn, type StreamStatus, type ThreadDetailEnvelope } from '../client/src/index.js'

// Streams open with a stream token scoped to what they show (when the page holds a token at all): the token the
// user signed in with never goes in a URL.
const client = createClient({ url: location.origin, streamTokens: true })

// ---- DOM helpers: text only, never HTML from data ---------------------------

type Child = Node | string | number | null | undefined | false
function h (tag: string, attributes: Record<string, string> = {}, ...children: Child[]): HTMLElement {
  const element = document.createElement(tag)
  for (const [name, value] of Object.entries(attributes)) element.setAttribute(name, value)
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue
    element.append(typeof child === 'number' ? String(child) : child)
  }
  return element
}

const KNOWN_STATUSES = new Set(['done', 'running', 'blocked', 'failed', 'ready'])
const statusClass = (status: string) => KNOWN_STATUSES.has(status) ? status : 'other'
/** A status as text (colour only repeats it). */
const statusBadge = (status: string) => h('span', { class: `status status-${statusClass(status)}` }, status)

function age (iso: string): string {
  const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000)
  if (seconds < 60) return `${Math.floor(seconds)} s ago`
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`
  if (seconds < 86_400) return `${Math.floor(seconds / 3600)} h ago`
  return `${Math.floor(seconds / 86_400)} d ago`
}
const time = (iso: string) => h('time', { datetime: iso, title: iso }, age(iso))

/**
 * Draws the relative times under `root` again every second (their finest
 * unit), so that "12 s ago" does not stay put between snapshots. One timer
 * for the page shown; the returned function stops it.
 */
function keepTimesCurrent (root: HTMLElement): () => void {
  const timer = setInterval(() => {
    for (const stamp of root.querySelectorAll('time')) {
      const text = age(stamp.dateTime)
      // Only what changed: the rest of the page is left alone (selection, screen readers).
      if (stamp.textContent !== text) stamp.textContent = text
    }
  }, 1000)
  return () => clearInterval(timer)
}

const runHref = (runId: string) => `#/runs/${encodeURIComponent(runId)}`
const threadHref = (threadId: string) => `#/threads/${encodeURIComponent(threadId)}`

/** Task counts as a compact bar, with the same counts in words beside it. */
function countsBar (counts: Record<string, number>, total: number): HTMLElement {
  const entries = Object.entries(counts).sort(([a], [b]) => a.localeCompare(b))
  const bar = h('div', { class: 'bar', role: 'img', 'aria-label': entries.map(([status, n]) => `${n} ${status}`).join(', ') || 'no tasks' })
  for (const [status, n] of entries) {
    const segment = h('span', { class: `bar-${statusClass(status)}` })
    // Through the CSSOM: a style attribute is an inline style, which the content security policy refuses.
    segment.style.width = `${(100 * n) / Math.max(total, 1)}%`
    bar.append(segment)
  }
  const legend = h('p', { class: 'legend' }, entries.length === 0 ? 'no tasks' : entries.map(([status, n]) => `${n} ${status}`).join(' · '))
  return h('div', {}, bar, legend)
}

function jsonDetails (label: string, value: unknown): HTMLElement {
  return h('details', {}, h('summary', {}, label), h('pre', {}, JSON.stringify(value, null, 2)))
}

function artifactList (artifacts: Artifact[] | undefined): HTMLElement | null {
  if (artifacts === undefined || artifacts.length === 0) return null
  return h('ul', { class: 'artifacts' }, ...artifacts.map((artifact) =>
    h('li', {}, h('span', { class: 'id' }, artifact.path), ' ', `(${artifact.kind})`, jsonDetails('metadata', artifact.metadata_json))))
}

// ---- pages ---------------------------------------------------------------

/**
 * The run list's address: `#/?status=a,b&blocked=true&cursor=K`, K the
 * page key (the API's `cursor` parameter); the first page without one.
 */
interface RunsView { status: string, blocked: boolean, pageKey?: string }
const RUNS_PAGE_SIZE = 50 // ui/index.html preloads the first page at this size: change both together
function runsHref (view: RunsView): string {
  const query = new URLSearchParams()
  if (view.status !== '') query.set('status', view.status)
  if (view.blocked) query.set('blocked', 'true')
  if (view.pageKey !== undefined) query.set('cursor', view.pageKey)
  const text = query.toString()
  return text === '' ? '#/' : `#/?${text}`
}

function runsFilter (view: RunsView, seen: string[]): HTMLElement {
  // An example from the statuses of the runs shown: never one no run has.
  const input = h('input', { name: 'status', value: view.status, placeholder: seen.length === 0 ? 'one status, or several' : `e.g. ${seen.slice(0, 2).join(',')}`, 'aria-describedby': 'status-hint' }) as HTMLInputElement
  const needsAnswer = h('input', { type: 'checkbox', name: 'blocked' }) as HTMLInputElement
  needsAnswer.checked = view.blocked
  const form = h('form', { class: 'filter', role: 'search' },
    h('label', {}, 'Status ', input), ' ', h('button', { type: 'submit' }, 'Filter'), ' ',
    h('label', { class: 'check' }, needsAnswer, ' Needs an answer'),
    view.status === '' && !view.blocked ? null : h('a', { href: runsHref({ status: '', blocked: false }), class: 'clear' }, 'all runs'),
    h('p', { id: 'status-hint', class: 'legend' }, 'One status or several, separated by commas. On this page: ',
      ...seen.flatMap((status, i) => [i > 0 ? ', ' : '', h('a', { href: runsHref({ status, blocked: view.blocked }) }, status)]),
      '. Needs an answer: runs with a blocked task.'))
  const apply = () => {
    location.hash = runsHref({ status: input.value.split(',').map((item) => item.trim()).filter(Boolean).join(','), blocked: needsAnswer.checked })
  }
  form.addEventListener('submit', (event) => {
    event.preventDefault()
    apply()
  })
  // A checkbox filters at once, as a list's filter chips do.
  needsAnswer.addEventListener('change', apply)
  return form
}

function renderRuns (view: RunsView, data: RunList, next: string | undefined): HTMLElement {
  const seen = [...new Set(data.runs.map((item) => item.run.status))].sort()
  const paging = h('nav', { class: 'paging', 'aria-label': 'Pages' },
    view.pageKey === undefined ? null : h('a', { href: runsHref({ status: view.status, blocked: view.blocked }), rel: 'first' }, '« Newest'),
    next === undefined ? null : h('a', { href: runsHref({ status: view.status, blocked: view.blocked, pageKey: next }), rel: 'next' }, 'Older runs »'))
  const which = [view.status === '' ? '' : view.status.split(',').join(', '), view.blocked ? 'needing an answer' : ''].filter(Boolean).join(', ')
  const title = h('h1', {}, which === '' ? 'Runs' : `Runs: ${which}`)
  if (data.runs.length === 0) {
    const empty = view.blocked ? 'No run is waiting for an answer.' : view.status === '' ? 'No runs yet.' : 'No runs in this status.'
    return h('div', {}, title, runsFilter(view, seen), h('p', { class: 'empty' }, empty), paging)
  }
  return h('div', {},
    title,
    runsFilter(view, seen),
    h('table', {},
      h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Run'), h('th', { scope: 'col' }, 'Status'), h('th', { scope: 'col' }, 'Tasks'),
        h('th', { scope: 'col', class: 'hide-narrow' }, 'Total'), h('th', { scope: 'col', class: 'hide-narrow' }, 'Started'))),
      h('tbody', {}, ...data.runs.map((item) => {
        const waiting = item.task_counts.blocked ?? 0
        return h('tr', { 'data-run': item.run.run_id },
          h('td', {}, h('a', { href: runHref(item.run.run_id) }, item.run.goal || item.run.run_id), h('div', { class: 'id' }, item.run.run_id)),
          h('td', {}, statusBadge(item.run.status)),
          h('td', {}, countsBar(item.task_counts, item.total_tasks), waiting === 0 ? null : h('p', { class: 'waiting' }, `${waiting} waiting for an answer`)),
          h('td', { class: 'hide-narrow' }, item.total_tasks),
          h('td', { class: 'hide-narrow' }, time(item.run.created_at)))
      }))),
    paging)
}

function renderRun (data: RunDetailEnvelope): HTMLElement {
  const { run, task_counts: counts, total_tasks: total, tasks, blocked_tasks: blocked } = data.run
  return h('div', {},
    h('p', { class: 'crumbs' }, h('a', { href: '#/' }, '← All runs')),
    h('h1', {}, run.goal || run.run_id),
    h('p', { class: 'meta' }, 'Status: ', statusBadge(run.status), ' · ', h('span', { class: 'id' }, run.run_id), ' · started ', time(run.created_at), ' · updated ', time(run.updated_at)),
    run.summary ? h('p', {}, run.summary) : null,
    h('h2', {}, `Tasks by status (${total})`),
    countsBar(counts, total),
    h('h2', {}, `Blocked (${blocked.length})`),
    blocked.length === 0
      ? h('p', { class: 'empty' }, 'No task is waiting on a question.')
      : h('div', { class: 'cards' }, ...blocked.map((item) => h('article', { class: 'card', 'data-blocked': item.task.task_id },
        h('h3', {}, item.task.title, ' ', h('span', { class: 'id' }, item.task.task_id)),
        h('p', { class: 'meta' }, `Attempt ${item.attempt.attempt_no}, assigned to ${item.attempt.assigned_to} · `,
          h('a', { href: threadHref(item.attempt.thread_id) }, 'open the thread')),
        h('div', { class: 'question' },
          h('p', {}, h('strong', {}, 'Question: '), item.question.summary, ' ', h('span', { class: 'meta' }, `from ${item.question.from_agent}, `), time(item.question.created_at)),
          h('details', {}, h('summary', {}, 'full question'), h('pre', {}, item.question.body)),
          artifactList(item.question.artifacts))))),
    h('h2', {}, `Tasks (${tasks.length})`),
    tasks.length === 0
      ? h('p', { class: 'empty' }, 'No tasks yet.')
      : h('table', {},
        h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Task'), h('th', { scope: 'col' }, 'Status'), h('th', { scope: 'col', class: 'hide-narrow' }, 'Priority'),
          h('th', { scope: 'col', class: 'hide-narrow' }, 'Default to'), h('th', { scope: 'col', class: 'hide-narrow' }, 'Attempt'), h('th', { scope: 'col' }, 'Updated'))),
        h('tbody', {}, ...tasks.map((task) => h('tr', { 'data-task': task.task_id },
          h('td', {}, task.title, h('div', { class: 'id' }, task.task_id)),
          h('td', { class: 'task-status' }, statusBadge(task.status)),
          h('td', { class: 'hide-narrow' }, task.priority),
          h('td', { class: 'hide-narrow' }, task.default_to ?? '—'),
          h('td', { class: 'hide-narrow' }, task.latest_attempt_no ?? '—'),
          h('td', {}, time(task.updated_at)))))))
}

function renderThread (data: ThreadDetailEnvelope): HTMLElement {
  const { thread, messages } = data.thread
  return h('div', {},
    h('p', { class: 'crumbs' }, h('a', { href: runHref(thread.run_id) }, `← Run ${thread.run_id}`)),
    h('h1', {}, thread.subject || thread.thread_id),
    h('p', { class: 'meta' }, 'Status: ', statusBadge(thread.status), ` · task ${thread.task_id} · ${thread.created_by} → ${thread.assigned_to} · priority ${thread.priority}`),
    h('h2', {}, `Messages (${messages.length})`),
    messages.length === 0
      ? h('p', { class: 'empty' }, 'No messages yet.')
      : h('ol', { class: 'timeline' }, ...messages.map((message) => h('li', { class: 'card message', 'data-message': message.message_id },
        h('header', {}, h('strong', {}, `${message.from_agent} → ${message.to_agent}`), h('span', { class: 'status status-other' }, message.kind), time(message.created_at)),
        h('p', { class: 'summary' }, message.summary),
        h('details', {}, h('summary', {}, 'body'), h('pre', {}, message.body)),
        jsonDetails('payload', message.payload_json),
        artifactList(message.artifacts)))))
}

// ---- the activity page: the latest events across all runs, live ----------

const ACTIVITY_SIZE = 100

function eventItem (event: Event): HTMLElement {
  const target = event.thread_id !== '' ? h('a', { href: threadHref(event.thread_id) }, `thread ${event.thread_id}`)
    : event.run_id !== '' ? h('a', { href: runHref(event.run_id) }, `run ${event.run_id}`) : null
  return h('li', { 'data-event': String(event.event_id) },
    h('span', { class: 'id' }, `#${event.event_id}`), ' ', h('strong', {}, event.event_type), ' ',
    target, event.thread_id !== '' && event.run_id !== '' ? h('span', { class: 'meta' }, ' in ', h('a', { href: runHref(event.run_id) }, `run ${event.run_id}`)) : null,
    event.summary === '' ? null : h('span', {}, ` · ${event.summary}`), ' ', time(event.created_at))
}

/** The latest events (newest first), then each new one as it commits; on 410, starts over. `onDrawn` after each. */
function mountActivity (main: HTMLElement, onStatus: (status: StreamStatus) => void, onDrawn: () => void): Live {
  const controller = new AbortController()
  const { signal } = controller
  const list = h('ol', { class: 'activity', reversed: '' })
  main.replaceChildren(h('div', {}, h('h1', {}, 'Activity'), h('p', { class: 'meta' }, `The latest ${ACTIVITY_SIZE} events across all runs, newest first, live.`), list))
  const show = (events: Event[]) => {
    for (const event of events) list.prepend(eventItem(event))
    while (list.childElementCount > ACTIVITY_SIZE) list.lastElementChild!.remove()
    onDrawn()
  }
  async function start (): Promise<void> {
    while (!signal.aborted) {
      try {
        // The position now (any read carries it), then the events just before it.
        const now = (await client.runsRead({ limit: 1 }, signal)).eventCursor ?? 0
        const recent = await client.eventsRead({ after_event_id: Math.max(0, now - ACTIVITY_SIZE), limit: ACTIVITY_SIZE }, signal)
          .catch((error: unknown) => { if (error instanceof CursorExpired) return client.eventsRead({ limit: ACTIVITY_SIZE }, signal); throw error })
        list.replaceChildren()
        show(recent.body.events)
        const after = recent.body.events.at(-1)?.event_id ?? now
        for await (const event of client.watch({}, { after: Math.max(after, recent.eventCursor ?? 0), signal, onStatus })) show([event])
      } catch (error) {
        if (signal.aborted) return
        if (error instanceof ApiError && error.status === 401) {
          refused(error)
          return
        }
        if (!(error instanceof CursorExpired)) {
          main.querySelector('.error')?.remove()
          main.append(h('p', { class: 'error' }, (error as Error).message))
          await new Promise((resolve) => setTimeout(resolve, 2000))
        }
      }
    }
  }
  void start()
  return { close: () => controller.abort() }
}

// ---- routing: the address is the page --------------------------------------

const live = document.getElementById('live')!
function showLive (status: StreamStatus | { state: 'down', text: string }) {
  const text = status.state === 'live' ? `Live · updated ${new Date().toLocaleTimeString()}`
    : status.state === 'connecting' ? 'Connecting…'
      : status.state === 'down' ? status.text
        : status.error === undefined ? 'Reconnecting…' : `Offline · retrying… (${status.error.detail})`
  live.textContent = text
  live.className = `live${status.state === 'live' ? ' is-live' : status.state === 'retrying' || status.state === 'down' ? ' is-down' : ''}`
}

/** Shows the page of `hash` and keeps it current; returns how to stop. */
function mount (hash: string): Live {
  const main = document.getElementById('app')!
  const onStatus = (status: StreamStatus) => showLive(status)
  const onError = (error: ApiError) => {
    if (error.status === 401) {
      refused(error)
      return
    }
    main.replaceChildren(h('p', { class: 'crumbs' }, h('a', { href: '#/' }, '← All runs')), h('h1', {}, document.title.split(' · ')[0]!), h('p', { class: 'error' }, error.detail))
  }
  // Each new snapshot (or event, on the activity page) is drawn at once; the indicator says when it was read.
  const updated = () => { if (live.classList.contains('is-live')) showLive({ state: 'live' }) }
  const drawn = (element: HTMLElement) => {
    main.replaceChildren(element)
    updated()
  }
  const [, kind, rawId] = /^#\/(runs|threads)\/(.+)$/.exec(hash) ?? []
  if (kind !== undefined && rawId !== undefined) {
    const id = decodeURIComponent(rawId)
    document.title = `${kind === 'runs' ? 'Run' : 'Thread'} ${id} · Control plane`
    return kind === 'runs'
      ? client.liveRun(id, (body) => drawn(renderRun(body)), { onStatus, onError })
      : client.liveThread(id, (body) => drawn(renderThread(body)), { onStatus, onError })
  }
  if (hash === '#/activity') {
    document.title = 'Activity · Control plane'
    return mountActivity(main, onStatus, updated)
  }
  const params = new URLSearchParams(hash.replace(/^#\/?\??/, ''))
  const view: RunsView = { status: params.get('status') ?? '', blocked: params.get('blocked') === 'true', ...(params.get('cursor') ? { pageKey: params.get('cursor')! } : {}) }
  document.title = 'Runs · Control plane'
  return client.liveRuns({ status: view.status, limit: RUNS_PAGE_SIZE, ...(view.blocked ? { blocked: true } : {}), ...(view.pageKey === undefined ? {} : { cursor: view.pageKey }) },
    (body, read) => drawn(renderRuns(view, body, read.next)), { onStatus, onError })
}

let current: Live | undefined
function route () {
  current?.close()
  if (signedOut) return
  showLive({ state: 'connecting' })
  const main = document.getElementById('app')!
  const page = mount(location.hash)
  const stopTimes = keepTimesCurrent(main)
  current = { close: () => { page.close(); stopTimes() } }
  main.focus({ preventScroll: true })
}
window.addEventListener('hashchange', route)

// ---- signing in: only when the service needs a token (GET /api/auth) ------

/** The token, for this tab's session only: gone when the tab closes, or on "Sign out". */
const TOKEN_KEY = 'ocp-api.token'
/** The sign-in under way with the identity provider: what checks and completes its answer. */
const SIGN_IN_KEY = 'ocp-api.sign-in'

interface PendingSignIn { verifier: string, state: string, nonce: string, tokenEndpoint: string, clientId: string, redirectUri: string, hash: string }

/** What the service said of authentication; the sign-in page needs it. */
let authInfo: AuthInfo = { required: false, sign_in: null }
/** The sign-in page is shown: no page is mounted, none reads. */
let signedOut = false

const base64url = (bytes: Uint8Array) => btoa(String.fromCharCode(...bytes)).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '')
const randomText = () => base64url(crypto.getRandomValues(new Uint8Array(32)))

/** A JWT's claims, unchecked (the service checks the signature; this only names who signed in); undefined for a static token. */
function claimsOf (token: string): Record<string, unknown> | undefined {
  const [, payload] = token.split('.')
  if (payload === undefined) return undefined
  try {
    const text = atob(payload.replace(/-/g, '+').replace(/_/g, '/'))
    const claims: unknown = JSON.parse(new TextDecoder().decode(Uint8Array.from(text, (char) => char.charCodeAt(0))))
    return typeof claims === 'object' && claims !== null ? claims as Record<string, unknown> : undefined
  } catch {
    return undefined
  }
}

/** The header's "who, and Sign out", while signed in to a service that needs a token. */
const account = h('div', { class: 'account' })
function showAccount (token: string | undefined) {
  if (token === undefined) {
    account.remove()
    return
  }
  const claims = claimsOf(token)
  const who = [claims?.email, claims?.preferred_username, claims?.sub].find((value) => typeof value === 'string' && value !== '') as string | undefined
  const button = h('button', { type: 'button', class: 'sign-out' }, 'Sign out')
  button.addEventListener('click', () => signOut())
  account.replaceChildren(h('span', { class: 'who' }, who === undefined ? 'Signed in with a token' : `Signed in as ${who}`), ' ', button)
  document.querySelector('header.top')!.append(account)
}

/** Shows the pages, reading with `token` (none when the service needs none). */
function signIn (token: string | undefined) {
  signedOut = false
  client.setToken(token)
  showAccount(token)
  route()
}

/** Forgets the token and shows the sign-in page, saying `message` (why) when given. */
function signOut (message?: string) {
  signedOut = true
  current?.close()
  current = undefined
  sessionStorage.removeItem(TOKEN_KEY)
  client.setToken(undefined)
  showAccount(undefined)
  showSignInPage(message)
}

/** A read or a stream refused the token (401): back to the sign-in page, saying the service's reason. */
function refused (error: ApiError) {
  if (signedOut) return
  void (async () => {
    // Authentication was off when the page loaded, or /api/auth was out of reach: what it says now, for the page.
    if (!authInfo.required) authInfo = await client.auth().catch(() => ({ required: true, sign_in: null }))
    signOut(`Your token was refused: ${error.detail.replace(/\.$/, '')}. Sign in again.`)
  })()
}

function showSignInPage (message?: string) {
  const main = document.getElementById('app')!
  document.title = 'Sign in · Control plane'
  live.textContent = 'Not signed in'
  live.className = 'live'
  const input = h('input', { id: 'token', name: 'token', type: 'password', autocomplete: 'off', spellcheck: 'false', required: '' }) as HTMLInputElement
  const form = h('form', { class: 'sign-in-token' },
    h('label', { for: 'token' }, 'API token or identity-provider token (JWT)'),
    h('div', { class: 'row' }, input, ' ', h('button', { type: 'submit' }, 'Sign in')))
  form.addEventListener('submit', (event) => {
    event.preventDefault()
    const token = input.value.trim()
    if (token === '') return
    sessionStorage.setItem(TOKEN_KEY, token)
    signIn(token)
  })
  const provider = authInfo.sign_in
  let providerPart: HTMLElement | null = null
  if (provider !== null) {
    const button = h('button', { type: 'button', class: 'sign-in-provider' }, `Sign in with ${new URL(provider.issuer).host}`)
    button.addEventListener('click', () => {
      beginProviderSignIn(provider).catch((error: unknown) => showSignInPage(`Signing in failed: ${(error as Error).message}`))
    })
    providerPart = h('div', { class: 'provider' }, button, h('p', { class: 'legend' }, 'Or paste a token:'))
  }
  main.replaceChildren(h('section', { class: 'sign-in', 'aria-labelledby': 'sign-in-title' },
    h('h1', { id: 'sign-in-title' }, 'Sign in'),
    message === undefined ? null : h('p', { class: 'error', role: 'alert' }, message),
    h('p', {}, 'This service needs a token to show its runs.'),
    providerPart,
    form,
    h('p', { class: 'legend' }, 'The token is kept in this tab only, until you sign out or close it.')))
  if (provider === null || message !== undefined) input.focus()
}

/** To the identity provider's sign-in (authorization code with PKCE, S256); it sends the browser back here with a code. */
async function beginProviderSignIn (provider: SignIn) {
  // crypto.subtle exists only on a secure page: https, or this machine.
  if (globalThis.crypto?.subtle === undefined) throw new Error('signing in with an identity provider needs the page served over https')
  const pending: PendingSignIn = {
    verifier: randomText(),
    state: randomText(),
    nonce: randomText(),
    tokenEndpoint: provider.token_endpoint,
    clientId: provider.client_id,
    redirectUri: location.origin + location.pathname,
    hash: location.hash
  }
  const challenge = base64url(new Uint8Array(await crypto.subtle.digest('SHA-256', new TextEncoder().encode(pending.verifier))))
  sessionStorage.setItem(SIGN_IN_KEY, JSON.stringify(pending))
  const target = new URL(provider.authorization_endpoint)
  const params = { response_type: 'code', client_id: provider.client_id, redirect_uri: pending.redirectUri, scope: provider.scope, state: pending.state, code_challenge: challenge, code_challenge_method: 'S256', nonce: pending.nonce }
  for (const [name, value] of Object.entries(params)) target.searchParams.set(name, value)
  location.assign(target.href)
}

/**
 * The identity provider's answer, when this load is one (?code=&state=, or
 * ?error=): checks it against the sign-in this tab started, trades the code
 * for tokens, and returns the ID token. The address loses the answer
 * either way. Undefined when this load is not an answer.
 */
async function finishProviderSignIn (): Promise<string | undefined> {
  const answer = new URLSearchParams(location.search)
  if (!answer.has('code') && !answer.has('error')) return undefined
  const kept = sessionStorage.getItem(SIGN_IN_KEY)
  sessionStorage.removeItem(SIGN_IN_KEY)
  const pending = kept === null ? undefined : JSON.parse(kept) as PendingSignIn
  history.replaceState(null, '', `${location.pathname}${pending?.hash ?? location.hash}`)
  if (pending === undefined || answer.get('state') !== pending.state) throw new Error('the identity provider\'s answer is not for a sign-in this tab started')
  if (answer.has('error')) throw new Error(`the identity provider said: ${answer.get('error_description') || answer.get('error')}`)
  let response: Response
  try {
    response = await fetch(pending.tokenEndpoint, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded', accept: 'application/json' },
      body: new URLSearchParams({ grant_type: 'authorization_code', code: answer.get('code')!, redirect_uri: pending.redirectUri, client_id: pending.clientId, code_verifier: pending.verifier })
    })
  } catch {
    throw new Error('the identity provider could not be reached')
  }
  const tokens = await response.json().catch(() => ({})) as { id_token?: unknown, error?: unknown, error_description?: unknown }
  if (!response.ok || typeof tokens.id_token !== 'string') {
    throw new Error(`the identity provider gave no token (${String(tokens.error_description ?? tokens.error ?? `HTTP ${response.status}`)})`)
  }
  if (claimsOf(tokens.id_token)?.nonce !== pending.nonce) throw new Error('the identity provider\'s token is not for this sign-in (its nonce)')
  return tokens.id_token
}

async function start () {
  let failure: string | undefined
  try {
    const token = await finishProviderSignIn()
    if (token !== undefined) sessionStorage.setItem(TOKEN_KEY, token)
  } catch (error) {
    failure = `Signing in failed: ${(error as Error).message}.`
  }
  // Out of reach, or a service from before authentication: go on without; a refusal brings the sign-in page later.
  authInfo = await client.auth().catch(() => authInfo)
  if (!authInfo.required) {
    signIn(undefined)
    return
  }
  const token = sessionStorage.getItem(TOKEN_KEY)
  if (token === null || failure !== undefined) signOut(failure)
  else signIn(token)
}
void start()
