import { connect, createServer, type Socket } from 'node:net'
import type { Test } from 'tap'

/*
 * A TCP proxy on loopback whose target can move: what a failover does to a
 * database's address (a DNS name or a virtual IP that moves to the promoted
 * standby). Moving it cuts every connection it carries.
 */

export interface MovableAddress {
  /** The proxy's port. */
  port: number
  /** Sends new connections to `port`, and cuts the open ones. */
  moveTo: (port: number) => void
}

export async function movableAddress (t: Test, targetPort: number): Promise<MovableAddress> {
  let target = targetPort
  const open = new Set<Socket>()
  const server = createServer((client) => {
    const upstream = connect(target, '127.0.0.1')
    for (const socket of [client, upstream]) {
      open.add(socket)
      socket.on('error', () => {})
      socket.on('close', () => { open.delete(socket); client.destroy(); upstream.destroy() })
    }
    client.pipe(upstream).pipe(client)
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise<void>((resolve) => {
    for (const socket of open) socket.destroy()
    server.close(() => resolve())
  }))
  return {
    port: (server.address() as { port: number }).port,
    moveTo: (port) => {
      target = port
      for (const socket of open) socket.destroy()
    }
  }
}
