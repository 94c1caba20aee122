import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { Type } from 'typebox'
import { authenticationOn } from '../../config.ts'
import { callerOf } from '../../plugins/app/auth/index.ts'
import { NO_STORE } from '../../plugins/app/http-cache.ts'
import { commonErrors, errorResponse, StreamTokenQuery } from '../../schemas/api.ts'

/** What signing out clears in the browser: the answers it cached, and the origin's storage (the UI's token). */
const CLEAR_SESSION = '"cache", "storage"'

/*
 * Authentication's own routes (docs/authentication.md): how to sign in,
 * and the stream tokens that open a stream from a URL.
 */
const authRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const required = authenticationOn(app.config)

  app.get('/auth', {
    config: { public: true },
    schema: {
      operationId: 'getAuth',
      security: [],
      tags: ['auth'],
      summary: 'Whether a token is required, and the identity provider to sign in with',
      description: 'Never needs a token. `sign_in` names the identity provider the web UI signs in with (authorization code with PKCE), when ' +
        'AUTH_ISSUERS gives one a ui_client_id.',
      response: {
        200: { ...Type.Ref('AuthInfo', { description: 'How to authenticate' }), headers: { 'cache-control': Type.String({ description: '`no-store`' }) } },
        400: commonErrors[400],
        421: commonErrors[421],
        500: commonErrors[500],
        503: errorResponse('`unavailable`: the identity provider\'s discovery document could not be fetched')
      }
    }
  }, async (_request, reply) => {
    const signIn = required ? await app.jwtIssuers.signIn() : null
    return reply.header('cache-control', NO_STORE).send({ required, sign_in: signIn })
  })

  app.get('/auth/sign-out', {
    config: { public: true },
    schema: {
      operationId: 'signOut',
      tags: ['auth'],
      security: [],
      summary: 'Clears what the browser keeps of a signed-in session',
      description: 'Never needs a token, and changes nothing on the service. Answers `Clear-Site-Data: "cache", "storage"`: the browser drops ' +
        'every answer of this origin it cached (read with the token now signed out) and this origin\'s storage (the token the web UI keeps). The ' +
        'web UI asks for it when it signs out. Not sent to a request from another site (`Sec-Fetch-Site: cross-site` or `same-site`): no other ' +
        'page can sign a user out.',
      response: {
        204: Type.Null({
          description: 'Done',
          headers: {
            'clear-site-data': Type.String({
              description: '`"cache", "storage"`; absent for a request from another site'
            }),
            'cache-control': Type.String({ description: '`no-store`' })
          }
        }),
        400: commonErrors[400],
        421: commonErrors[421],
        500: commonErrors[500]
      }
    }
  }, async (request, reply) => {
    const site = request.headers['sec-fetch-site']
    if (site !== 'cross-site' && site !== 'same-site') reply.header('clear-site-data', CLEAR_SESSION)
    return reply.code(204).header('cache-control', NO_STORE).send()
  })

  app.get('/stream-token', {
    schema: {
      operationId: 'getStreamToken',
      tags: ['auth'],
      summary: 'A short-lived token that opens one stream from its URL',
      description: 'For clients that cannot send headers (a browser EventSource): pass `token` as `stream_token` in the URL of /api/events/stream ' +
        'or a /api/streams route, instead of a long-lived token. It opens the streams its scope covers (the filters given here; ' +
        `none: every stream) until \`expires_at\` (STREAM_TOKEN_TTL_S, ${app.config.STREAM_TOKEN_TTL_S} s here); a stream open then stays open, ` +
        "and a reconnect after it gets a 401: get a new token and reconnect. Asked for with the caller's own credentials; a stream token cannot " +
        'ask for another.',
      querystring: StreamTokenQuery,
      response: {
        200: {
          ...Type.Ref('StreamToken', {
            description: 'The token and what it opens'
          }),
          headers: { 'cache-control': Type.String({ description: '`no-store`' }) }
        },
        ...commonErrors
      }
    }
  }, async (request, reply) => {
    const { run_id: runId, thread_id: threadId } = request.query
    const scope = { ...(runId === undefined ? {} : { run_id: runId }), ...(threadId === undefined ? {} : { thread_id: threadId }) }
    const token = await app.streamTokens.sign(scope, request.principal === undefined ? undefined : callerOf(request.principal))
    return reply.header('cache-control', NO_STORE).send(token)
  })
}

export default authRoutes
