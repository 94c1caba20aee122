import t from 'tap'
import { encodeOffset } from '../events/durable/offsets.ts'
import { needsServer, testDatabaseUrl } from './helpers/database.ts'
import { insertGraph, makeRun } from './helpers/fixtures.ts'
import { requestsOnRoute } from './helpers/metrics.ts'
import { startNginx } from './helpers/nginx.ts'
import { startReplicas } from './helpers/replicas.ts'
import { insertEvents } from './helpers/sse.ts'
import { sleep } from './helpers/wait.ts'

// The Durable Streams read path across replicas behind the shipped nginx
// config (deploy/nginx): an offset one replica handed out resumes on
// another, and a crowd of long-polls of one run collapses into about one
// upstream request per new event.

/** Watchers of one run (DS_CROWD=1000 for the crowd; 50 keeps CI light). */
const CROWD = Number(process.env.DS_CROWD ?? 50)
const ROUTE = '/api/streams/runs/:runID'

interface Envelope { event_id: number }

t.test('replicas behind nginx', { skip: needsServer('replicas are processes of their own over one Postgres') }, async (t) => {
  await insertGraph({ runs: [makeRun({ run_id: 'ds-scale' })] })
  const replicas = await startReplicas(t, await testDatabaseUrl(), 2)
  const [a, b] = replicas.map((replica) => `http://127.0.0.1:${replica.port}`)
  const lb = await startNginx(t, replicas.map((replica) => replica.port))

  /** Requests the replicas answered on the run's stream route. */
  const upstream = async () => {
    let total = 0
    for (const replica of replicas) total += requestsOnRoute(await (await fetch(`http://127.0.0.1:${replica.port}/metrics`)).text(), ROUTE)
    return total
  }

  await t.test('an offset handed out by one replica resumes on the other', async (t) => {
    const first = await insertEvents({ run_id: 'ds-scale' }, { run_id: 'ds-scale' })
    const fromA = await fetch(`${a}/api/streams/runs/ds-scale?offset=${encodeOffset(first[0]!)}&live=long-poll`)
    t.same((await fromA.json() as Envelope[]).map((event) => event.event_id), [first[1]])
    const offset = fromA.headers.get('stream-next-offset')!
    const more = await insertEvents({ run_id: 'ds-scale' })
    const waiting = await fetch(`${b}/api/streams/runs/ds-scale?offset=${offset}&live=long-poll`)
    t.equal(waiting.status, 200)
    t.same((await waiting.json() as Envelope[]).map((event) => event.event_id), more, 'replica B serves what follows A\'s offset, nothing twice')
  })

  await t.test(`${CROWD} long-polls of one run through nginx: about one upstream request per new event`, async (t) => {
    const tail = await fetch(`${lb}/api/streams/runs/ds-scale?offset=now`)
    const offset = tail.headers.get('stream-next-offset')!
    const before = await upstream()
    const url = `${lb}/api/streams/runs/ds-scale?cursor=1&live=long-poll&offset=${offset}`
    const crowd = Array.from({ length: CROWD }, () => fetch(url).then(async (response) => ({
      status: response.status, cache: response.headers.get('x-cache-status'), ids: (await response.json() as Envelope[]).map((event) => event.event_id)
    })))
    await sleep(500)
    const [written] = await insertEvents({ run_id: 'ds-scale' })
    const answers = await Promise.all(crowd)
    t.ok(answers.every((answer) => answer.status === 200 && answer.ids.length === 1 && answer.ids[0] === written), 'every watcher got the event')
    const requests = await upstream() - before
    t.ok(requests <= 2, `${requests} upstream request(s) for ${CROWD} watchers`)
  })
})
