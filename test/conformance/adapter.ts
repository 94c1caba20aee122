import { createServer, request, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import { promisify } from 'node:util'
import { brotliDecompress, gunzip, inflate } from 'node:zlib'
import pg from 'pg'
import { encodeOffset } from '../../events/durable/offsets.ts'

/*
 * The Durable Streams conformance suite writes the streams it reads: it
 * creates one (PUT) and appends to it (POST) through the protocol. This
 * service is a read path: an orchestrator writes the event log. So the suite
 * talks to this adapter, which plays the orchestrator for the writes and
 * hands every read to the service untouched, but for the representation of
 * what was appended:
 *
 * - PUT /v1/stream/{name} inserts a run named {name}; POST appends to it,
 *   in one transaction, as an orchestrator writes. On a JSON stream each
 *   message (a JSON array is one level of messages, as the protocol says) is
 *   an event whose payload is the message; on a stream of any other content
 *   type, each append is one event whose payload holds its bytes (base64).
 *   An append answers the offset of its last event (Stream-Next-Offset):
 *   an orchestrator knows the ids it inserted.
 * - GET, HEAD and OPTIONS /v1/stream/{name}?... go to /api/streams/runs/{name}?...
 *   with the same query and headers. In the answer, every envelope becomes
 *   what was appended: on a JSON stream its message, in JSON bodies and SSE
 *   `data` events alike; on any other stream its bytes, the body in the
 *   stream's content type, an SSE `data` event as text lines or, for a
 *   binary type, base64 (with `Stream-SSE-Data-Encoding: base64`), as the
 *   protocol writes them. Statuses, offsets, cursors, caching headers and
 *   the SSE framing (which events, which controls) pass as they are; a
 *   rewritten body goes uncompressed (no Content-Encoding).
 * - Anything else (DELETE, a stream never created) is answered as the
 *   protocol would, to the extent the suite's read tests need.
 *
 * So the tests of text and binary streams test the service's positions and
 * framing, and this file's encoding of bytes: test/conformance/scope.ts
 * names them.
 */

const PREFIX = '/v1/stream/'

export interface ConformanceAdapter {
  url: string
  close: () => Promise<void>
}

function readBody (req: IncomingMessage): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = []
    req.on('data', (chunk: Buffer) => chunks.push(chunk))
    req.on('end', () => resolve(Buffer.concat(chunks)))
    req.on('error', reject)
  })
}

const decoders: Record<string, (body: Buffer) => Promise<Buffer>> = { gzip: promisify(gunzip), deflate: promisify(inflate), br: promisify(brotliDecompress) }

/** A body as sent, decoded (the service compresses what the client accepts compressed). */
async function decoded (body: Buffer, encoding: string | undefined): Promise<Buffer> {
  const decode = encoding === undefined ? undefined : decoders[encoding]
  return decode === undefined ? body : await decode(body)
}

const nameOf = (path: string) => decodeURIComponent(path.slice(PREFIX.length))

/** A content type without its parameters, lower case. */
const mediaType = (type: string | undefined) => (type ?? '').split(';')[0]!.trim().toLowerCase()
const isJson = (type: string) => mediaType(type) === 'application/json'
/** Text, as the protocol's SSE mode tells it from bytes that need base64. */
const isText = (type: string) => mediaType(type).startsWith('text/') || isJson(type)

interface Envelope { payload: unknown }
interface Bytes { bytes: string }

/** A stream's content, as the reader sees it: a JSON array of the messages, or the bytes appended, one after another. */
function content (type: string, envelopes: Envelope[]): Buffer {
  if (isJson(type)) return Buffer.from(JSON.stringify(envelopes.map((envelope) => envelope.payload)))
  return Buffer.concat(envelopes.map((envelope) => Buffer.from((envelope.payload as Bytes).bytes, 'base64')))
}

/** An SSE `data` event holding a batch, as the protocol writes it for the stream's content type. */
function dataEvent (type: string, envelopes: Envelope[]): string {
  const bytes = content(type, envelopes)
  const text = isText(type) ? bytes.toString('utf8') : bytes.toString('base64')
  return `event: data\n${text.split(/\r\n|\r|\n/).map((line) => `data:${line}`).join('\n')}\n\n`
}

/** Rewrites the `data` events of an SSE text (whole events only), keeping what follows the last one for later. */
function rewriteSse (type: string, text: string): { out: string, rest: string } {
  let out = ''
  let rest = text
  for (;;) {
    const end = rest.indexOf('\n\n')
    if (end < 0) return { out, rest }
    const block = rest.slice(0, end)
    rest = rest.slice(end + 2)
    if (block.startsWith('event: data\n')) {
      const data = block.split('\n').filter((line) => line.startsWith('data:')).map((line) => line.replace(/^data: ?/, '')).join('\n')
      out += dataEvent(type, JSON.parse(data) as Envelope[])
    } else {
      out += `${block}\n\n`
    }
  }
}

export async function startConformanceAdapter (serviceUrl: string, databaseUrl: string): Promise<ConformanceAdapter> {
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 8 })
  pool.on('error', () => {})
  const service = new URL(serviceUrl)
  /** Each stream's content type, as created. */
  const types = new Map<string, string>()

  async function write (req: IncomingMessage, res: ServerResponse, name: string): Promise<void> {
    const body = await readBody(req)
    const type = req.headers['content-type'] ?? 'application/octet-stream'
    if (req.method === 'PUT') {
      await pool.query('insert into runs (run_id, goal, summary, status) values ($1, \'conformance\', \'\', \'running\') on conflict do nothing', [name])
      types.set(name, type)
      if (body.length > 0) await append(name, type, body)
      res.writeHead(201, { location: `${PREFIX}${encodeURIComponent(name)}`, 'content-type': type }).end()
      return
    }
    if (req.method === 'POST') {
      const created = types.get(name)
      if (created === undefined) {
        res.writeHead(404, { 'content-type': 'text/plain' }).end('no such stream')
        return
      }
      if (mediaType(type) !== mediaType(created)) {
        res.writeHead(409, { 'content-type': 'text/plain' }).end('content type mismatch')
        return
      }
      if (body.length === 0) {
        res.writeHead(400, { 'content-type': 'text/plain' }).end('an empty append')
        return
      }
      res.writeHead(204, { 'stream-next-offset': encodeOffset(await append(name, type, body)) }).end()
      return
    }
    if (req.method === 'DELETE') {
      await pool.query('delete from runs where run_id = $1', [name])
      types.delete(name)
      res.writeHead(204).end()
      return
    }
    res.writeHead(405).end()
  }

  /** The orchestrator's write: the messages (or the bytes) as events of the run, in one transaction; the last event's id. */
  async function append (name: string, type: string, body: Buffer): Promise<number> {
    let messages: unknown[]
    if (isJson(type)) {
      const parsed = JSON.parse(body.toString()) as unknown
      messages = Array.isArray(parsed) ? parsed : [parsed]
    } else {
      messages = [{ bytes: body.toString('base64') } satisfies Bytes]
    }
    const { rows } = await pool.query<{ last: string | null }>(`with appended as (insert into events (event_type, run_id, summary, payload)
      select 'message', $1, 'conformance', m from jsonb_array_elements($2::jsonb) with ordinality as a (m, n) order by n
      returning event_id) select max(event_id) as last from appended`, [name, JSON.stringify(messages)])
    return Number(rows[0]!.last ?? 0)
  }

  function read (req: IncomingMessage, res: ServerResponse, name: string, search: string): void {
    const streamType = types.get(name) ?? 'application/json'
    const upstream = request({
      host: service.hostname,
      port: service.port,
      method: req.method,
      path: `/api/streams/runs/${encodeURIComponent(name)}${search}`,
      headers: { ...req.headers, host: service.host }
    }, (answer) => {
      const type = answer.headers['content-type'] ?? ''
      const headers = { ...answer.headers }
      if (answer.statusCode === 200 && mediaType(type) === 'application/json') {
        headers['content-type'] = streamType
        if (req.method !== 'GET') {
          res.writeHead(200, headers).end()
          answer.resume()
          return
        }
        // The rewritten body goes uncompressed (its encoding no longer applies).
        void readBody(answer).then(async (body) => {
          const rewritten = content(streamType, JSON.parse((await decoded(body, headers['content-encoding'])).toString()) as Envelope[])
          delete headers['content-encoding']
          delete headers['transfer-encoding']
          res.writeHead(200, { ...headers, 'content-length': rewritten.length }).end(rewritten)
        }).catch(() => res.destroy())
        return
      }
      if (mediaType(type) === 'text/event-stream') {
        delete headers['content-length']
        if (!isText(streamType)) headers['stream-sse-data-encoding'] = 'base64'
        res.writeHead(answer.statusCode ?? 200, headers)
        let pending = ''
        answer.setEncoding('utf8')
        answer.on('data', (chunk: string) => {
          const { out, rest } = rewriteSse(streamType, pending + chunk)
          pending = rest
          if (out !== '') res.write(out)
        })
        answer.on('end', () => res.end(pending))
        res.on('close', () => answer.destroy())
        return
      }
      res.writeHead(answer.statusCode ?? 502, headers)
      answer.pipe(res)
    })
    upstream.on('error', () => { if (!res.headersSent) res.writeHead(502).end(); else res.destroy() })
    req.pipe(upstream)
  }

  const server: Server = createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://adapter')
    if (!url.pathname.startsWith(PREFIX)) {
      res.writeHead(404).end()
      return
    }
    const name = nameOf(url.pathname)
    if (req.method === 'GET' || req.method === 'HEAD' || req.method === 'OPTIONS') {
      read(req, res, name, url.search)
      return
    }
    write(req, res, name).catch((err: Error) => {
      if (!res.headersSent) res.writeHead(500, { 'content-type': 'text/plain' }).end(err.message)
    })
  })
  // An idle connection is kept a minute, not Node's 5 s: on a loaded machine the suite's fetch may
  // send its next request (a 10 MB append, which it never retries) just as the server closes it.
  server.keepAliveTimeout = 60_000
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as { port: number }
  return {
    url: `http://127.0.0.1:${port}`,
    close: async () => {
      server.closeAllConnections()
      await new Promise<void>((resolve) => server.close(() => resolve()))
      await pool.end()
    }
  }
}
