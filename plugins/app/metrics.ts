import fp from 'fastify-plugin'
import { collectDefaultMetrics, Counter, Gauge, Registry } from 'prom-client'
import { readCounts } from '../../db/statement.ts'

declare module 'fastify' {
  interface FastifyInstance {
    /** This application's Prometheus registry (served at /metrics). */
    metrics: Registry
  }
}

/**
 * Prometheus metrics: requests and their duration per route and status,
 * the database pool, open event streams, the event poller's lag, and the
 * event log's keeper (history floor, partitions, drops), plus Node's
 * process metrics. One registry per application instance.
 */
export default fp(async function metricsPlugin (app) {
  const registry = new Registry()
  const registers = [registry]
  collectDefaultMetrics({ register: registry })

  app.requestMetrics.register(registry)
  const { dbPool } = app
  const { hub, streams, durable, reader, wakeup: eventWakeup, keeper } = app.events
  /* eslint-disable no-new -- each metric is made only to register itself in `registers` */
  new Gauge({
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
  new Gauge({
    name: 'db_pipelined_connections',
    help: 'Connections carrying the API\'s reads several at a time (DB_PIPELINED_CONNECTIONS): open, and statements in flight on them',
    labelNames: ['state'] as const,
    registers,
    collect () {
      this.set({ state: 'open' }, dbPool.pipeline?.openCount ?? 0)
      this.set({ state: 'in_flight' }, dbPool.pipeline?.inFlightCount ?? 0)
    }
  })
  new Counter({
    name: 'db_reads_total',
    help: 'Reads of the API run as a database statement: those that ran their own, and those that shared the statement of an identical read arriving with them',
    labelNames: ['statement'],
    registers,
    collect () {
      const counts = readCounts(dbPool)
      this.reset()
      this.inc({ statement: 'own' }, counts.reads - counts.shared)
      this.inc({ statement: 'shared' }, counts.shared)
    }
  })
  new Gauge({
    name: 'event_streams_open',
    help: 'Event streams (SSE subscribers) open on this process',
    registers,
    collect () { this.set(streams.size) }
  })
  new Gauge({
    name: 'event_long_polls_waiting',
    help: 'Durable Streams long-polls waiting for events on this process (served from memory)',
    registers,
    collect () { this.set(durable.waiting) }
  })
  new Counter({
    name: 'event_limit_refusals_total',
    help: 'Event streams (SSE, either route) and Durable Streams long-polls refused at a limit, by kind (stream, long_poll) and reason: instance ' +
      '(SSE_MAX_STREAMS, DURABLE_STREAMS_MAX_LONG_POLLS) or caller (its share: SSE_MAX_STREAMS_PER_CALLER, DURABLE_STREAMS_MAX_LONG_POLLS_PER_CALLER)',
    labelNames: ['kind', 'reason'] as const,
    registers,
    collect () {
      this.reset()
      for (const [kind, refused] of [['stream', streams.refused], ['long_poll', durable.refused]] as const) {
        this.inc({ kind, reason: 'instance' }, refused.instance)
        this.inc({ kind, reason: 'caller' }, refused.caller)
      }
    }
  })
  new Gauge({
    name: 'event_streams_buffered_bytes',
    help: 'Bytes written to event streams and not yet taken by their clients',
    registers,
    collect () { this.set(streams.bufferedBytes) }
  })
  new Gauge({
    name: 'event_poller_lag_seconds',
    help: 'Seconds since the event poller last read the events table successfully (-1 before its first read)',
    registers,
    collect () { this.set(hub.lastPollAt === 0 ? -1 : (Date.now() - hub.lastPollAt) / 1000) }
  })
  new Gauge({
    name: 'event_settle_wait_seconds',
    help: 'Seconds event delivery has waited for an event id still in flight to settle (0 when not waiting)',
    registers,
    collect () { this.set(hub.settleWaitSeconds) }
  })
  new Gauge({
    name: 'event_settle_prepared_writers',
    help: 'Prepared transactions (PREPARE TRANSACTION) that drew an event id or used the events sequence and are still open: each holds delivery ' +
      'past its ids until COMMIT PREPARED or ROLLBACK PREPARED',
    registers,
    collect () { this.set(hub.state?.preparedWriters ?? 0) }
  })
  new Gauge({
    name: 'event_settled_age_seconds',
    help: 'Seconds since the event log\'s keeper last published the settled position (-1 before it first did); growing past a few ' +
      'EVENTS_KEEPER_INTERVAL_MS means no replica keeps the log',
    registers,
    collect () { this.set(hub.state?.settledAge ?? -1) }
  })
  new Gauge({
    name: 'event_log_epoch',
    help: 'The event log\'s epoch: it moves on when event ids may have been handed out again (a failover to a standby that lost commits, a ' +
      'sequence moved back)',
    registers,
    collect () { this.set(hub.state?.epoch ?? 0) }
  })
  new Gauge({
    name: 'event_poller_head',
    help: 'The settled position the poller has handed to streams: every event at or below it is delivered or never commits',
    registers,
    collect () { this.set(hub.tail ?? 0) }
  })

  new Gauge({
    name: 'event_window_bytes',
    help: 'Bytes of recent events held in memory for the catch-up of resuming streams (EVENTS_WINDOW_BYTES at most)',
    registers,
    collect () { this.set(hub.window?.bytes ?? 0) }
  })
  new Gauge({
    name: 'event_window_events',
    help: 'Recent events held in memory for the catch-up of resuming streams',
    registers,
    collect () { this.set(hub.window?.size ?? 0) }
  })
  new Counter({
    name: 'event_catch_up_reads_total',
    help: 'Catch-up reads of resuming streams (a page each), by where they were served from: memory (the window of recent events) or the database',
    labelNames: ['source'],
    registers,
    collect () {
      this.reset()
      this.inc({ source: 'memory' }, reader.catchUps.memory)
      this.inc({ source: 'database' }, reader.catchUps.database)
    }
  })

  // The wake-up (EVENTS_WAKEUP): absent when the poller only polls.
  if (eventWakeup !== undefined) {
    new Gauge({
      name: 'event_wakeup_live',
      help: '1 while the event wake-up streams WAL (new events delivered as they commit), 0 while the poller relies on polling alone',
      registers,
      collect () { this.set(Number(eventWakeup.live)) }
    })
    new Counter({
      name: 'event_wakeup_lost_total',
      help: 'Times the event wake-up lost its WAL stream (connection dropped, database restarted) and the poller fell back to polling until it reconnected',
      registers,
      collect () { this.reset(); this.inc(eventWakeup.lost) }
    })
    new Counter({
      name: 'event_wakeup_wal_messages_total',
      help: 'WAL messages the event wake-up received, each a wake-up of the poller (coalesced: at most one poll per few ms)',
      registers,
      collect () { this.reset(); this.inc(eventWakeup.wakes) }
    })
  }

  // The event log's keeper: who keeps it, and the history it bounds (EVENTS_RETENTION).
  if (keeper !== undefined) {
    new Gauge({
      name: 'event_log_keeper',
      help: '1 on the replica that keeps the event log (its settled position, partitions, retention), else 0',
      registers,
      collect () { this.set(Number(keeper.leading)) }
    })
    new Counter({
      name: 'event_log_keeper_lock_timeouts_total',
      help: 'Ticks of the event log\'s keeper (and asks for its lease) that waited on a lock for a quarter of the lease and gave up: a session ' +
        'holding event_log_state (the warning names it) holds delivery past a hole back',
      registers,
      collect () { this.reset(); this.inc(keeper.lockTimeouts) }
    })
    new Gauge({
      name: 'event_history_floor',
      help: 'The history\'s floor: the highest event id removed by EVENTS_RETENTION (0: none); a cursor below it answers 410 cursor_expired (-1 ' +
        'before it is read)',
      registers,
      collect () { this.set(keeper.historyFloor) }
    })
    new Gauge({
      name: 'event_log_partitions',
      help: 'Partitions of the events table, the default one included, at the keeper\'s last pass (0 on other replicas)',
      registers,
      collect () { this.set(keeper.leading ? keeper.partitions.partitions : 0) }
    })
    new Counter({
      name: 'event_log_partitions_dropped_total',
      help: 'Partitions of the events table this replica dropped because every event in them was older than EVENTS_RETENTION',
      registers,
      collect () { this.reset(); this.inc(keeper.partitions.dropped) }
    })
    new Counter({
      name: 'event_log_default_rows_deleted_total',
      help: 'Expired events this replica deleted from the default partition (ids past every range, written while the keeper was behind)',
      registers,
      collect () { this.reset(); this.inc(keeper.partitions.deletedRows) }
    })
  }

  /* eslint-enable no-new */

  app.decorate('metrics', registry)
}, { name: 'metrics', dependencies: ['request-metrics', 'db', 'events'] })
