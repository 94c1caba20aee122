import { createHash, timingSafeEqual } from 'node:crypto'

const digest = (token: string) => createHash('sha256').update(token).digest()

/** A static token and the name the logs know it by. */
export interface NamedToken { name: string, token: string }

/** A token's name as API_TOKENS gives it (`name:token`): what a log line may show. */
const NAMED = /^([A-Za-z0-9._-]{1,64}):(.+)$/

/**
 * API_TOKENS' items as named tokens: `name:token`, or a bare token (the
 * older form), named by its place in the list: `token-1`, `token-2`...
 */
export function namedTokens (items: string[]): NamedToken[] {
  return items.map((item, index) => {
    const named = NAMED.exec(item)
    return named === null ? { name: `token-${index + 1}`, token: item } : { name: named[1]!, token: named[2]! }
  })
}

/**
 * API_TOKENS: long-lived bearer tokens, compared through their SHA-256
 * digests in constant time, against every configured token (so neither
 * which one matched nor how much of one did shows in the time taken).
 */
export class StaticTokens {
  private readonly digests: Array<{ name: string, digest: Buffer }>

  constructor (tokens: NamedToken[]) {
    this.digests = tokens.map(({ name, token }) => ({ name, digest: digest(token) }))
  }

  /** The name of the token presented, or undefined when it is none of them. */
  matches (token: string): string | undefined {
    const presented = digest(token)
    let matched: string | undefined
    for (const candidate of this.digests) if (timingSafeEqual(presented, candidate.digest)) matched = candidate.name
    return matched
  }
}
