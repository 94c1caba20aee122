import { readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'
import { sql } from 'kysely'
import t, { type Test } from 'tap'
import { issuersOf, loadConfig } from '../config.ts'
import { loadFixtureFile } from '../db/fixtures.ts'
import { setRunStatus } from '../db/writer.ts'
import { serve, untilWindowLearnsFloor } from './helpers/app.ts'
import { codeBlocks, runAsUser, shell, type CodeBlock } from './helpers/docs.ts'
import { writer } from './helpers/fixtures.ts'
import { root } from './helpers/run.ts'
import { openStream } from './helpers/sse.ts'
import { waitUntil } from './helpers/wait.ts'

// Examples that run as written. Every code block a reader may copy, in
// README.md, docs/ (but reference.md and orchestrators.md, whose own tests
// check them) and client/README.md, is run here against the service with
// the demo's data (fixtures/demo.json), `localhost:8080` being the test's
// service; or run by test/client-package.test.ts (the client package in a
// project, the CI recipes); or listed in NOT_RUN with why. Each is named
// by its file and the start of its text; a new block fails the inventory
// until it is one of these. Snippets written for a web
// page run in Node with what a page has (test/helpers/page.mjs).

const DOCUMENTS = [
  'README.md',
  ...readdirSync(join(root, 'docs')).filter((name) => name.endsWith('.md') && name !== 'reference.md' && name !== 'orchestrators.md').map((name) => `docs/${name}`),
  'client/README.md'
]

/** A block as the entries below name it: its file, then its text. */
const textOf = (block: CodeBlock) => `${block.file}: ${block.code}`

const RUN_ELSEWHERE: Record<string, string> = {
  'client/README.md: npm init -y': 'test/client-package.test.ts',
  'client/README.md: import { ApiError, createClient': 'test/client-package.test.ts',
  'client/README.md: node run-page.mts run-demo-1': 'test/client-package.test.ts',
  'client/README.md: const url = await api.signedStreamUrl(': 'test/client-package.test.ts',
  'client/README.md: npx ocp-api runs': 'test/client-package.test.ts',
  'client/README.md: npx -y "$OCP_API_URL/client/ocp-api-client.tgz" wait': 'test/client-package.test.ts',
  'docs/clients.md: export OCP_API_URL=': 'test/client-package.test.ts (its npx line; docker compose: test/compose/stack.ts)',
  'docs/authentication.md: permissions:': 'test/client-package.test.ts (the step "The run finishes"; the token step is GitHub\'s)'
}

const NOT_RUN: Record<string, string> = {
  'README.md: npm ci && npm run demo': 'the demo itself (test/demo.test.ts)',
  'docs/development.md: npm ci && npm run demo': 'the demo itself (test/demo.test.ts)',
  'README.md: DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm test': 'the test suite itself',
  'docs/development.md: DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm test': 'the test suite itself (both blocks)',
  'docs/development.md: DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm start': 'the server as npm start runs it (test/server.test.ts)',
  'docs/development.md: npm run seed -- fixtures/demo.json && npm start     # embedded database': 'the fixture loader (test/fixtures.test.ts; this file loads fixtures/demo.json)',
  'docs/durable-streams.md: # --database: the database the service reads (the suite writes there);': 'the official conformance suite (test/conformance.test.ts)',
  'docs/operating.md: POSTGRES_PASSWORD=<a password of yours> docker compose up --build': 'needs a Docker engine (test/compose/stack.ts)',
  'docs/operating.md: npm run test:compose': 'needs a Docker engine (test/compose/stack.ts)',
  'docs/responses.md: Link: </api/runs?limit=50&cursor=WyIyMDI2LTExLTIx...>; rel="next"': 'a header\'s shape, not a command (test/runs.test.ts pages with it)',
  'docs/stream.md: retry: 2000\n: unavailable': 'what a refused stream sends (test/stream-retry.test.ts)'
}

const TOKEN = 'docs-token'
const pageModule = pathToFileURL(join(root, 'test/helpers/page.mjs')).href

t.before(async () => { await loadFixtureFile(await writer(), join(root, 'fixtures/demo.json')) })

/** The services the examples run against: without authentication (curl), and with it (the page snippets, which send their token). */
async function services (t: Test) {
  const open = await serve(t, { EVENTS_POLL_INTERVAL_MS: 50 })
  const guarded = await serve(t, { EVENTS_POLL_INTERVAL_MS: 50, API_TOKENS: TOKEN })
  return { open, guarded }
}
type Services = Awaited<ReturnType<typeof services>>

/** Something happens to the demo's run-demo-43 (a run_status event), for the examples that wait for one. */
const poke = async () => setRunStatus(await writer(), 'run-demo-43', 'running', 'Poked by the docs')

/** The commands of a shell block: its lines but comments and blank ones, `localhost:8080` being `host`. */
const commands = (code: string, host: string) => code.split('\n').filter((line) => line.trim() !== '' && !line.startsWith('#')).map((line) => line.replaceAll('localhost:8080', host))

/** Runs each curl of a shell block: a read answers JSON (or, with -i, a 200), and no error; a stream (-N) gets the event that happens while it runs. */
async function curls (t: Test, block: CodeBlock, { open }: Services) {
  for (const command of commands(block.code, new URL(open.url).host)) {
    if (/\bcurl -N\b/.test(command)) {
      const ran = await runAsUser(['bash', '-o', 'pipefail', '-ec', command], root, {}, async (output, interrupt) => {
        await waitUntil(() => output().startsWith('retry: '), `${command}: the stream to open`)
        await poke()
        await waitUntil(() => /\ndata: \{.*"summary": "Poked by the docs"/.test(output()), `${command}: the event`)
        interrupt()
      })
      t.equal(ran.signal, 'SIGINT', `${command}: streams until interrupted`)
      continue
    }
    const ran = await runAsUser(['bash', '-o', 'pipefail', '-ec', command], root, {})
    t.equal(ran.code, 0, `${command}: ${ran.stderr}`)
    t.notMatch(ran.stdout, /"error"/, `${command}: no error`)
    if (/\bcurl -\w*i/.test(command)) t.match(ran.stdout, /^HTTP\/1\.1 200 /, `${command}: 200`)
    else t.not(JSON.parse(ran.stdout), null, `${command}: JSON`)
  }
}

/** A page's snippet, as written (`http://localhost:8080` being `origin`), in Node with what a page has; `during` sees what it printed, one JSON value a line. */
async function page (block: CodeBlock, origin: string, during: (printed: () => Array<Record<string, unknown>>) => Promise<void>) {
  const code = block.code.replaceAll('http://localhost:8080', origin)
  const inputType = block.language === 'ts' ? 'module-typescript' : 'module'
  const ran = await runAsUser([process.execPath, '--import', pageModule, `--input-type=${inputType}`, '-e', code], root, { PAGE_ORIGIN: origin, PAGE_TOKEN: TOKEN }, async (output, interrupt) => {
    const printed = () => output().split('\n').filter((line) => line.startsWith('{')).map((line) => JSON.parse(line) as Record<string, unknown>)
    await during(printed)
    interrupt()
  })
  return ran
}

/** What a test does with each block it runs, by block. */
const RUN_HERE: Record<string, (t: Test, block: CodeBlock, services: Services) => Promise<void>> = {
  'README.md: curl -s localhost:8080/api/runs/run-demo-43 | jq \'.run.task_counts\'': curls,
  'docs/development.md: curl -N localhost:8080/api/events/stream': curls,
  'docs/stream.md: curl -N \'localhost:8080/api/events/stream?run_id=run-demo-43\'': curls,

  // The stream's wire format, shown with an event of the demo: exactly what the service sends for it.
  'docs/stream.md: retry: 2000\n\nid: ': async (t, block, { open }) => {
    const [retry, , id, data] = block.code.split('\n')
    const eventId = id!.slice('id: '.length)
    const stream = await openStream(open.url, `/api/events/stream?run_id=run-demo-43&after_event_id=${Number(eventId) - 1}`)
    t.teardown(stream.close)
    await stream.waitFor((s) => s.frames.some((frame) => frame.data !== undefined))
    t.equal(`retry: ${stream.frames[0]!.retry}`, retry, 'the retry: sent at connect')
    const frame = stream.frames.find((candidate) => candidate.data !== undefined)!
    t.equal(`id: ${frame.id}`, id)
    t.equal(`data: ${frame.data}`, data, 'the demo\'s event, as the stream sends it')
  },

  // A page of a service without authentication: it sends no token.
  'docs/stream.md: const runId = \'run-demo-43\'': async (t, block, { open }) => {
    const body = await (await fetch(`${open.url}/api/runs/run-demo-43`)).json()
    await page(block, open.url, async (printed) => {
      await waitUntil(() => printed().some((line) => 'open' in line), 'the EventSource to open')
      t.same(printed()[0], { render: body }, 'the run, rendered')
      await poke()
      await waitUntil(() => printed().some((line) => 'refetchSoon' in line), 'a refetch on the event')
    })
  },

  'docs/authentication.md: const response = await fetch(\'/api/stream-token': async (t, block, { guarded }) => {
    await page(block, guarded.url, async (printed) => {
      await waitUntil(() => printed().some((line) => 'open' in line), 'the EventSource to open with its stream token')
      t.match(printed()[0], { open: /\/api\/events\/stream\?run_id=run-demo-43&stream_token=[\w-]+\.[\w-]+\.[\w-]+$/ })
    })
  },

  'docs/durable-streams.md: import { stream } from \'@durable-streams/client\'': async (t, block, { guarded }) => {
    const fixture = JSON.parse(readFileSync(join(root, 'fixtures/demo.json'), 'utf8')) as { events: Array<{ event_id: number, run_id: string }> }
    const expected = fixture.events.filter((event) => event.run_id === 'run-demo-43').map((event) => event.event_id)
    await page(block, guarded.url, async (printed) => {
      const rendered = () => printed().filter((line) => 'render' in line).map((line) => (line.render as { event_id: number }).event_id)
      await waitUntil(() => rendered().length >= expected.length && printed().some((line) => 'localStorage' in line), 'the run\'s events')
      t.same(rendered().slice(0, expected.length), expected, 'every event of the run, from the oldest, in order')
      t.match(printed().find((line) => 'localStorage' in line), { localStorage: { 'run-demo-43-offset': /\S/ } }, 'the offset to resume from, saved')
    })
  },

  'docs/authentication.md: [': async (t, block) => {
    t.equal(issuersOf({ AUTH_ISSUERS: block.code }).length, 2, 'AUTH_ISSUERS as the example writes it')
  },

  'docs/authentication.md: AUTH_ISSUERS=': async (t, block) => {
    const ran = await shell(`${block.code}\nprintf '%s' "$AUTH_ISSUERS"`, root, {})
    t.equal(ran.code, 0, ran.stderr)
    t.match(issuersOf(loadConfig({ AUTH_ISSUERS: ran.stdout })), [{ issuer: 'https://token.actions.githubusercontent.com', claims: { repository: 'acme/app' } }], 'the shell\'s quoting keeps it whole')
  },

  // Run in a transaction rolled back: the roles are the server's, not this test database's.
  'docs/operating.md: create role ocp_reader': async (t, block) => {
    const rolledBack = new Error('rolled back')
    await t.rejects((await writer()).transaction().execute(async (trx) => {
      await sql.raw(block.code).execute(trx)
      throw rolledBack
    }), rolledBack, 'every statement runs')
  },

  // Last: it removes history (the floor it shows), as a retention would.
  'docs/operating.md: $ curl -s \'localhost:8080/api/events?after_event_id=': async (t, block, { open }) => {
    const [command, expected] = block.code.split('\n')
    const floor = Number(/events up to (\d+) are gone/.exec(expected!)![1])
    const db = await writer()
    await sql`update event_log_state set history_floor = ${floor}`.execute(db)
    t.teardown(() => sql`update event_log_state set history_floor = 0`.execute(db))
    await untilWindowLearnsFloor(open.app, floor)
    const ran = await shell(command!.slice('$ '.length).replaceAll('localhost:8080', new URL(open.url).host), root, {})
    t.equal(ran.stdout, expected, 'what it answers')
  }
}

const blocks = DOCUMENTS.flatMap((file) => codeBlocks(file))

t.test('every code block is run, here or elsewhere, or says why not', async (t) => {
  const entries = [...Object.keys(RUN_HERE), ...Object.keys(RUN_ELSEWHERE), ...Object.keys(NOT_RUN)]
  const texts = blocks.map(textOf)
  t.same(texts.filter((text) => entries.filter((entry) => text.startsWith(entry)).length !== 1).map((text) => text.split('\n')[0]), [], 'each block is named by one entry')
  t.same(entries.filter((entry) => !texts.some((text) => text.startsWith(entry))), [], 'and each entry names a block')
  // The ids the documentation names are the demo's (run-42 never was).
  const fixture = readFileSync(join(root, 'fixtures/demo.json'), 'utf8')
  const named = new Set(blocks.flatMap((block) => [...block.code.matchAll(/\b(?:run|thread|task|msg)-(?:demo-)?\d+\b/g)].map((match) => match[0])))
  t.same([...named].filter((id) => !fixture.includes(`"${id}"`)), [], `every id an example names is in fixtures/demo.json (${[...named].join(', ')})`)
})

t.test('the examples, as written, against the demo\'s data', async (t) => {
  const running = await services(t)
  for (const [entry, run] of Object.entries(RUN_HERE)) {
    const block = blocks.find((candidate) => textOf(candidate).startsWith(entry))!
    await t.test(textOf(block).split('\n')[0]!, (t) => run(t, block, running))
  }
})
