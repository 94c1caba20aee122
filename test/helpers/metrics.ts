/*
 * Reading the service's /metrics text (Prometheus exposition), for the
 * tests and the benchmarks; nothing here imports tap.
 */

/** The value of an unlabelled metric (`name value` on a line of its own); NaN when absent. */
export function metricValue (text: string, name: string): number {
  return Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(text)?.[1])
}

/** Requests answered on `route` (a route pattern, as the metrics label it), over every method and status. */
export function requestsOnRoute (text: string, route: string): number {
  let total = 0
  for (const line of text.split('\n')) {
    if (line.startsWith('http_requests_total{') && line.includes(`route="${route}"`)) total += Number(line.split(' ').pop())
  }
  return total
}
