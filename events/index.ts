/*
 * The event log: its public entry. Routes and plugins import from here
 * only; the rest of this folder is its inside (README.md says which file
 * does what).
 */
import type { FastifyBaseLogger } from 'fastify'
import type { Db } from '../db/schema.js'
import { DurableReads } from './durable/reads.js'
import { EventHub } from './hub.js'
import type { Limit } from './limits.js'
import { EventReader } from './reader.js'
import { EventStreams } from './sse/streams.js'
import { SOON_TICK_MS, EventLogUpkeep } from './upkeep/keeper.js'
import { WalWakeup } from './wakeup.js'

export { durableSseFormat } from './durable/format.js'
export { encodeOffset, nextStreamCursor, parseOffset, parseStreamCursor, type StreamOffset } from './durable/offsets.js'
export type { StreamPage } from './durable/reads.js'
export { listEvents, streamSubjectExists, type EventFilter, type LogState, type StoredEvent } from './log.js'
export { assertEventCursorKept } from './reader.js'
export { countSent, eventsSent } from './sent.js'
export type { StreamStart } from './sse/streams.js'

/** How long a shutdown waits for ended streams' last bytes to leave: a client taking none is cut after it. */
const STREAMS_FLUSH_MS = 1000

export interface EventLogOptions {
  /** How often the hub polls (EVENTS_POLL_INTERVAL_MS), and while the wake-up is live (EVENTS_WAKEUP_POLL_INTERVAL_MS). */
  pollIntervalMs: number
  wakeupPollIntervalMs: number
  /** EVENTS_WINDOW_BYTES. */
  windowBytes: number
  /** SSE_KEEPALIVE_MS, SSE_MAX_STREAMS, SSE_MAX_STREAMS_PER_CALLER, SSE_RETRY_MS, SSE_MAX_BUFFERED_BYTES, SSE_SLOW_CLIENT_TIMEOUT_MS. */
  keepAliveMs: number
  maxStreams: number
  maxStreamsPerCaller: number
  retryMs: number
  maxBufferedBytes: number
  slowClientMs: number
  /** STREAMS_MAX_LONG_POLLS and STREAMS_MAX_LONG_POLLS_PER_CALLER. */
  longPolls: Limit
  /** What wakes the hub between polls (EVENTS_WAKEUP: auto, wal), on this database; undefined: polling alone. */
  wakeup: { mode: 'auto' | 'wal', url: string, connectTimeoutMs: number } | undefined
  /** Where the upkeep runs (a database it may write: the primary), how often it ticks, how long events are kept; undefined: no upkeep here. */
  upkeep: { url: string, clockIntervalMs: number, retentionMs: number | undefined } | undefined
  log: FastifyBaseLogger
}

/**
 * The event log of one process: one hub polling the events table for
 * everything that reads it (hub.ts), the reads after a cursor (reader.ts),
 * the streams (sse/), the Durable Streams pages and long-polls (durable/),
 * what wakes the hub when something commits (wakeup.ts), and, where this
 * process may write, the upkeep that settles the order and bounds the
 * history (upkeep/).
 */
export class EventLog {
  readonly hub: EventHub
  readonly reader: EventReader
  readonly streams: EventStreams
  readonly durable: DurableReads
  readonly wakeup: WalWakeup | undefined
  readonly upkeep: EventLogUpkeep | undefined

  constructor (db: Db, options: EventLogOptions) {
    const { log } = options
    const hub = this.hub = new EventHub(db, { pollIntervalMs: options.pollIntervalMs, wakeupPollIntervalMs: options.wakeupPollIntervalMs, windowBytes: options.windowBytes, log: log.child({ component: 'event-hub' }) })
    this.reader = new EventReader(db, hub)
    this.streams = new EventStreams(db, hub, this.reader, { ...options, log: log.child({ component: 'event-hub' }) })
    this.durable = new DurableReads(db, hub, this.reader, options.longPolls)
    hub.onTicked = (now, head) => { this.streams.sweep(now, head) }
    this.wakeup = options.wakeup === undefined
      ? undefined
      : new WalWakeup({
        ...options.wakeup,
        log: log.child({ component: 'event-wakeup' }),
        onWake: () => { hub.wake() },
        onLive: (live) => {
          hub.wakeupLive = live
          // Lost: poll now, and at the faster interval from then on.
          if (!live) hub.wake()
        }
      })
    const upkeep = this.upkeep = options.upkeep === undefined
      ? undefined
      : new EventLogUpkeep({ ...options.upkeep, log: log.child({ component: 'event-log' }) })
    if (upkeep !== undefined) {
      // A poll that ends waiting on a hole for a while asks for a tick; one that does not wait, calms the asking.
      hub.onWaiting = (waitedMs) => {
        if (waitedMs === undefined) upkeep.calm()
        else if (waitedMs >= SOON_TICK_MS) upkeep.soon()
      }
      // What a tick settled reaches this replica's streams without waiting for the wake-up (or, without one, a poll).
      upkeep.onPublished = () => { hub.wake() }
      // What retention dropped is no longer served from this replica's memory, from the moment it went (other replicas: at their next poll).
      upkeep.keeper.onFloorRaised = (floor) => { hub.raiseFloor(floor) }
    }
  }

  /** The settled position, read once (see EventHub.ready): every read reports at least it. */
  ready (): Promise<number> {
    return this.hub.ready()
  }

  start (): void {
    this.hub.start()
    this.wakeup?.start()
    this.upkeep?.start()
  }

  /**
   * Stops the wake-up, then polling, and ends every stream and long-poll
   * (their clients reconnect, elsewhere); resolves once the streams' last
   * bytes have left, or after STREAMS_FLUSH_MS. Ended last, with nothing awaited
   * after but the flush: the server stops listening right after this
   * (Fastify's preClose), before a reconnect can reach it, and closes the
   * connections it finds idle, which would cut a stream's unsent end.
   */
  async stopReading (): Promise<void> {
    await this.wakeup?.stop()
    this.hub.stop()
    await this.streams.flushed(STREAMS_FLUSH_MS)
  }

  /** Stops the upkeep (another replica takes it over). */
  async stopUpkeep (): Promise<void> {
    await this.upkeep?.stop()
  }
}
