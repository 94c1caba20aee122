/*
 * What every page of the web UI draws with: elements built from text (never
 * HTML from data), status badges, times, and the addresses of the pages.
 */

export type Child = Node | string | number | null | undefined | false

export function h (tag: string, attributes: Record<string, string> = {}, ...children: Child[]): HTMLElement {
  const element = document.createElement(tag)
  for (const [name, value] of Object.entries(attributes)) element.setAttribute(name, value)
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue
    element.append(typeof child === 'number' ? String(child) : child)
  }
  return element
}

const SVG = 'http://www.w3.org/2000/svg'
/** An SVG element (the timeline's): attributes only, no children from data but a <title>'s text. */
export function svg (tag: string, attributes: Record<string, string> = {}): SVGElement {
  const element = document.createElementNS(SVG, tag)
  for (const [name, value] of Object.entries(attributes)) element.setAttribute(name, value)
  return element
}

/**
 * The statuses with a colour of their own (style.css: --status-<word>):
 * the task statuses (added, ready, dispatched, running, blocked, done,
 * failed), which runs and attempts use too, and the threads' open and
 * claimed. Any other word is drawn in neutral grey; the word is always
 * written beside its colour.
 */
const KNOWN_STATUSES = new Set(['added', 'ready', 'dispatched', 'running', 'blocked', 'done', 'failed', 'open', 'claimed'])
export const statusClass = (status: string) => KNOWN_STATUSES.has(status) ? status : 'other'
/** A status as text (colour only repeats it). */
export const statusBadge = (status: string) => h('span', { class: `status status-${statusClass(status)}` }, status)

export function age (iso: string): string {
  const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000)
  if (seconds < 60) return `${Math.floor(seconds)} s ago`
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`
  if (seconds < 86_400) return `${Math.floor(seconds / 3600)} h ago`
  return `${Math.floor(seconds / 86_400)} d ago`
}
/** A relative time ("12 s ago"), kept current by keepTimesCurrent; the exact one on hover. */
export const time = (iso: string) => h('time', { datetime: iso, title: iso }, age(iso))

/** A duration in its two largest units: "120 ms", "4 s", "2 min 5 s", "3 h 10 min". */
export function duration (ms: number): string {
  if (ms < 1000) return `${Math.max(0, Math.round(ms))} ms`
  const seconds = Math.round(ms / 1000)
  if (seconds < 60) return `${seconds} s`
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min${seconds % 60 === 0 ? '' : ` ${seconds % 60} s`}`
  const minutes = Math.floor(seconds / 60)
  return `${Math.floor(minutes / 60)} h${minutes % 60 === 0 ? '' : ` ${minutes % 60} min`}`
}

const CLOCK = new Intl.DateTimeFormat(undefined, { hour: 'numeric', minute: '2-digit', second: '2-digit' })
/** A moment as the clock shows it here (the timeline's times): one formatter, as a timeline formats thousands. */
export const clock = (ms: number) => CLOCK.format(ms)

export const runHref = (runId: string) => `#/runs/${encodeURIComponent(runId)}`
export const taskHref = (runId: string, taskId: string) => `${runHref(runId)}/tasks/${encodeURIComponent(taskId)}`
export const threadHref = (threadId: string) => `#/threads/${encodeURIComponent(threadId)}`
