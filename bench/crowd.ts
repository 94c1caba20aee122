/*
 * A crowd of Durable Streams long-pollers watching one run through the
 * compose deployment's nginx (BENCHMARKS.md, "A crowd through the compose
 * deployment's nginx"; issue 21: "1,000 long-pollers of one run through the compose nginx").
 *
 *   npm run bench:crowd                                  (1,000 pollers, 20 events 1 s apart)
 *   npm run bench:crowd -- --pollers 200 --events 5      (smaller)
 *
 * Needs a Docker engine with the base images (docs/operating.md, "Docker Compose").
 * Brings up docker-compose.yml's scale profile as a project of its own
 * (three replicas behind nginx, free ports on loopback, `down -v` at the
 * end), then opens --pollers long-pollers of one run through nginx, each
 * looping as the official client does (echoing Stream-Next-Offset and
 * Stream-Cursor), and commits --events events to that run, --interval-ms
 * apart, straight into the stack's Postgres. Prints the requests that
 * reached the replicas per new event (their http_requests_total on the
 * run's stream route; target <= 2), the commit-to-delivery latency over
 * every poller and event, and how nginx answered (X-Cache-Status).
 */
import { Agent, request } from 'node:http'
import { parseArgs } from 'node:util'
import pg from 'pg'
import { composeStack } from '../test/helpers/compose.ts'
import { requestsOnRoute } from '../test/helpers/metrics.ts'
import { sleep, waitUntil } from '../test/helpers/wait.ts'

const { values: args } = parseArgs({
  options: {
    pollers: { type: 'string', default: '1000' },
    events: { type: 'string', default: '20' },
    'interval-ms': { type: 'string', default: '1000' }
  }
})
const POLLERS = Number(args.pollers)
const EVENTS = Number(args.events)
const INTERVAL_MS = Number(args['interval-ms'])
const RUN = 'crowd-run'
const ROUTE = '/api/streams/runs/:runID'
const REPLICAS = ['api', 'api-2', 'api-3']

const percentile = (sorted: number[], p: number) => sorted.length === 0 ? Number.NaN : sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * p))]!

/** Commit time of each event, by id: taken just before COMMIT is sent (a conservative start). */
const committedAt = new Map<number, number>()
const latencies: number[] = []
const cacheStatuses = new Map<string, number>()
const statuses = new Map<number, number>()

interface Answer { status: number, headers: Record<string, string | string[] | undefined>, body: string }

function get (url: string, agent: Agent): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = request(url, { agent }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (chunk: string) => { body += chunk })
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body }))
      res.on('error', reject)
    })
    req.on('error', reject)
    req.end()
  })
}

/** One watcher: long-polls from `offset` until stopped, echoing the offset and cursor it is given. */
async function poller (lb: string, agent: Agent, offset: string, received: Set<number>, running: () => boolean): Promise<void> {
  let cursor: string | undefined
  while (running()) {
    const url = `${lb}/api/streams/runs/${RUN}?offset=${offset}&live=long-poll${cursor === undefined ? '' : `&cursor=${cursor}`}`
    let answer: Answer
    try {
      answer = await get(url, agent)
    } catch {
      statuses.set(0, (statuses.get(0) ?? 0) + 1)
      await sleep(200)
      continue
    }
    const now = Date.now()
    statuses.set(answer.status, (statuses.get(answer.status) ?? 0) + 1)
    const cache = String(answer.headers['x-cache-status'] ?? '-')
    cacheStatuses.set(cache, (cacheStatuses.get(cache) ?? 0) + 1)
    if (answer.status === 200) {
      for (const event of JSON.parse(answer.body) as Array<{ event_id: number }>) {
        if (received.has(event.event_id)) throw new Error(`event ${event.event_id} delivered twice to one poller`)
        received.add(event.event_id)
        const sent = committedAt.get(event.event_id)
        if (sent !== undefined) latencies.push(now - sent)
      }
    } else if (answer.status !== 204) {
      await sleep(200)
      continue
    }
    offset = String(answer.headers['stream-next-offset'])
    cursor = answer.headers['stream-cursor'] as string | undefined
  }
}

async function main () {
  const stack = await composeStack('ocp-crowd')
  console.log(`${stack.description}; ${POLLERS} pollers, ${EVENTS} events ${INTERVAL_MS} ms apart`)
  const upstream = () => {
    let total = 0
    for (const replica of REPLICAS) total += requestsOnRoute(stack.metricsOf(replica), ROUTE)
    return total
  }
  try {
    stack.scale('up', '-d', '--build')
    console.log(`replicas healthy after ${await stack.healthy(['postgres', ...REPLICAS])} ms`)
    const writer = new pg.Client({ connectionString: stack.orchestrator })
    await writer.connect()
    await writer.query("insert into runs (run_id, goal, summary, status) values ($1, 'crowd', 'crowd', 'running')", [RUN])
    await waitUntil(async () => (await fetch(`${stack.lb}/api/runs/${RUN}`).catch(() => undefined))?.status === 200, 'reads through nginx', 60_000)

    const tail = await fetch(`${stack.lb}/api/streams/runs/${RUN}?offset=now`)
    const offset = tail.headers.get('stream-next-offset')!
    const agent = new Agent({ keepAlive: true, maxSockets: Infinity })
    let running = true
    const received = Array.from({ length: POLLERS }, () => new Set<number>())
    const crowd = received.map((ids) => poller(stack.lb, agent, offset, ids, () => running))
    await sleep(3000) // every poller waiting, upstream or on nginx's cache lock
    const before = upstream()
    const written: number[] = []
    for (let i = 0; i < EVENTS; i++) {
      await writer.query('begin')
      const { rows } = await writer.query("insert into events (event_type, run_id, summary, payload) values ('task_running', $1, 'crowd', '{}') returning event_id", [RUN])
      const id = Number(rows[0].event_id)
      committedAt.set(id, Date.now())
      written.push(id)
      await writer.query('commit')
      await sleep(INTERVAL_MS)
    }
    const deadline = Date.now() + 60_000
    while (received.some((ids) => ids.size < EVENTS) && Date.now() < deadline) await sleep(100)
    const requests = upstream() - before
    running = false
    await writer.end()

    latencies.sort((a, b) => a - b)
    const complete = received.filter((ids) => written.every((id) => ids.has(id))).length
    console.log(`pollers with every event once: ${complete} / ${POLLERS}`)
    console.log(`requests reaching the replicas: ${requests} for ${EVENTS} events = ${(requests / EVENTS).toFixed(2)} per new event (target <= 2)`)
    console.log(`commit-to-delivery over ${latencies.length} deliveries: p50 ${percentile(latencies, 0.5)} ms, p99 ${percentile(latencies, 0.99)} ms, max ${latencies[latencies.length - 1]} ms`)
    console.log(`answers by status: ${JSON.stringify(Object.fromEntries(statuses))}; by X-Cache-Status: ${JSON.stringify(Object.fromEntries(cacheStatuses))}`)
    agent.destroy()
    void Promise.allSettled(crowd) // pollers still waiting end with the stack
  } finally {
    stack.scale('down', '-v', '--remove-orphans')
  }
}

main().then(() => process.exit(0), (err: unknown) => {
  console.error(err)
  process.exit(1)
})
