/*
 * The event log: its public entry. Routes and plugins import from here
 * only; the rest of this folder is its inside (README.md says which file
 * does what).
 */
import type { FastifyBaseLogger } from 'fastify'
import type { Db } from '../db/schema.ts'
import { DurableStreams } from './durable/index.ts'
import { EventHub } from './hub.ts'
import type { Limit } from './limits.ts'
import { EventReader } from './reader.ts'
import { EventStreams } from './sse/streams.ts'
import { SOON_TICK_MS, EventLogKeeper } from './keeper/keeper.ts'
import { WalWakeup } from './wakeup.ts'

export { DURABLE_READ_HEADERS, readOf, type DurableAnswer, type DurableQuery } from './durable/index.ts'
export { listEvents, type EventFilter, type LogState, type StoredEvent } from './statements.ts'
export { assertPositionKept } from './reader.ts'
export { eventsSent } from './sent.ts'
export type { StreamOptions, StreamStart } from './sse/streams.ts'

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
  /** DURABLE_STREAMS_MAX_LONG_POLLS and DURABLE_STREAMS_MAX_LONG_POLLS_PER_CALLER. */
  longPolls: Limit
  /** DURABLE_STREAMS_LONG_POLL_MS and DURABLE_STREAMS_SSE_MAX_MS. */
  longPollMs: number
  sseMaxMs: number
  /** What wakes the hub between polls (EVENTS_WAKEUP: auto, wal), on this database; undefined: polling alone. */
  wakeup: { mode: 'auto' | 'wal', url: string, connectTimeoutMs: number } | undefined
  /** Where the keeper runs (a database it may write: the primary), how often it ticks, how long events are kept; undefined: no keeper here. */
  keeper: { url: string, keeperIntervalMs: number, retentionMs: number | undefined } | undefined
  logger: FastifyBaseLogger
}

/**
 * The event log of one process: one hub polling the events table for
 * everything that reads it (hub.ts), the reads after an event id (reader.ts),
 * the streams (sse/), the Durable Streams protocol's reads (durable/),
 * what wakes the hub when something commits (wakeup.ts), and, where this
 * process may write, the keeper that settles the order and bounds the
 * history (keeper/).
 */
export class EventLog {
  readonly hub: EventHub
  readonly reader: EventReader
  readonly streams: EventStreams
  readonly durable: DurableStreams
  readonly wakeup: WalWakeup | undefined
  readonly keeper: EventLogKeeper | undefined

  constructor (db: Db, options: EventLogOptions) {
    const { logger } = options
    const hub = this.hub = new EventHub(db, {
      pollIntervalMs: options.pollIntervalMs,
      wakeupPollIntervalMs: options.wakeupPollIntervalMs,
      windowBytes: options.windowBytes,
      log: logger.child({ component: 'event-hub' })
    })
    this.reader = new EventReader(db, hub)
    this.streams = new EventStreams(db, hub, this.reader, { ...options, log: logger.child({ component: 'event-hub' }) })
    this.durable = new DurableStreams(db, hub, this.reader, { longPolls: options.longPolls, longPollMs: options.longPollMs, sseMaxMs: options.sseMaxMs })
    hub.onTicked = (now, tail) => { this.streams.sweep(now, tail) }
    this.wakeup = options.wakeup === undefined
      ? undefined
      : new WalWakeup({
        ...options.wakeup,
        log: logger.child({ component: 'event-wakeup' }),
        onWake: () => { hub.wake() },
        onLive: (live) => {
          hub.wakeupLive = live
          // Lost: poll now, and at the faster interval from then on.
          if (!live) hub.wake()
        }
      })
    const keeper = this.keeper = options.keeper === undefined
      ? undefined
      : new EventLogKeeper({ ...options.keeper, log: logger.child({ component: 'event-log' }) })
    if (keeper !== undefined) {
      // A poll that ends waiting on a hole for a while asks for a tick; one that does not wait, calms the asking.
      hub.onWaiting = (waitedMs) => {
        if (waitedMs === undefined) keeper.calm()
        else if (waitedMs >= SOON_TICK_MS) keeper.soon()
      }
      // What a tick settled reaches this replica's streams without waiting for the wake-up (or, without one, a poll).
      keeper.onPublished = () => { hub.wake() }
      // What retention dropped is no longer served from this replica's memory, from the moment it went (other replicas: at their next poll).
      keeper.partitions.onFloorRaised = (floor) => { hub.raiseFloor(floor) }
    }
  }

  /** The settled position, read once (see EventHub.ready): every read reports at least it. */
  ready (): Promise<number> {
    return this.hub.ready()
  }

  start (): void {
    this.hub.start()
    this.wakeup?.start()
    this.keeper?.start()
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

  /** Stops the keeper (another replica takes it over). */
  async stopKeeper (): Promise<void> {
    await this.keeper?.stop()
  }
}
