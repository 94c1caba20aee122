/*
 * OpenTelemetry tracing, configured by the standard OTEL_* variables alone
 * (https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/).
 * Off unless they ask for traces: then, and only then, the SDK is loaded.
 * On, each request gets a server span continuing an incoming traceparent,
 * named by its route (instrumentation-http, told the route by @fastify/otel),
 * with the handler's span under it (for an event stream: its setup), a span
 * per database statement (instrumentation-pg), and the trace id in the log
 * lines written meanwhile (instrumentation-pino). package.json lists
 * @opentelemetry/api, which nothing here imports: it is the peer dependency
 * of every package above, the one copy of the API they must share.
 */
import type { FastifyPluginCallback } from 'fastify'
import { pathOf } from './plugins/app/auth/url-credentials.ts'

type Env = Record<string, string | undefined>

/** Whether the OTEL_* variables ask for traces: an exporter or an OTLP endpoint named, the SDK not disabled. */
export function tracingRequested (env: Env = process.env): boolean {
  if (env.OTEL_SDK_DISABLED?.trim().toLowerCase() === 'true') return false
  const exporters = env.OTEL_TRACES_EXPORTER?.split(',').map((name) => name.trim()).filter((name) => name !== '') ?? []
  if (exporters.length > 0) return !exporters.includes('none')
  return Boolean(env.OTEL_EXPORTER_OTLP_ENDPOINT?.trim() || env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT?.trim())
}

export interface Tracing {
  /** The Fastify plugin that names each request's span by its route (register it before the routes). */
  plugin: FastifyPluginCallback
  /** Ends and exports the spans still open. */
  shutdown: () => Promise<void>
}

/**
 * Starts tracing when the OTEL_* variables ask for it. Call it before the
 * modules it instruments (pg, pino, node:http) are imported: the server
 * imports the application only after it.
 */
export async function startTracing (env: Env = process.env): Promise<Tracing | undefined> {
  if (!tracingRequested(env)) return undefined
  // ES modules are instrumented through a loader hook, registered before they load.
  const { register } = await import('node:module')
  const { createAddHookMessageChannel } = await import('import-in-the-middle')
  const { registerOptions, waitForAllMessagesAcknowledged } = createAddHookMessageChannel()
  register('import-in-the-middle/hook.mjs', import.meta.url, registerOptions)

  const [{ NodeSDK }, { HttpInstrumentation }, { PgInstrumentation }, { PinoInstrumentation }, { FastifyOtelInstrumentation }] = await Promise.all([
    import('@opentelemetry/sdk-node'),
    import('@opentelemetry/instrumentation-http'),
    import('@opentelemetry/instrumentation-pg'),
    import('@opentelemetry/instrumentation-pino'),
    import('@fastify/otel')
  ])
  // Spans for the request and its handler; the lifecycle hooks' spans would only add noise.
  // A stream's URL may carry a credential (stream_token) in any spelling:
  // spans carry the path alone, never the query.
  const fastify = new FastifyOtelInstrumentation({
    instrumentHooks: false,
    requestHook: (span, request) => { span.setAttribute('url.path', pathOf(request.url)) }
  })
  const sdk = new NodeSDK({
    instrumentations: [
      // An attribute left undefined is not set: the span has no url.query.
      new HttpInstrumentation({ startIncomingSpanHook: () => ({ 'url.query': undefined }) }),
      fastify,
      // Statements of requests only: the background polls and keeper would
      // each start a trace; no span for taking a connection from the pool.
      new PgInstrumentation({ requireParentSpan: true, ignoreConnectSpans: true }),
      // The log lines go to stdout as before; only the trace id is added to them.
      new PinoInstrumentation({ disableLogSending: true })
    ]
  })
  sdk.start()
  await waitForAllMessagesAcknowledged()
  return { plugin: fastify.plugin(), shutdown: () => sdk.shutdown() }
}
