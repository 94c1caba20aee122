import { spawn, type ChildProcess } from 'node:child_process'
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync, chmodSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { EventSource } from 'eventsource'
import pg from 'pg'
import t from 'tap'
import { testDatabaseUrl } from './helpers/database.js'
import { insertEvents } from './helpers/sse.js'
import { freePort, sleep, waitUntil } from './helpers/wait.js'

// Three replicas behind Debian's nginx, with the config shipped in
// deploy/nginx: one replica is killed while clients stream through the
// proxy; their EventSources reconnect to the others, resume from
// Last-Event-ID, and receive every event exactly once, while writers commit
// out of order, some roll back, and some stay open for a second.

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const NGINX = process.env.NGINX_BIN ?? '/usr/sbin/nginx'
const REPLICAS = 3
const CLIENTS = 6

const answers = async (url: string) => {
  try { return (await fetch(url)).ok } catch { return false }
}

t.test('a replica dies under streaming clients: every event arrives once, in order', async (t) => {
  if (!existsSync(NGINX)) throw new Error(`nginx not found at ${NGINX}: apt-get install nginx-light (or set NGINX_BIN)`)
  const databaseUrl = await testDatabaseUrl()

  // The replicas: the service as it runs in production, one process each.
  const replicas: Array<{ port: number, process: ChildProcess }> = []
  for (let i = 0; i < REPLICAS; i++) {
    const port = await freePort()
    const child = spawn(process.execPath, [...process.execArgv, join(root, 'server.ts')], {
      cwd: root,
      env: { ...process.env, DATABASE_URL: databaseUrl, PORT: String(port), HOST: '127.0.0.1', LOG_LEVEL: 'warn', MIGRATE_ON_START: 'false', EVENTS_POLL_INTERVAL_MS: '50', SSE_RETRY_MS: '200' },
      stdio: ['ignore', 'ignore', 'inherit']
    })
    replicas.push({ port, process: child })
  }
  t.teardown(() => { for (const replica of replicas) replica.process.kill('SIGKILL') })
  await waitUntil(async () => (await Promise.all(replicas.map((replica) => answers(`http://127.0.0.1:${replica.port}/ready`)))).every(Boolean), 'the replicas', 30_000)

  // nginx, with the shipped config, in a directory of its own.
  const dir = mkdtempSync(join(tmpdir(), 'ocp-nginx-'))
  chmodSync(dir, 0o777) // workers run as an unprivileged user when nginx starts as root
  for (const temp of ['client_body', 'proxy', 'fastcgi', 'uwsgi', 'scgi']) mkdirSync(join(dir, temp), { mode: 0o777 })
  const lbPort = await freePort()
  const site = readFileSync(join(root, 'deploy/nginx/ocp-api.conf.template'), 'utf8')
    .replace('${OCP_API_UPSTREAMS}', replicas.map((replica) => `server 127.0.0.1:${replica.port};`).join(' '))
    .replace('${OCP_LB_PORT}', `127.0.0.1:${lbPort}`)
  writeFileSync(join(dir, 'ocp-api.conf'), site)
  writeFileSync(join(dir, 'nginx.conf'), `
worker_processes 1;
daemon off;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path ${dir}/client_body;
  proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fastcgi;
  uwsgi_temp_path ${dir}/uwsgi;
  scgi_temp_path ${dir}/scgi;
  include ${dir}/ocp-api.conf;
}
`)
  const nginx = spawn(NGINX, ['-p', dir, '-c', join(dir, 'nginx.conf')], { stdio: ['ignore', 'ignore', 'inherit'] })
  t.teardown(() => { nginx.kill('SIGTERM'); rmSync(dir, { recursive: true, force: true }) })
  const lb = `http://127.0.0.1:${lbPort}`
  await waitUntil(() => answers(`${lb}/health`), 'nginx', 30_000)

  // Clients stream through the proxy: half unfiltered, half for one run.
  const [base] = await insertEvents({ event_type: 'base' })
  const clients = Array.from({ length: CLIENTS }, (_, i) => {
    const filtered = i % 2 === 1
    const source = new EventSource(`${lb}/api/events/stream?after_event_id=${base}${filtered ? '&run_id=so-run' : ''}`)
    const client = { filtered, source, received: [] as number[], opens: 0 }
    source.onopen = () => { client.opens++ }
    source.onmessage = (message) => { client.received.push(JSON.parse(message.data).event_id) }
    return client
  })
  t.teardown(() => { for (const client of clients) client.source.close() })
  await waitUntil(() => clients.every((client) => client.opens === 1), 'the clients to connect', 30_000)

  // Writers commit events out of order (four at a time, sleeping at random
  // around the insert), some roll back, some hold their transaction open
  // for a second; one replica is killed in the middle.
  const written: Array<{ id: number, run: string }> = []
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 4 })
  pool.on('error', () => {})
  t.teardown(() => pool.end())
  const writeOne = async (i: number) => {
    const connection = await pool.connect()
    try {
      const run = i % 3 === 0 ? 'other-run' : 'so-run'
      await connection.query('begin')
      await connection.query('select pg_sleep($1)', [Math.random() * 0.02])
      const { rows: [row] } = await connection.query(
        'insert into events (event_type, run_id, summary) values ($1, $2, $3) returning event_id', ['task_added', run, `event ${i}`])
      await connection.query('select pg_sleep($1)', [i % 20 === 5 ? 1 : Math.random() * 0.02])
      if (i % 9 === 4) {
        await connection.query('rollback')
        return
      }
      await connection.query('commit')
      written.push({ id: Number(row.event_id), run })
    } finally {
      connection.release()
    }
  }
  const writing = (async () => {
    for (let i = 0; i < 80; i += 4) await Promise.all([i, i + 1, i + 2, i + 3].map(writeOne))
  })()
  await sleep(500)
  replicas[0]!.process.kill('SIGKILL')
  await writing
  written.sort((a, b) => a.id - b.id)

  const all = written.map((event) => event.id)
  const forRun = written.filter((event) => event.run === 'so-run').map((event) => event.id)
  await waitUntil(() => clients.every((client) => client.received.length >= (client.filtered ? forRun : all).length), 'every event at every client', 30_000)
  for (const [i, client] of clients.entries()) {
    t.same(client.received, client.filtered ? forRun : all, `client ${i} (${client.filtered ? 'run filter' : 'unfiltered'}): every event once, in order`)
  }
  const reconnected = clients.filter((client) => client.opens > 1).length
  t.ok(reconnected >= 1, `${reconnected} of ${CLIENTS} clients were on the killed replica and reconnected to another`)
  t.ok(await answers(`${lb}/api/runs`), 'the proxy still serves reads through the surviving replicas')
})
