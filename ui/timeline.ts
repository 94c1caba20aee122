/*
 * A run's timeline, drawn from its events: a lane per task, each phase
 * (added, ready, dispatched, running, blocked, done, failed...) a bar from
 * the event that began it, in its status's colour, with its word and times
 * beside it and in its tooltip. Built for a 200-task run with thousands of
 * events: a lane is one small SVG whose viewBox is the run's time span in
 * seconds, so a phase is drawn once, where it starts, and runs to the right
 * edge under the phases after it (never measured, never moved). A live
 * event appends one rect to one lane; the lanes are rescaled (one
 * attribute each) only when an event falls outside the span drawn, which
 * keeps headroom for the events to come.
 */
import type { Event } from '../client/src/types.ts'
import { clock, duration, h, statusBadge, statusClass, svg } from './dom.ts'

/** The event types that start a phase without saying its status in their payload (docs/reference.md, "Event types"). */
const PHASE_OF_EVENT: Record<string, string> = { task_added: 'added', task_answered: 'running' }

/**
 * The phase a task enters with `event`: the status a task event's payload
 * names (task_ready, task_done... carry `{"status": ...}`), else what its
 * type says (task_added, task_answered, task_<status>); none for the rest
 * (a thread's messages, a run's own events).
 */
export function phaseOf (event: Event): string | undefined {
  if (event.task_id === '' || !event.event_type.startsWith('task_')) return undefined
  const status = (event.payload as { status?: unknown } | null)?.status
  if (typeof status === 'string' && status !== '') return status
  return PHASE_OF_EVENT[event.event_type] ?? event.event_type.slice('task_'.length)
}

/** The lanes' room to the right of the latest event, as a share of the span: live events fill it before the lanes are rescaled. */
const HEADROOM = 0.1
/** The shortest span drawn, in ms: a run's first events are not stretched across the page, and a span is never empty. */
const MIN_SPAN_MS = 100

interface Phase { status: string, at: number, summary: string, title: SVGElement }

interface Lane {
  item: HTMLElement
  name: HTMLElement
  bar: SVGElement
  now: HTMLElement
  phases: Phase[]
  /** The task's status in the run's latest read: said while its lane has no phase. */
  status?: string
}

export interface TimelineTask { task_id: string, title: string, status: string }

export class Timeline {
  /** The section's content: the span, the notice, the axis and the lanes. `data-events`: the events drawn. */
  readonly element: HTMLElement
  readonly #hrefOf: (taskId: string) => string
  #list: HTMLElement
  readonly #span = h('p', { class: 'meta' })
  readonly #notice = h('p', { class: 'notice' })
  readonly #axis = h('div', { class: 'lane axis', 'aria-hidden': 'true' })
  #lanes = new Map<string, Lane>()
  /** Each task's latest thread, as its events name it. */
  readonly #threads = new Map<string, string>()
  /** Lanes whose label or latest phase changed since they were last drawn. */
  #changed = new Set<Lane>()
  #events = 0
  /** The x origin of every rect (ms): the first event's time, fixed until the next reset. */
  #origin = Number.NaN
  #first = Number.POSITIVE_INFINITY
  #last = Number.NEGATIVE_INFINITY
  /** The span the lanes' viewBox shows (ms). */
  #viewStart = 0
  #viewEnd = 0
  #startsLater = false

  readonly #of: string

  /** `hrefOf`: where a lane's name links; `of`: whose events these are ("this run"), for the sentences. */
  constructor (hrefOf: (taskId: string) => string, of = 'this run') {
    this.#hrefOf = hrefOf
    this.#of = of
    this.#list = h('ol', { class: 'lanes' })
    this.element = h('div', { class: 'timeline' }, this.#span, this.#notice, this.#axis, this.#list)
    this.reset([], false)
  }

  /** Draws the run's events (ascending) from scratch; `startsLater`: older events of the run are no longer kept. */
  reset (events: Event[], startsLater: boolean): void {
    this.#lanes = new Map()
    this.#threads.clear()
    this.#changed.clear()
    this.#events = 0
    this.#origin = Number.NaN
    this.#first = Number.POSITIVE_INFINITY
    this.#last = Number.NEGATIVE_INFINITY
    this.#viewStart = this.#viewEnd = 0
    this.#startsLater = startsLater
    // Built apart from the document, then swapped in: one layout for the whole history.
    const list = h('ol', { class: 'lanes' })
    const previous = this.#list
    this.#list = list
    for (const event of events) this.#apply(event)
    this.#arrange()
    previous.replaceWith(list)
  }

  /** One event of the run, as it arrives. */
  add (event: Event): void {
    this.#apply(event)
    this.#flush()
  }

  /**
   * The run's tasks as last read, in the run's order: each has a lane (with
   * its title; those without a phase say the task's status), and the lanes
   * follow that order. Lanes of tasks not listed keep their place after them.
   */
  setTasks (tasks: TimelineTask[]): void {
    this.#tasks = tasks
    this.#arrange()
  }

  /** The tasks of the last setTasks, kept for the lanes a reset draws anew. */
  #tasks: TimelineTask[] = []

  #arrange (): void {
    const wanted: HTMLElement[] = []
    for (const task of this.#tasks) {
      const lane = this.#lane(task.task_id)
      if (lane.name.textContent !== task.title) lane.name.textContent = task.title
      if (lane.status !== task.status) {
        lane.status = task.status
        this.#changed.add(lane)
      }
      wanted.push(lane.item)
    }
    this.#flush()
    // Moved only when out of order: a snapshot of a steady run moves nothing.
    if (wanted.some((item, i) => this.#list.children[i] !== item)) this.#list.prepend(...wanted)
  }

  /** The task's latest phase: its status, when it began, and what its event said. */
  latestPhase (taskId: string): { status: string, at: number, summary: string } | undefined {
    const phase = this.#lanes.get(taskId)?.phases.at(-1)
    return phase === undefined ? undefined : { status: phase.status, at: phase.at, summary: phase.summary }
  }

  /** The thread of the task's latest attempt, as its events name it. */
  threadOf (taskId: string): string | undefined {
    return this.#threads.get(taskId)
  }

  #lane (taskId: string): Lane {
    let lane = this.#lanes.get(taskId)
    if (lane !== undefined) return lane
    const name = h('a', { class: 'lane-name', href: this.#hrefOf(taskId) }, taskId)
    const bar = svg('svg', { class: 'lane-bar', preserveAspectRatio: 'none', role: 'img', viewBox: this.#viewBox() })
    const now = h('span', { class: 'lane-now' })
    const item = h('li', { class: 'lane', 'data-lane': taskId }, name, bar, now)
    lane = { item, name, bar, now, phases: [] }
    this.#lanes.set(taskId, lane)
    this.#list.append(item)
    this.#changed.add(lane)
    return lane
  }

  #apply (event: Event): void {
    const at = Date.parse(event.created_at)
    this.#events++
    if (Number.isNaN(this.#origin)) this.#origin = at
    this.#first = Math.min(this.#first, at)
    this.#last = Math.max(this.#last, at)
    if (event.task_id === '') return
    if (event.thread_id !== '') this.#threads.set(event.task_id, event.thread_id)
    const phase = phaseOf(event)
    if (phase === undefined) return
    const lane = this.#lane(event.task_id)
    const previous = lane.phases.at(-1)
    if (previous?.status === phase) return // the same status said again: the phase goes on
    const rect = svg('rect', { class: `phase phase-${statusClass(phase)}`, 'data-phase': phase, x: String((at - this.#origin) / 1000), y: '0', width: '1e7', height: '1' })
    const title = svg('title')
    title.textContent = `${phase} from ${clock(at)}`
    rect.append(title)
    lane.bar.append(rect)
    if (previous !== undefined) previous.title.textContent = `${previous.status} from ${clock(previous.at)} to ${clock(at)} (${duration(at - previous.at)})`
    lane.phases.push({ status: phase, at, summary: event.summary, title })
    this.#changed.add(lane)
  }

  /** Draws what #apply changed: each changed lane's words, and the span when an event fell outside it. */
  #flush (): void {
    for (const lane of this.#changed) {
      const latest = lane.phases.at(-1)
      if (latest === undefined) {
        // No event of its own (none kept, or a task written without them): its status as last read.
        lane.now.replaceChildren(lane.status === undefined ? '' : statusBadge(lane.status))
        lane.bar.setAttribute('aria-label', 'no event')
        continue
      }
      lane.now.replaceChildren(statusBadge(latest.status), ' ', h('span', { class: 'meta' }, clock(latest.at)))
      lane.bar.setAttribute('aria-label', lane.phases.map((phase) => `${phase.status} ${clock(phase.at)}`).join(', '))
    }
    this.#changed.clear()
    this.element.dataset.events = String(this.#events)
    if (this.#events === 0) {
      this.#span.textContent = this.#startsLater ? `No event of ${this.#of} is kept any longer.` : `No events of ${this.#of} yet.`
      this.#notice.hidden = true
      this.#axis.replaceChildren()
      return
    }
    this.#notice.hidden = !this.#startsLater
    this.#notice.textContent = `Older events of ${this.#of} are no longer kept: the timeline starts later, at ${clock(this.#first)}.`
    this.#span.textContent = `${this.#events} ${this.#events === 1 ? 'event' : 'events'}, from ${clock(this.#first)} to ${clock(this.#last)} (${duration(this.#last - this.#first)}).`
    if (this.#first < this.#viewStart || this.#last > this.#viewEnd || this.#viewEnd === 0) this.#rescale()
  }

  #viewBox (): string {
    return `${(this.#viewStart - this.#origin) / 1000 || 0} 0 ${(this.#viewEnd - this.#viewStart) / 1000 || 1} 1`
  }

  /** A span with headroom around every event: one attribute per lane. */
  #rescale (): void {
    this.#viewStart = this.#first
    this.#viewEnd = this.#first + Math.max(this.#last - this.#first, MIN_SPAN_MS) * (1 + HEADROOM)
    const viewBox = this.#viewBox()
    for (const lane of this.#lanes.values()) lane.bar.setAttribute('viewBox', viewBox)
    this.#axis.replaceChildren(h('span', {}), h('span', { class: 'axis-ends' }, h('span', {}, clock(this.#viewStart)), h('span', {}, clock(this.#viewEnd))), h('span', {}))
  }
}
