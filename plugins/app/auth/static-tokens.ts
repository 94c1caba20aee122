import { createHash, timingSafeEqual } from 'node:crypto'

const digest = (token: string) => createHash('sha256').update(token).digest()

/**
 * API_TOKENS: long-lived bearer tokens, compared through their SHA-256
 * digests in constant time, against every configured token (so neither
 * which one matched nor how much of one did shows in the time taken).
 */
export class StaticTokens {
  private readonly digests: Buffer[]

  constructor (tokens: string[]) {
    this.digests = tokens.map(digest)
  }

  matches (token: string): boolean {
    const presented = digest(token)
    let valid = false
    for (const candidate of this.digests) valid = timingSafeEqual(presented, candidate) || valid
    return valid
  }
}
