/*
 * The Durable Streams reference server (@durable-streams/server, pinned in
 * package.json), in memory, for bench/crowd-reference.ts: PORT, and
 * LONG_POLL_MS for its long-poll timeout.
 */
import { DurableStreamTestServer } from '@durable-streams/server'

const server = new DurableStreamTestServer({ port: Number(process.env.PORT), host: '127.0.0.1', longPollTimeout: Number(process.env.LONG_POLL_MS ?? 20_000) })
await server.start()
process.on('SIGTERM', () => { void server.stop().finally(() => process.exit(0)) })
