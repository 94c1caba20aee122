import type { FastifyReply } from 'fastify'
import fp from 'fastify-plugin'
import { hash } from 'node:crypto'
import { authenticationOn } from '../../config.ts'

/**
 * What a JSON read is, for caches (docs/reference.md, "HTTP caching"):
 * - `state`: runs, tasks, blocked tasks, threads; may change at any time,
 *   so a cache must revalidate before every use.
 * - `recent`: an events page that may still grow (not full, or starting
 *   from the moving floor): at most a few seconds stale.
 * - `immutable`: a full events page of settled events after an explicit
 *   event id; no event can ever join it, so it can be kept forever.
 * - `stream`: a Durable Streams catch-up or long-poll page (docs/reference.md,
 *   "Durable Streams"; the protocol's "Caching and Collapsing"): a minute, then
 *   served stale while revalidated, so that a cache collapses a crowd.
 */
export type CacheKind = 'state' | 'recent' | 'immutable' | 'stream'

/** How long a `recent` events page may be served stale: the contract allows at most 5 s. */
export const RECENT_MAX_AGE_SECONDS = 5

/** Every error: a 404 may become a 200, a 503 must be retried (docs/reference.md, "HTTP caching"). */
export const NO_STORE = 'no-store'

declare module 'fastify' {
  interface FastifyReply {
    /**
     * Sends a body that is already JSON text (built by Postgres, see
     * db/json.ts), bypassing serialization (the route's response schema
     * still documents it, and the contract tests validate it), with a strong ETag and the
     * Cache-Control of its kind, or 304 with no body when the request's
     * If-None-Match names that tag. `variant`, when given, is a response
     * header's value the tag covers too (a Durable Streams page's next
     * offset: the same body may resume from different places).
     */
    sendCacheable (json: string, kind: CacheKind, variant?: string): FastifyReply
    /**
     * Sends a read's body with the event stream position it was read at,
     * in X-Event-Cursor (docs/reference.md, "The event stream"): subscribe
     * with after_event_id=<X-Event-Cursor> and nothing between is missed.
     * Cached as state.
     */
    sendRead (read: { body: string, eventCursor: string }): FastifyReply
  }
}

/**
 * Cache-Control for each kind. With authentication on, every answer is for the
 * client that presented the token: `private`, and Vary: Authorization so
 * that a browser shared by two tokens keeps them apart.
 */
export function cacheControls (authEnabled: boolean): Record<CacheKind, string> {
  const scope = authEnabled ? 'private' : 'public'
  return {
    state: authEnabled ? 'private, no-cache' : 'no-cache',
    recent: `${scope}, max-age=${RECENT_MAX_AGE_SECONDS}`,
    immutable: `${scope}, max-age=31536000, immutable`,
    stream: `${scope}, max-age=60, stale-while-revalidate=300`
  }
}

/**
 * The strong tag of a body: the first 128 bits of its SHA-256, cheap on
 * CPUs with SHA extensions and cheaper here than in Postgres. Hashing the
 * bytes that are sent makes the tag exactly as strong as the body: same
 * bytes, same tag.
 */
export const entityTag = (body: Buffer) => `"${hash('sha256', body, 'base64url').slice(0, 22)}"`

/**
 * One element of an If-None-Match list (RFC 9110 sections 8.8.3 and 5.6.1):
 * an entity-tag (optional W/, a quoted opaque tag) or nothing (empty
 * elements are allowed), then a comma or the end.
 */
const LIST_ITEM = /[ \t]*(?:(?:W\/)?("[\x21\x23-\x7e\x80-\xff]*")[ \t]*)?(?:,|$)/y

/**
 * Whether If-None-Match names `tag` (RFC 9110 section 13.1.2): `*`, or a
 * list holding it under the weak comparison (W/ ignored). A field that is
 * not a valid list matches nothing: the condition is ignored and the full
 * answer sent, never an error.
 */
export function noneMatchHits (field: string | undefined, tag: string): boolean {
  if (field === undefined) return false
  if (field.trim() === '*') return true
  LIST_ITEM.lastIndex = 0
  let hit = false
  while (LIST_ITEM.lastIndex < field.length) {
    const item = LIST_ITEM.exec(field)
    if (item === null) return false
    hit ||= item[1] === tag
  }
  return hit
}

/** Adds `name` to the response's Vary field, keeping what other plugins put there (CORS's Origin). */
function addVary (reply: FastifyReply, name: string) {
  const vary = reply.getHeader('vary')
  reply.header('vary', vary === undefined ? name : `${String(vary)}, ${name}`)
}

/**
 * HTTP caching of the JSON reads: strong ETags, conditional GETs, and the
 * Cache-Control of docs/reference.md, "HTTP caching". Routes say what they send
 * (reply.sendCacheable, or reply.sendRead for state); errors are `no-store`
 * (plugins/app/errors.ts).
 */
export default fp(async function httpCachePlugin (app) {
  const authEnabled = authenticationOn(app.config)
  const controls = cacheControls(authEnabled)
  // The last body sent, encoded and tagged: a crowd of long-polls answered
  // with the same page (the same string) costs one encoding and one hash.
  let last = { json: '', variant: undefined as string | undefined, body: Buffer.alloc(0), tag: entityTag(Buffer.alloc(0)) }
  app.decorateReply('sendCacheable', function (this: FastifyReply, json: string, kind: CacheKind, variant?: string) {
    if (json !== last.json || variant !== last.variant) {
      // Encoded once: the same bytes are hashed and sent.
      const body = Buffer.from(json)
      last = { json, variant, body, tag: entityTag(variant === undefined ? body : Buffer.concat([Buffer.from(`${variant}\n`), body])) }
    }
    const { body, tag } = last
    this.header('etag', tag).header('cache-control', controls[kind])
    if (authEnabled) addVary(this, 'Authorization')
    if (noneMatchHits(this.request.headers['if-none-match'], tag)) return this.code(304).send()
    // A route may have chosen its own JSON type (the Durable Streams routes: exactly `application/json`).
    if (!this.hasHeader('content-type')) this.type('application/json; charset=utf-8')
    return this.send(body)
  })
  app.decorateReply('sendRead', function (this: FastifyReply, read: { body: string, eventCursor: string }) {
    return this.header('x-event-cursor', read.eventCursor).sendCacheable(read.body, 'state')
  })
}, { name: 'http-cache', decorators: { fastify: ['config'] } })
