/*
 * The bench's side of bench/service-probe.ts, shared by bench/stream.ts and
 * bench/durable-streams.ts: how the service is started (through tsx, or
 * compiled as `npm start` runs it), its resident memory as a container sees
 * it (no forced collection), and the probe's answers.
 */
import type { ChildProcess } from 'node:child_process'
import { existsSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import { root, sleep } from './common.ts'

export const PROBE = join(root, 'bench/service-probe.ts')

/**
 * The node flags `npm start` gives the service (package.json's start
 * script, `node <flags> dist/server.js`; the Dockerfile's CMD has the same):
 * what the benches start the service with unless --service-flags says
 * otherwise (`--service-flags=` for none, Node's defaults).
 */
export function startFlags (): string {
  const start = (JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { scripts: Record<string, string> }).scripts.start ?? ''
  return /^node\s+(.*?)\s*dist\/server\.js/.exec(start)?.[1] ?? ''
}

/**
 * The node arguments that start the service with the probe preloaded:
 * `entry` tsx (server.ts through tsx, the default) or dist (dist/server.js,
 * what `npm start` and the image run; npm run build first). `flags` are
 * node or V8 flags for the service only (--service-flags; when not given,
 * npm start's: startFlags).
 */
export function serviceArgs (entry: string, flags: string | undefined): string[] {
  const extra = (flags ?? startFlags()).split(/\s+/).filter((flag) => flag !== '')
  if (entry === 'dist') {
    const server = join(root, 'dist/server.js')
    if (!existsSync(server)) throw new Error('--entry dist: no dist/server.js (npm run build first)')
    return [...extra, '--import', 'tsx', '--import', PROBE, server]
  }
  return [...extra, '--import', 'tsx', '--import', PROBE, join(root, 'server.ts')]
}

export interface ProbeReport {
  node: string
  execArgv: string[]
  nodeOptions: string
  pauses: { count: number, totalMs: number, longestMs: number, longestKind: string, byKind: Record<string, { count: number, totalMs: number, longestMs: number }>, majorsAt?: Array<{ atMs: number, ms: number }> }
  loopDelayMaxMs: number
  loopDelayP99Ms: number
  cpuMs: number
  memory: NodeJS.MemoryUsage
  spaces: Record<string, { size: number, used: number, physical: number }>
}

/** Asks the service's probe (IPC); rejects after 5 minutes (a heap snapshot takes a while) (no probe: a service started without it). */
export function ask<T = ProbeReport> (child: ChildProcess, probe: 'reset' | 'report' | 'gc' | 'snapshot', extra: Record<string, unknown> = {}): Promise<T> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => { child.off('message', onMessage); reject(new Error(`the service's probe did not answer ${probe}`)) }, 300_000)
    const onMessage = (message: { probe?: string }) => {
      if (message?.probe !== probe) return
      clearTimeout(timer)
      child.off('message', onMessage)
      resolve(message as T)
    }
    child.on('message', onMessage)
    child.send({ probe, ...extra })
  })
}

export function rssKb (pid: number): number {
  return Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1])
}

/** Resident memory as a container sees it: the median of three readings `gapMs` apart, no forced collection. */
export async function medianRssKb (pid: number, gapMs = 1000): Promise<{ median: number, readings: number[] }> {
  const readings: number[] = []
  for (let i = 0; i < 3; i++) {
    if (i > 0) await sleep(gapMs)
    readings.push(rssKb(pid))
  }
  return { median: [...readings].sort((a, b) => a - b)[1]!, readings }
}

const kb = (bytes: number) => bytes / 1024

/**
 * What a stream (or a waiter) costs, taken apart: the differences of
 * process.memoryUsage() and of V8's young generation between two reports,
 * per unit, in kB. heapUsed: JavaScript objects, live or not yet collected;
 * heap free: V8 pages committed but not in use (in heapTotal); external:
 * memory V8 objects hold outside the heap (Buffers, of which arrayBuffers);
 * native: the rest of RSS (libuv handles, the HTTP parsers, malloc, code).
 */
export function breakdown (before: ProbeReport, beforeRssKb: number, after: ProbeReport, afterRssKb: number, units: number): string {
  const d = (key: keyof NodeJS.MemoryUsage) => kb(after.memory[key] - before.memory[key]) / units
  const newSpace = (report: ProbeReport) => report.spaces.new_space?.size ?? 0
  const heapFree = (report: ProbeReport) => report.memory.heapTotal - report.memory.heapUsed
  const native = (report: ProbeReport, rss: number) => rss * 1024 - report.memory.heapTotal - report.memory.external
  return `RSS ${((afterRssKb - beforeRssKb) / units).toFixed(1)} = heapUsed ${d('heapUsed').toFixed(1)} + heap free ${(kb(heapFree(after) - heapFree(before)) / units).toFixed(1)}` +
    ` + external ${d('external').toFixed(1)} (arrayBuffers ${d('arrayBuffers').toFixed(1)}) + native/other ${(kb(native(after, afterRssKb) - native(before, beforeRssKb)) / units).toFixed(1)} kB;` +
    ` young generation ${(newSpace(before) / 1048576).toFixed(1)} -> ${(newSpace(after) / 1048576).toFixed(1)} MB, heapTotal ${(before.memory.heapTotal / 1048576).toFixed(0)} -> ${(after.memory.heapTotal / 1048576).toFixed(0)} MB`
}

/** The GC pauses, event-loop delay and CPU of a report, on one line. */
export function pausesLine (report: ProbeReport): string {
  const { pauses } = report
  const kinds = Object.entries(pauses.byKind).map(([kind, of]) => `${kind} ${of.count} (longest ${of.longestMs.toFixed(1)})`).join(', ')
  const majors = (pauses.majorsAt ?? []).map((major) => `+${(major.atMs / 1000).toFixed(2)} s (${major.ms.toFixed(1)} ms)`).join(', ')
  return `GC pauses ${pauses.count}, longest ${pauses.longestMs.toFixed(1)} ms (${pauses.longestKind || '-'}), total ${pauses.totalMs.toFixed(0)} ms [${kinds}]${majors === '' ? '' : `, the major ones at ${majors}`}; ` +
    `event loop delay max ${report.loopDelayMaxMs.toFixed(0)} ms, p99 ${report.loopDelayP99Ms.toFixed(0)} ms; service CPU ${(report.cpuMs / 1000).toFixed(2)} s`
}
