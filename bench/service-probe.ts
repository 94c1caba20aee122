/*
 * Preloaded into the service by bench/stream.ts and bench/durable-streams.ts
 * (`--import bench/service-probe.ts`, with an IPC channel): what the bench
 * reads from inside the server process, without changing the service.
 *
 * - The garbage collector's pauses, from perf_hooks 'gc' entries: how many
 *   and the longest since the last 'reset', by kind (minor: scavenges of
 *   the young generation; major: mark-compact; incremental: its steps;
 *   weakcb: weak callbacks), and when each major one began.
 * - The event loop's longest delay since the last 'reset'
 *   (monitorEventLoopDelay, 10 ms resolution): what a pause, or anything
 *   else, held every stream's delivery back by.
 * - process.memoryUsage() and V8's heap spaces, without a collection.
 * - On 'gc' only, full collections (V8's gc, exposed at run time here: the
 *   service runs without --expose-gc), for figures labelled as forced.
 *
 * - On 'snapshot' only, a heap snapshot written to `path` (bench/heap-breakdown.ts).
 * - With PROBE_ALLOC_PROFILE=DIR in the environment, what was allocated
 *   from each 'reset' to the next 'report' (V8's sampling heap profiler,
 *   collected objects included), written to DIR as a .heapprofile (Chrome
 *   DevTools opens it): where a window's garbage comes from.
 *
 * Messages: { probe: 'reset' | 'report' | 'gc' | 'snapshot', path? }, each
 * answered with { probe, ... }. The channel does not keep the process alive.
 */
import { writeFileSync } from 'node:fs'
import { Session } from 'node:inspector'
import { constants, monitorEventLoopDelay, PerformanceObserver, type PerformanceEntry } from 'node:perf_hooks'
import { getHeapSpaceStatistics, setFlagsFromString, writeHeapSnapshot } from 'node:v8'
import { runInNewContext } from 'node:vm'

const allocDir = process.env.PROBE_ALLOC_PROFILE
const session = allocDir === undefined ? undefined : new Session()
session?.connect()
const post = <T = unknown>(method: string, params?: object) => new Promise<T>((resolve, reject) => session!.post(method, params, (err, result) => err ? reject(err) : resolve(result as T)))

const KINDS: Record<number, string> = {
  [constants.NODE_PERFORMANCE_GC_MINOR]: 'minor',
  [constants.NODE_PERFORMANCE_GC_MAJOR]: 'major',
  [constants.NODE_PERFORMANCE_GC_INCREMENTAL]: 'incremental',
  [constants.NODE_PERFORMANCE_GC_WEAKCB]: 'weakcb'
}

interface Pauses { count: number, totalMs: number, longestMs: number, longestKind: string, byKind: Record<string, { count: number, totalMs: number, longestMs: number }>, majorsAt: Array<{ atMs: number, ms: number }> }

const fresh = (): Pauses => ({ count: 0, totalMs: 0, longestMs: 0, longestKind: '', byKind: {}, majorsAt: [] })
let pauses = fresh()
/** When the last 'reset' came (performance.now()): majors are placed in the window from it. */
let resetAt = performance.now()

new PerformanceObserver((list) => {
  for (const entry of list.getEntries() as Array<PerformanceEntry & { detail?: { kind?: number } }>) {
    const kind = KINDS[entry.detail?.kind ?? -1] ?? 'other'
    const of = pauses.byKind[kind] ??= { count: 0, totalMs: 0, longestMs: 0 }
    pauses.count++
    pauses.totalMs += entry.duration
    of.count++
    of.totalMs += entry.duration
    of.longestMs = Math.max(of.longestMs, entry.duration)
    if (kind === 'major') pauses.majorsAt.push({ atMs: entry.startTime - resetAt, ms: entry.duration })
    if (entry.duration > pauses.longestMs) {
      pauses.longestMs = entry.duration
      pauses.longestKind = kind
    }
  }
}).observe({ entryTypes: ['gc'] })

const loopDelay = monitorEventLoopDelay({ resolution: 10 })
loopDelay.enable()
let cpuAtReset = process.cpuUsage()

function report () {
  const memory = process.memoryUsage()
  const spaces = Object.fromEntries(getHeapSpaceStatistics().map((space) => [space.space_name, { size: space.space_size, used: space.space_used_size, physical: space.physical_space_size }]))
  const cpu = process.cpuUsage(cpuAtReset)
  return { node: process.version, execArgv: process.execArgv, nodeOptions: process.env.NODE_OPTIONS ?? '', pauses, loopDelayMaxMs: loopDelay.max / 1e6, loopDelayP99Ms: loopDelay.percentile(99) / 1e6, cpuMs: (cpu.user + cpu.system) / 1000, memory, spaces }
}

let gc: (() => void) | undefined
function forcedGc () {
  if (gc === undefined) {
    setFlagsFromString('--expose-gc')
    gc = runInNewContext('gc') as () => void
  }
  for (let round = 0; round < 3; round++) gc()
}

process.on('message', (message: { probe?: string, path?: string }) => {
  switch (message?.probe) {
    case 'reset':
      pauses = fresh()
      resetAt = performance.now()
      loopDelay.reset()
      cpuAtReset = process.cpuUsage()
      if (session !== undefined) void post('HeapProfiler.startSampling', { samplingInterval: 8192, includeObjectsCollectedByMajorGC: true, includeObjectsCollectedByMinorGC: true })
      process.send?.({ probe: 'reset' })
      break
    case 'report':
      if (session !== undefined) void post<{ profile: object }>('HeapProfiler.stopSampling').then(({ profile }) => writeFileSync(`${allocDir}/alloc-${Date.now()}.heapprofile`, JSON.stringify(profile))).catch(() => {})
      process.send?.({ probe: 'report', ...report() })
      break
    case 'gc':
      forcedGc()
      process.send?.({ probe: 'gc' })
      break
    case 'snapshot':
      process.send?.({ probe: 'snapshot', path: writeHeapSnapshot(message.path) })
      break
  }
})
process.channel?.unref()
