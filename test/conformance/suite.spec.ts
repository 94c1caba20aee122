import { runConformanceTests } from '@durable-streams/server-conformance-tests'

// The official Durable Streams conformance suite, run by vitest against the
// adapter of test/conformance/adapter.ts (test/conformance.test.ts starts
// both and reads the results).
runConformanceTests({ baseUrl: process.env.CONFORMANCE_URL!, longPollTimeoutMs: Number(process.env.CONFORMANCE_LONG_POLL_MS ?? 3000) })
