import { createServer } from 'node:net'

/*
 * Small helpers shared by the tests that run real servers, and by the
 * benchmarks (bench/common.ts): so nothing here imports tap.
 */

/**
 * "At once" told apart from "after a wait": a test that checks something
 * did not wait gives the wait it must not take `LONG_WAIT_MS` (or it would
 * hang), and asserts an end within `PROMPTLY_MS`, half of that. A stalled,
 * loaded machine takes seconds where a quiet one takes milliseconds, and
 * must not fail the check; the wrong behaviour still does.
 */
export const LONG_WAIT_MS = 60_000
export const PROMPTLY_MS = LONG_WAIT_MS / 2

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

/**
 * Polls `done` until it holds, or fails after `timeoutMs` saying what it
 * waited for. The default is generous: CI shares two cores among parallel
 * test files, and a wait is only long when something is already wrong.
 */
export async function waitUntil (done: () => boolean | Promise<boolean>, what: string, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (!await done()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)
    await sleep(20)
  }
}

/** A TCP port free on loopback right now. */
export function freePort (): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer().listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number }
      server.close(() => resolve(port))
    })
    server.on('error', reject)
  })
}

/** The URL of database `name` on the same server as `url`. */
export function withDatabase (url: string, name: string): string {
  const parsed = new URL(url)
  parsed.pathname = `/${name}`
  return parsed.toString()
}
