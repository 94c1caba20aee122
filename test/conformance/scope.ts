/*
 * Which tests of the official conformance suite are about the read path
 * this service serves, and which of those cannot apply to it, each with
 * its reason (test/conformance.test.ts runs them). Writes (create, append,
 * delete, closing, sequences, producers, TTL, forks) are the
 * orchestrator's, never a client's: their tests are out of scope as a
 * whole, by block. A name here is the test's describe blocks and title,
 * joined by ' > '.
 *
 * The suite creates most of its streams as text/plain, some as binary: the
 * adapter holds what they append as bytes (adapter.ts), so their tests
 * check this service's offsets, statuses, headers and SSE framing, and the
 * adapter's encoding of bytes; none of them needs to be left out.
 */

/** Blocks whose tests read: every test in them is in scope, but for WRITE_TESTS. */
export const READ_BLOCKS = new Set([
  'Read Operations',
  'Long-Poll Operations',
  'HTTP Protocol',
  'Browser Security Headers',
  'Content-Type Validation',
  'HEAD Metadata',
  'Offset Validation and Resumability',
  'Protocol Edge Cases',
  'Long-Poll Edge Cases',
  'Caching and ETag',
  'Chunking and Large Payloads',
  'Read-Your-Writes Consistency',
  'SSE Mode',
  'JSON Mode',
  // Of 'Property-Based Tests (fast-check)': random appends checked by reads.
  'Byte-Exactness Property',
  'Operation Sequence Properties',
  'Immutability Properties',
  'Offset Validation Properties'
])

/** Tests of those blocks that are about a write's answer, not a read. */
const WRITE_TESTS = [
  /on PUT|on POST|on DELETE|PUT with|POST with|POST to|POST body|DELETE non-existent|successful DELETE/i,
  /sequence ordering|seq ordering|duplicate seq|seq values|case-sensitive seq/i,
  /content-type mismatch|content-type match on append|append with matching content-type|reject missing Content-Type|PUT without Content-Type|Location header/i,
  /reject invalid JSON|reject empty JSON arrays|idempotent PUT|different config/i
]

/** A vitest name pattern for the read blocks: the suite's other tests (writes, TTL, forks: minutes of them) do not run. */
export const READ_BLOCKS_PATTERN = `^(Property-Based Tests \\(fast-check\\) )?(${[...READ_BLOCKS].map((block) => block.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('|')}) `

export function isReadPath (blocks: string[], title: string): boolean {
  if (!blocks.some((block) => READ_BLOCKS.has(block))) return false
  return !WRITE_TESTS.some((pattern) => pattern.test(title))
}

/** Tests of the read path that cannot apply here, and why. */
export const EXCLUDED = new Map<string, string>([
])
