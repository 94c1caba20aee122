import fp from 'fastify-plugin'
import type { FastifyReply, FastifyRequest, onResponseHookHandler } from 'fastify'
import { collectDefaultMetrics, Counter, Gauge, Registry, type Metric, type MetricValueWithName } from 'prom-client'
import { withRouteHook } from '../route-hooks.js'
import { UNMATCHED } from './request-log.js'

declare module 'fastify' {
  interface FastifyInstance {
    /** This application's Prometheus registry (served at /metrics). */
    metrics: Registry
    /** The requests answered, by method, route and status (countRequests below). */
    requestMetrics: RequestMetrics
  }
}

/** Upper bounds of http_request_duration_seconds' buckets, in seconds. */
const DURATION_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]

/** The answers of one (method, route, status): their number, total duration, and durations by bucket (not cumulative; the last is +Inf). */
interface AnswerSeries {
  readonly method: string
  readonly status: number
  count: number
  seconds: number
  readonly buckets: number[]
}

/** The answers of one route, by method and status (a few of each: a list beats a map). */
export class RouteAnswers {
  readonly series: AnswerSeries[] = []
  constructor (readonly route: string) {}

  count (method: string, status: number, seconds: number): void {
    let series: AnswerSeries | undefined
    for (const candidate of this.series) {
      if (candidate.status === status && candidate.method === method) { series = candidate; break }
    }
    if (series === undefined) {
      series = { method, status, count: 0, seconds: 0, buckets: new Array<number>(DURATION_BUCKETS.length + 1).fill(0) }
      this.series.push(series)
    }
    series.count++
    series.seconds += seconds
    let bucket = 0
    while (bucket < DURATION_BUCKETS.length && seconds > DURATION_BUCKETS[bucket]!) bucket++
    series.buckets[bucket]!++
  }
}

/**
 * http_requests_total and http_request_duration_seconds, counted in plain
 * numbers and handed to prom-client's registry when it is read. (Its
 * Counter and Histogram validate and hash their labels on every inc and
 * observe: a tenth of /health's time, BENCHMARKS.md. A registry reads a
 * metric through its name and get(), which is what these two give it; the
 * exposition is prom-client's own, test/operations.test.ts reads it.)
 */
export class RequestMetrics {
  private readonly routes = new Map<string, RouteAnswers>()

  /** The answers of a route pattern (the same object for the same pattern: GET and HEAD routes share it). */
  route (pattern: string): RouteAnswers {
    let answers = this.routes.get(pattern)
    if (answers === undefined) {
      answers = new RouteAnswers(pattern)
      this.routes.set(pattern, answers)
    }
    return answers
  }

  private * allSeries (): Generator<{ labels: { method: string, route: string, status_code: string }, series: AnswerSeries }> {
    for (const answers of this.routes.values()) {
      for (const series of answers.series) yield { labels: { method: series.method, route: answers.route, status_code: String(series.status) }, series }
    }
  }

  private reset (): void {
    for (const answers of this.routes.values()) answers.series.length = 0
  }

  register (registry: Registry): void {
    const total = {
      name: 'http_requests_total',
      help: 'HTTP requests answered, by route and status',
      type: 'counter',
      aggregator: 'sum',
      get: async () => ({
        name: total.name,
        help: total.help,
        type: total.type,
        aggregator: total.aggregator,
        values: [...this.allSeries()].map(({ labels, series }) => ({ labels, value: series.count }))
      }),
      reset: () => { this.reset() }
    } as const
    const durations = {
      name: 'http_request_duration_seconds',
      help: 'Time to answer an HTTP request (for an event stream: how long it stayed open)',
      type: 'histogram',
      aggregator: 'sum',
      get: async () => {
        const values: Array<MetricValueWithName<string>> = []
        for (const { labels, series } of this.allSeries()) {
          let below = 0
          series.buckets.forEach((count, bucket) => {
            below += count
            values.push({ metricName: `${durations.name}_bucket`, labels: { le: DURATION_BUCKETS[bucket] ?? '+Inf', ...labels }, value: below })
          })
          values.push({ metricName: `${durations.name}_sum`, labels, value: series.seconds })
          values.push({ metricName: `${durations.name}_count`, labels, value: series.count })
        }
        return { name: durations.name, help: durations.help, type: durations.type, aggregator: durations.aggregator, values }
      },
      reset: () => { this.reset() }
    } as const
    registry.registerMetric(total as unknown as Metric)
    registry.registerMetric(durations as unknown as Metric)
  }
}

/**
 * Counts every request's answer. Each route counts its own (a hook of the
 * route knows its pattern without asking the request); answers no route
 * matched are counted by the application's hook. Registered by app.ts
 * before any plugin, so that every route, /docs and /openapi.json
 * included, gets its hook (Fastify's onRoute sees only the routes added
 * after it).
 */
export const countRequests = fp(async function countRequests (app) {
  const requests = new RequestMetrics()
  app.decorate('requestMetrics', requests)
  const countIn = (answers: RouteAnswers, request: FastifyRequest, reply: FastifyReply) =>
    answers.count(request.method, reply.statusCode, reply.elapsedTime / 1000)
  app.addHook('onRoute', (route) => {
    const answers = requests.route(route.url)
    const count: onResponseHookHandler = (request, reply, done) => {
      countIn(answers, request, reply)
      done()
    }
    route.onResponse = withRouteHook(route.onResponse, count)
  })
  const unmatched = requests.route(UNMATCHED)
  app.addHook('onResponse', (request, reply, done) => {
    if (request.is404) countIn(unmatched, request, reply)
    done()
  })
}, { name: 'request-metrics' })

/**
 * Prometheus metrics: requests and their duration per route and status,
 * the database pool, open event streams, the event poller's lag, and the
 * event log's upkeep (history floor, partitions, drops), plus Node's
 * process metrics. One registry per application instance.
 */
export default fp(async function metricsPlugin (app) {
  const registry = new Registry()
  const registers = [registry]
  collectDefaultMetrics({ register: registry })

  app.requestMetrics.register(registry)
  const { dbPool, events, eventLog } = app
  new Gauge({ // eslint-disable-line no-new
    name: 'db_pool_connections',
    help: 'Connections of the request pool: total open, idle, and requests waiting for one',
    labelNames: ['state'] as const,
    registers,
    collect () {
      this.set({ state: 'total' }, dbPool.totalCount)
      this.set({ state: 'idle' }, dbPool.idleCount)
      this.set({ state: 'waiting' }, dbPool.waitingCount)
    }
  })
  new Gauge({ // eslint-disable-line no-new
    name: 'event_streams_open',
    help: 'Event streams (SSE subscribers) open on this process',
    registers,
    collect () { this.set(events.size) }
  })
  new Gauge({ // eslint-disable-line no-new
    name: 'event_long_polls_waiting',
    help: 'Durable Streams long-polls waiting for events on this process (served from memory)',
    registers,
    collect () { this.set(events.waiting) }
  })
  new Gauge({ // eslint-disable-line no-new
    name: 'event_streams_buffered_bytes',
    help: 'Bytes written to event streams and not yet taken by their clients',
    registers,
    collect () { this.set(events.bufferedBytes) }
  })
  new Gauge({ // eslint-disable-line no-new
    name: 'event_poller_lag_seconds',
    help: 'Seconds since the event poller last read the events table successfully (-1 before its first read)',
    registers,
    collect () { this.set(events.lastPollAt === 0 ? -1 : (Date.now() - events.lastPollAt) / 1000) }
  })
  new Gauge({ // eslint-disable-line no-new
    name: 'event_settle_wait_seconds',
    help: 'Seconds event delivery has waited for an event id still in flight to settle (0 when not waiting)',
    registers,
    collect () { this.set(events.settleWaitSeconds) }
  })
  new Gauge({ // eslint-disable-line no-new
    name: 'event_settle_prepared_writers',
    help: 'Prepared transactions (PREPARE TRANSACTION) that drew an event id or used the events sequence and are still open: each holds delivery past its ids until COMMIT PREPARED or ROLLBACK PREPARED',
    registers,
    collect () { this.set(events.state?.preparedWriters ?? 0) }
  })
  new Gauge({ // eslint-disable-line no-new
    name: 'event_settled_age_seconds',
    help: 'Seconds since the event log\'s keeper last published the settled position (-1 before it first did); growing past a few EVENTS_CLOCK_INTERVAL_MS means no replica keeps the log',
    registers,
    collect () { this.set(events.state?.settledAge ?? -1) }
  })
  new Gauge({ // eslint-disable-line no-new
    name: 'event_log_epoch',
    help: 'The event log\'s epoch: it moves on when event ids may have been handed out again (a failover to a standby that lost commits, a sequence moved back)',
    registers,
    collect () { this.set(events.state?.epoch ?? 0) }
  })
  new Gauge({ // eslint-disable-line no-new
    name: 'event_poller_head',
    help: 'The settled position the poller has handed to streams: every event at or below it is delivered or never commits',
    registers,
    collect () { this.set(events.head ?? 0) }
  })

  new Gauge({ // eslint-disable-line no-new
    name: 'event_window_bytes',
    help: 'Bytes of recent events held in memory for the catch-up of resuming streams (EVENTS_WINDOW_BYTES at most)',
    registers,
    collect () { this.set(events.window?.bytes ?? 0) }
  })
  new Gauge({ // eslint-disable-line no-new
    name: 'event_window_events',
    help: 'Recent events held in memory for the catch-up of resuming streams',
    registers,
    collect () { this.set(events.window?.size ?? 0) }
  })
  new Counter({ // eslint-disable-line no-new
    name: 'event_catch_up_reads_total',
    help: 'Catch-up reads of resuming streams (a page each), by where they were served from: memory (the window of recent events) or the database',
    labelNames: ['source'],
    registers,
    collect () {
      this.reset()
      this.inc({ source: 'memory' }, events.catchUps.memory)
      this.inc({ source: 'database' }, events.catchUps.database)
    }
  })

  // The wake-up (EVENTS_WAKEUP): absent when the poller only polls.
  const { eventWakeup } = app
  if (eventWakeup !== undefined) {
    new Gauge({ // eslint-disable-line no-new
      name: 'event_wakeup_live',
      help: '1 while the event wake-up streams WAL (new events delivered as they commit), 0 while the poller relies on polling alone',
      registers,
      collect () { this.set(Number(eventWakeup.live)) }
    })
    new Counter({ // eslint-disable-line no-new
      name: 'event_wakeup_lost_total',
      help: 'Times the event wake-up lost its WAL stream (connection dropped, database restarted) and the poller fell back to polling until it reconnected',
      registers,
      collect () { this.reset(); this.inc(eventWakeup.lost) }
    })
    new Counter({ // eslint-disable-line no-new
      name: 'event_wakeup_wal_messages_total',
      help: 'WAL messages the event wake-up received, each a wake-up of the poller (coalesced: at most one poll per few ms)',
      registers,
      collect () { this.reset(); this.inc(eventWakeup.wakes) }
    })
  }

  // The event log's upkeep: who keeps it, and the history it bounds (EVENTS_RETENTION).
  if (eventLog !== undefined) {
    new Gauge({ // eslint-disable-line no-new
      name: 'event_log_keeper',
      help: '1 on the replica that keeps the event log (its settled position, partitions, retention), else 0',
      registers,
      collect () { this.set(Number(eventLog.leading)) }
    })
    new Gauge({ // eslint-disable-line no-new
      name: 'event_history_floor',
      help: 'The history\'s floor: the highest event id removed by EVENTS_RETENTION (0: none); a cursor below it answers 410 cursor_expired (-1 before it is read)',
      registers,
      collect () { this.set(eventLog.historyFloor) }
    })
    new Gauge({ // eslint-disable-line no-new
      name: 'event_log_partitions',
      help: 'Partitions of the events table, the default one included, at the keeper\'s last pass (0 on other replicas)',
      registers,
      collect () { this.set(eventLog.leading ? eventLog.keeper.partitions : 0) }
    })
    new Counter({ // eslint-disable-line no-new
      name: 'event_log_partitions_dropped_total',
      help: 'Partitions of the events table this replica dropped because every event in them was older than EVENTS_RETENTION',
      registers,
      collect () { this.reset(); this.inc(eventLog.keeper.dropped) }
    })
    new Counter({ // eslint-disable-line no-new
      name: 'event_log_default_rows_deleted_total',
      help: 'Expired events this replica deleted from the default partition (ids past every range, written while the keeper was behind)',
      registers,
      collect () { this.reset(); this.inc(eventLog.keeper.deletedRows) }
    })
  }

  app.decorate('metrics', registry)
}, { name: 'metrics', dependencies: ['request-metrics', 'db', 'events', 'event-log'] })
