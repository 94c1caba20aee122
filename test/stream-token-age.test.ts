import { SignJWT } from 'jose'
import t from 'tap'
import { UnauthorizedError } from '../errors.ts'
import { STREAM_TOKEN_ISSUER, StreamTokens } from '../plugins/app/auth/stream-tokens.ts'

/*
 * A stream token opens streams for STREAM_TOKEN_TTL_S from its iat, whatever
 * its exp says: one forged with the key (which any database login could
 * once read) or signed with a longer exp is refused once older than that.
 */

const SECRET = 's'.repeat(40)
const TTL_S = 60

const tokens = new StreamTokens(async () => SECRET, TTL_S)

async function signed (claims: { iat?: number, exp: number }): Promise<string> {
  const jwt = new SignJWT({ stream: {} }).setProtectedHeader({ alg: 'HS256' }).setIssuer(STREAM_TOKEN_ISSUER).setAudience('urn:ocp-api:streams').setExpirationTime(claims.exp)
  if (claims.iat !== undefined) jwt.setIssuedAt(claims.iat)
  return jwt.sign(new TextEncoder().encode(SECRET))
}

/** Whether verifying `token` is refused as unauthorized. */
async function refused (token: string): Promise<boolean> {
  return tokens.verify(token).then(() => false, (error: unknown) => error instanceof UnauthorizedError)
}

t.test('a stream token older than STREAM_TOKEN_TTL_S is refused even when its exp is later', async (t) => {
  const now = Math.floor(Date.now() / 1000)
  t.same((await tokens.verify(await signed({ iat: now, exp: now + TTL_S }))).scope, {}, 'one of the service\'s own opens')
  t.same((await tokens.verify((await tokens.sign({})).token)).scope, {}, 'as signed by sign()')
  t.same((await tokens.verify(await signed({ iat: now + 2, exp: now + 2 + TTL_S }))).scope, {}, 'one signed by a replica whose clock is a little ahead opens')
  t.ok(await refused(await signed({ iat: now - 10 * TTL_S, exp: now + 10 * 365 * 86_400 })), 'issued ten TTLs ago, expiring in ten years: refused')
  t.ok(await refused(await signed({ exp: now + TTL_S })), 'one without iat: refused, since its age cannot be known')
  t.ok(await refused(await signed({ iat: now + 10 * 365 * 86_400, exp: now + 10 * 365 * 86_400 + TTL_S })), 'issued ten years ahead (its age would never grow past the TTL): refused')
  t.ok(await refused(await signed({ iat: now - TTL_S, exp: now - 1 })), 'past its exp: refused, with no tolerance')
})
