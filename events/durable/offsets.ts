import { invalidParameter, offsetErrors } from '../../errors.ts'
import { StreamCursorParam, StreamOffsetParam } from '../../schemas/api.ts'

/*
 * The Durable Streams read path's positions (docs/reference.md, "Durable
 * Streams"): offsets (where a read starts and the next one resumes) and
 * the Stream-Cursor (an interval number that keeps caches from looping).
 *
 * An offset is a settled position (an event id, docs/reference.md, "The event stream") written
 * as 11 base-36 digits, zero-padded: short, URL-safe, and ordered
 * lexicographically as the log is (2^53 needs 11 digits). It depends on
 * nothing but the id, so any replica resumes an offset another handed out.
 */

const OFFSET_DIGITS = 11
const OFFSET_PATTERN = /^[0-9a-z]{11}$/

/** Where a Durable Streams read starts: after a position, at the oldest event kept (`-1`), or at the tail (`now`). */
export type StreamOffset = number | 'oldest' | 'now'

export const encodeOffset = (position: number) => position.toString(36).padStart(OFFSET_DIGITS, '0')

/** What an offset that cannot be served answers (410, 400, 503), in the protocol's words. */
export const OFFSET_ERRORS = offsetErrors(encodeOffset)

/** The `offset` query parameter; absent means `-1`. A malformed one is a 400. */
export function parseOffset (text: string | undefined): StreamOffset {
  if (text === undefined || text === '-1') return 'oldest'
  if (text === 'now') return 'now'
  const position = OFFSET_PATTERN.test(text) ? parseInt(text, 36) : NaN
  if (!Number.isSafeInteger(position)) throw invalidParameter(StreamOffsetParam)
  return position
}

/** The protocol's default Stream-Cursor: 20 s intervals counted from 2024-10-09T00:00:00Z. */
const STREAM_CURSOR_ORIGIN_MS = Date.UTC(2024, 9, 9)
const STREAM_CURSOR_INTERVAL_MS = 20_000
/** An echoed Stream-Cursor still current moves on by 1 s to 3600 s (the protocol's jitter), in intervals. */
const MAX_JITTER_INTERVALS = 3600_000 / STREAM_CURSOR_INTERVAL_MS

const STREAM_CURSOR_PATTERN = /^[0-9]{1,15}$/

/** The `cursor` query parameter (the Stream-Cursor a client echoes). A malformed one is a 400. */
export function parseStreamCursor (text: string | undefined): number | undefined {
  if (text === undefined) return undefined
  if (!STREAM_CURSOR_PATTERN.test(text)) throw invalidParameter(StreamCursorParam)
  return Number(text)
}

/**
 * The Stream-Cursor of a live answer: the current interval's number, or,
 * when the client echoed one at or past it, a strictly greater one, so
 * that a cache never hands the same answer back in a loop.
 */
export function nextStreamCursor (now: number, echoed: number | undefined, random = Math.random): string {
  const current = Math.floor((now - STREAM_CURSOR_ORIGIN_MS) / STREAM_CURSOR_INTERVAL_MS)
  if (echoed === undefined || echoed < current) return String(current)
  return String(echoed + 1 + Math.floor(random() * MAX_JITTER_INTERVALS))
}
