import { LimitRefusal, type LimitedKind } from '../errors.ts'

/** A limit on what is open at once: on the whole instance, and on any one caller. */
export interface Limit {
  max: number
  maxPerCaller: number
}

/**
 * The slots of one kind (event streams, or long-polls) on this process:
 * at most `max` held at once, and at most `maxPerCaller` by any one caller
 * (a principal, or a client's address with authentication off), so that a
 * caller at its share never takes another's slots, as the Kubernetes API
 * server's priority and fairness does. Refusals are counted by reason, for
 * the metrics (never by caller: there may be any number of them).
 */
export class CallerSlots {
  /** Slots held, by caller; a caller holding none is not kept. */
  readonly #held = new Map<string, number>()
  #total = 0
  readonly refused = { instance: 0, caller: 0 }

  readonly kind: LimitedKind
  readonly limit: Limit

  constructor (kind: LimitedKind, limit: Limit) {
    this.kind = kind
    this.limit = limit
  }

  /** Slots held, over every caller. */
  get total (): number {
    return this.#total
  }

  /** Takes a slot for `caller`, or throws the LimitRefusal that says which limit has none left. */
  take (caller: string): void {
    if (this.#total >= this.limit.max) {
      this.refused.instance++
      throw new LimitRefusal(this.kind, 'instance', this.limit.max)
    }
    const held = this.#held.get(caller) ?? 0
    if (held >= this.limit.maxPerCaller) {
      this.refused.caller++
      throw new LimitRefusal(this.kind, 'caller', this.limit.maxPerCaller)
    }
    this.#held.set(caller, held + 1)
    this.#total++
  }

  /** Gives back a slot `caller` took: once for each take that did not throw. */
  release (caller: string): void {
    const held = this.#held.get(caller)!
    if (held > 1) this.#held.set(caller, held - 1)
    else this.#held.delete(caller)
    this.#total--
  }
}
