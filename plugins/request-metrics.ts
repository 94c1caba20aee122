import type { FastifyReply, FastifyRequest, onResponseHookHandler } from 'fastify'
import fp from 'fastify-plugin'
import type { Metric, MetricValueWithName, Registry } from 'prom-client'
import { UNMATCHED } from './app/request-log.ts'
import { withRouteHook } from './route-hooks.ts'

declare module 'fastify' {
  interface FastifyInstance {
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
  readonly route: string

  constructor (route: string) {
    this.route = route
  }

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
 * observe, a visible share of a cheap request's time. A registry reads a
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
