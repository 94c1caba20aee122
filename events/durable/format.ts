import type { StreamFormat } from '../sse/subscriber.ts'
import { encodeOffset } from './offsets.ts'

/*
 * The Durable Streams SSE mode's wire (docs/reference.md, "Durable Streams").
 */

/** A `control` event of the protocol's SSE mode: where the client is, and whether that is the tail. */
const controlEvent = (position: number, cursor: string, upToDate: boolean) =>
  `event: control\ndata:{"streamNextOffset":"${encodeOffset(position)}","streamCursor":"${cursor}","upToDate":${upToDate}}\n\n`

/**
 * The protocol's SSE format (JSON mode): a catch-up page as one `data`
 * event holding its messages, then one `control` event (up to date once
 * the page is the last: the live events that came meanwhile join it); each
 * live event a `data` event holding a one-message array, then a `control`
 * event; a quiet stream's position is a `control` event alone. `tail` is the hub's
 * tail (a stream that goes live has everything up to it); `cursor`
 * gives the Stream-Cursor of each control event. A `data:` field has no
 * space after its colon, as the reference server writes it (SSE allows
 * either; a client that matches bytes, like the conformance suite, expects
 * this one).
 */
export function durableSseFormat (tail: () => number, cursor: () => string): StreamFormat {
  return {
    event: (event, live) => `event: data\ndata:[${event.json}]\n\n${controlEvent(event.id, cursor(), live)}`,
    position: (position) => controlEvent(position, cursor(), true),
    batch: (events, position, upToDate) => {
      const reached = upToDate ? Math.max(position, tail()) : position
      const data = events.length === 0 ? '' : `event: data\ndata:[${events.map((event) => event.json).join(',')}]\n\n`
      return { text: data + controlEvent(reached, cursor(), upToDate), position: reached }
    }
  }
}
