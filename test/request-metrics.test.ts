import { Registry } from 'prom-client'
import t from 'tap'
import { RequestMetrics } from '../plugins/request-metrics.ts'
import { withRouteHook } from '../plugins/route-hooks.ts'

// Requests counted in plain numbers, read through prom-client's registry (plugins/app/metrics.ts).

t.test('counts, sums and cumulative buckets per method, route and status, in prom-client\'s exposition', async (t) => {
  const registry = new Registry()
  const metrics = new RequestMetrics()
  metrics.register(registry)
  const runs = metrics.route('/api/runs')
  t.equal(metrics.route('/api/runs'), runs, 'one object per pattern')
  runs.count('GET', 200, 0.0004)
  runs.count('GET', 200, 0.003)
  runs.count('HEAD', 200, 0.001) // on the bound: counted in it
  runs.count('GET', 503, 42) // past the last bound: +Inf only
  const text = await registry.metrics()
  t.match(text, '# HELP http_requests_total HTTP requests answered, by route and status\n# TYPE http_requests_total counter')
  t.match(text, '# TYPE http_request_duration_seconds histogram')
  t.match(text, 'http_requests_total{method="GET",route="/api/runs",status_code="200"} 2\n')
  t.match(text, 'http_requests_total{method="HEAD",route="/api/runs",status_code="200"} 1\n')
  t.match(text, 'http_requests_total{method="GET",route="/api/runs",status_code="503"} 1\n')
  const bucket = (le: string, method: string, status: number) =>
    Number(new RegExp(`^http_request_duration_seconds_bucket\\{le="${le.replace('+', '\\+')}",method="${method}",route="/api/runs",status_code="${status}"\\} (\\d+)$`, 'm').exec(text)?.[1])
  t.same(['0.001', '0.0025', '0.005', '10', '+Inf'].map((le) => bucket(le, 'GET', 200)), [1, 1, 2, 2, 2])
  t.equal(bucket('0.001', 'HEAD', 200), 1)
  t.same(['10', '+Inf'].map((le) => bucket(le, 'GET', 503)), [0, 1])
  t.match(text, /^http_request_duration_seconds_sum\{method="GET",route="\/api\/runs",status_code="200"\} 0\.0034\d*$/m)
  t.match(text, 'http_request_duration_seconds_count{method="GET",route="/api/runs",status_code="503"} 1\n')

  const json = await registry.getMetricsAsJSON()
  t.same(json.map((metric) => [metric.name, metric.type, metric.values.length]), [
    ['http_requests_total', 'counter', 3],
    ['http_request_duration_seconds', 'histogram', 3 * 16]
  ])

  registry.resetMetrics()
  t.notMatch(await registry.metrics(), /route=/, 'reset: no series left')
  runs.count('GET', 200, 0.01)
  t.match(await registry.metrics(), 'http_requests_total{method="GET",route="/api/runs",status_code="200"} 1\n', 'counting again after a reset')
})

t.test('a route\'s hooks with one more: none declared, one, a list', async (t) => {
  const hook = () => {}
  const other = () => {}
  t.same(withRouteHook(undefined, hook), [hook])
  t.same(withRouteHook(other, hook), [other, hook])
  t.same(withRouteHook([other, other], hook), [other, other, hook])
})
