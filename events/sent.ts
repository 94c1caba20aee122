import type { ServerResponse } from 'node:http'

/** What counts the events a response carried: a stream's subscriber, or a long-poll's page. */
export interface SentCount { readonly sent: number }

/**
 * How many events each stream and long-poll response carried, for the line
 * logged when it ends (plugins/app/request-log.ts): weakly held, so a
 * response gone takes its count with it.
 */
const counts = new WeakMap<ServerResponse, SentCount>()

export function countSent (response: ServerResponse, count: SentCount): void {
  counts.set(response, count)
}

/** The events `response` carried; undefined when it streamed none (not a stream, or refused before it began). */
export const eventsSent = (response: ServerResponse): number | undefined => counts.get(response)?.sent
