import { request as httpRequest, type IncomingMessage } from 'node:http'
import type { Insertable } from 'kysely'
import type { EventsTable } from '../../db/schema.ts'
import { json, writer } from './fixtures.ts'
import { LONG_WAIT_MS } from './wait.ts'

/*
 * A raw Server-Sent Events client: it keeps every field block it receives,
 * so tests can check the wire format itself, not just what a browser's
 * EventSource would surface.
 */

export interface Frame {
  id?: string
  data?: string
  retry?: string
  comments: string[]
}

export interface RawStream {
  status: number
  headers: IncomingMessage['headers']
  /** Error bodies (non-200) arrive whole. */
  body: string
  frames: Frame[]
  /** The data frames, parsed. */
  events: () => Array<{ event_id: number, [key: string]: unknown }>
  /** Resolves once `done` holds; fails after `timeoutMs` (15 s by default: generous, as waitUntil is). */
  waitFor: (done: (stream: RawStream) => boolean, timeoutMs?: number) => Promise<void>
  ended: Promise<void>
  close: () => void
}

export function openStream (baseUrl: string, path: string, headers: Record<string, string> = {}): Promise<RawStream> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(`${baseUrl}${path}`, { headers: { accept: 'text/event-stream', ...headers } }, (res) => {
      let buffer = ''
      const waiters = new Set<() => void>()
      let endResolve!: () => void
      const stream: RawStream = {
        status: res.statusCode ?? 0,
        headers: res.headers,
        body: '',
        frames: [],
        events: () => stream.frames.filter((frame) => frame.data !== undefined).map((frame) => JSON.parse(frame.data!)),
        waitFor: (done, timeoutMs = LONG_WAIT_MS) => new Promise<void>((resolve, reject) => {
          if (done(stream)) { resolve(); return }
          const check = () => {
            if (!done(stream)) return
            clearTimeout(timer)
            waiters.delete(check)
            resolve()
          }
          const timer = setTimeout(() => {
            waiters.delete(check)
            reject(new Error(`timed out after ${timeoutMs} ms; frames: ${JSON.stringify(stream.frames).slice(0, 2000)}`))
          }, timeoutMs)
          waiters.add(check)
        }),
        ended: new Promise<void>((resolve) => { endResolve = resolve }),
        close: () => { req.destroy() }
      }
      res.setEncoding('utf8')
      res.on('data', (chunk: string) => {
        if (stream.status !== 200) { stream.body += chunk; return }
        buffer += chunk
        let end: number
        while ((end = buffer.indexOf('\n\n')) >= 0) {
          const block = buffer.slice(0, end)
          buffer = buffer.slice(end + 2)
          const frame: Frame = { comments: [] }
          for (const line of block.split('\n')) {
            if (line.startsWith(':')) frame.comments.push(line.slice(1).trim())
            else {
              const colon = line.indexOf(':')
              const field = line.slice(0, colon)
              const value = line.slice(colon + 1).replace(/^ /, '')
              if (field === 'id' || field === 'data' || field === 'retry') frame[field] = value
              else throw new Error(`unexpected SSE field ${JSON.stringify(line)}`)
            }
          }
          stream.frames.push(frame)
        }
        for (const waiter of [...waiters]) waiter()
      })
      res.on('close', () => { endResolve(); for (const waiter of [...waiters]) waiter() })
      resolve(stream)
    })
    req.on('error', (err) => { if ((err as NodeJS.ErrnoException).code !== 'ECONNRESET') reject(err) })
    req.end()
  })
}

export const makeEvent = (fields: Partial<Insertable<EventsTable>> = {}): Insertable<EventsTable> => ({
  event_type: 'task_added',
  run_id: '',
  task_id: '',
  thread_id: '',
  summary: '',
  payload: json({}),
  ...fields
})

/** Commits events (one transaction) and returns their ids. */
export async function insertEvents (...events: Array<Partial<Insertable<EventsTable>>>): Promise<number[]> {
  const db = await writer()
  const rows = await db.insertInto('events').values(events.map(makeEvent)).returning('event_id').execute()
  return rows.map((row) => Number(row.event_id))
}

/** The ids of the first `count` events a client's stream yields (then it stops iterating, which closes the stream). */
export async function take (events: AsyncGenerator<{ event_id: number }>, count: number): Promise<number[]> {
  const ids: number[] = []
  for await (const event of events) {
    ids.push(event.event_id)
    if (ids.length === count) break
  }
  return ids
}
