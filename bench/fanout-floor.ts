/*
 * The machine's floor for bench/stream.ts (`--wakeup floor`): a bare
 * node:http server with no database, no framework and no hub, that writes
 * each event it is handed (over IPC, the moment the bench's writer has
 * committed it) to every matching open stream as one ready-made chunk, one
 * write system call per stream, as the prototype of issue 14 did. What the
 * service's delivery costs beyond this is the service's own; what this
 * costs is the machine's (its system calls, its loopback, the client).
 */
import { createServer, type ServerResponse } from 'node:http'

const byRun = new Map<string, Set<ServerResponse>>()
const everyone = new Set<ServerResponse>()

const server = createServer((request, response) => {
  const url = new URL(request.url ?? '/', 'http://floor')
  if (url.pathname !== '/api/events/stream') {
    // /health and /metrics, as bench/stream.ts asks them of the service.
    response.end(url.pathname === '/metrics' ? 'event_wakeup_live 1\n' : 'ok')
    return
  }
  const runId = url.searchParams.get('run_id')
  const listeners = runId === null ? everyone : (byRun.get(runId) ?? byRun.set(runId, new Set()).get(runId)!)
  response.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' })
  response.write('retry: 1000\n\n')
  listeners.add(response)
  response.on('close', () => listeners.delete(response))
})

process.on('message', (message: { id: number, runId: string, json: string } | { probe: string }) => {
  if ('probe' in message) return // bench/service-probe.ts's
  const frame = `id: ${message.id}\ndata: ${message.json}\n\n`
  const chunk = Buffer.from(`${Buffer.byteLength(frame).toString(16)}\r\n${frame}\r\n`)
  for (const response of everyone) response.socket?.write(chunk)
  for (const response of byRun.get(message.runId) ?? []) response.socket?.write(chunk)
})

server.listen(Number(process.env.PORT), '127.0.0.1')
process.on('SIGTERM', () => process.exit(0))
