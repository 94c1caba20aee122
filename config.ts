import { envSchema } from 'env-schema'
import { BlockList, createServer, isIP } from 'node:net'
import { Type, type Static, type TObject } from 'typebox'
import { Value } from 'typebox/value'
import { MAX_PAGE_LIMIT } from './schemas/api.ts'

/**
 * Every setting the service reads from its environment, with its default.
 * The README's configuration table mirrors this schema.
 */
export const ConfigSchema = Type.Object({
  DATABASE_URL: Type.Optional(Type.String({
    pattern: '^postgres(ql)?://',
    description: 'Postgres connection URL, postgres://user:password@host:port/database; absent: the embedded database'
  })),
  DATABASE_READ_URL: Type.Optional(Type.String({
    pattern: '^postgres(ql)?://',
    description: 'Where every read goes (a hot standby, say); DATABASE_URL then serves only migrations and the event log\'s keeper'
  })),
  PGLITE_DATA_DIR: Type.String({ default: 'data/pglite', minLength: 1 }),
  PGLITE_PORT: Type.Integer({ default: 0, minimum: 0, maximum: 65535 }),
  HOST: Type.String({
    default: '127.0.0.1',
    minLength: 1,
    description: 'Interface to listen on; one other than loopback serves the network, which needs authentication on or AUTH_MODE=none'
  }),
  PORT: Type.Integer({ default: 8080, minimum: 0, maximum: 65535 }),
  LOG_LEVEL: Type.Enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'], { default: 'info' }),
  DB_POOL_MAX: Type.Integer({ default: 10, minimum: 1, maximum: 1000 }),
  DB_PIPELINED_CONNECTIONS: Type.Integer({
    default: 4,
    minimum: 0,
    maximum: 1000,
    description: 'Connections that carry the API\'s reads several at a time, besides DB_POOL_MAX; 0: those reads take turns on the pool'
  }),
  DB_STATEMENT_TIMEOUT_MS: Type.Integer({ default: 5000, minimum: 1, maximum: 3_600_000 }),
  DB_CONNECT_TIMEOUT_MS: Type.Integer({ default: 5000, minimum: 1, maximum: 600_000 }),
  MIGRATE_ON_START: Type.Boolean({ default: true }),
  RUN_LIST_DEFAULT_LIMIT: Type.Integer({ default: MAX_PAGE_LIMIT, minimum: 1, maximum: MAX_PAGE_LIMIT }),
  EVENTS_POLL_INTERVAL_MS: Type.Integer({ default: 250, minimum: 10, maximum: 60_000 }),
  EVENTS_WAKEUP: Type.Enum(['auto', 'wal', 'off'], {
    default: 'auto',
    description: 'How the event poller learns of new events between polls: wal (a physical replication connection), auto (wal when the database ' +
      'allows it, else polling alone), off (polling alone)'
  }),
  EVENTS_WAKEUP_POLL_INTERVAL_MS: Type.Integer({ default: 1000, minimum: 10, maximum: 60_000 }),
  EVENTS_WINDOW_BYTES: Type.Integer({ default: 33_554_432, minimum: 0, maximum: 17_179_869_184 }),
  EVENTS_KEEPER_INTERVAL_MS: Type.Integer({ default: 1000, minimum: 50, maximum: 60_000 }),
  EVENTS_RETENTION: Type.Optional(Type.String({
    pattern: '^[1-9][0-9]{0,8}[smhd]$',
    description: 'How long events are kept: 90s, 15m, 12h, 30d; absent: forever'
  })),
  SSE_KEEPALIVE_MS: Type.Integer({ default: 15_000, minimum: 100, maximum: 3_600_000 }),
  SSE_RETRY_MS: Type.Integer({ default: 2000, minimum: 0, maximum: 3_600_000 }),
  SSE_MAX_BUFFERED_BYTES: Type.Integer({ default: 1_048_576, minimum: 1024, maximum: 1_073_741_824 }),
  SSE_SLOW_CLIENT_TIMEOUT_MS: Type.Integer({ default: 30_000, minimum: 100, maximum: 3_600_000 }),
  LOG_FORMAT: Type.Enum(['auto', 'json', 'pretty'], { default: 'auto' }),
  SHUTDOWN_GRACE_MS: Type.Integer({ default: 10_000, minimum: 0, maximum: 600_000 }),
  SSE_MAX_STREAMS: Type.Integer({ default: 10_000, minimum: 1, maximum: 1_000_000 }),
  DURABLE_STREAMS_LONG_POLL_MS: Type.Integer({ default: 20_000, minimum: 100, maximum: 60_000 }),
  DURABLE_STREAMS_SSE_MAX_MS: Type.Integer({ default: 60_000, minimum: 100, maximum: 3_600_000 }),
  // Fair limits per caller (docs/operating.md, "Limits per caller"): a caller is a principal, or with authentication off a client's address.
  SSE_MAX_STREAMS_PER_CALLER: Type.Optional(Type.Integer({
    minimum: 1,
    maximum: 1_000_000,
    description: 'Most event streams one caller holds on this process; absent: a quarter of SSE_MAX_STREAMS, at least 1'
  })),
  DURABLE_STREAMS_MAX_LONG_POLLS: Type.Integer({
    default: 10_000,
    minimum: 1,
    maximum: 1_000_000,
    description: 'Most Durable Streams long-polls this process answers at once'
  }),
  DURABLE_STREAMS_MAX_LONG_POLLS_PER_CALLER: Type.Optional(Type.Integer({
    minimum: 1,
    maximum: 1_000_000,
    description: 'Most long-polls one caller holds on this process; absent: a quarter of DURABLE_STREAMS_MAX_LONG_POLLS, at least 1'
  })),
  TRUSTED_PROXIES: Type.String({
    default: '',
    description: 'Proxies whose X-Forwarded-For names the client, comma-separated: addresses, CIDR ranges, or loopback, linklocal, uniquelocal; ' +
      'empty: none (the client is the connection\'s peer)'
  }),
  REQUEST_TIMEOUT_MS: Type.Integer({ default: 30_000, minimum: 1000, maximum: 3_600_000 }),
  CONNECTION_TIMEOUT_MS: Type.Integer({ default: 120_000, minimum: 1000, maximum: 3_600_000 }),
  API_TOKENS: Type.String({
    default: '',
    description: 'Static bearer tokens, comma-separated, each `name:token` (the logs name it) or a bare token (named token-1, token-2... by its ' +
      'place); authentication is on when this or AUTH_ISSUERS is set'
  }),
  AUTH_ISSUERS: Type.String({
    default: '',
    description: 'Identity providers whose JWTs are accepted: a JSON array of {issuer, audience, jwks_uri?, algorithms?, claims?, ui_client_id?} ' +
      '(docs/authentication.md)'
  }),
  AUTH_CLOCK_TOLERANCE_S: Type.Integer({ default: 30, minimum: 0, maximum: 300, description: 'Clock skew allowed when checking a JWT\'s exp, nbf and iat' }),
  AUTH_ALLOW_TOKEN_IN_URL: Type.Boolean({
    default: false,
    description: 'Also accept a long-lived token as ?access_token= on the stream routes. Unsafe: URLs land in browser history, proxy logs and ' +
      'Referer headers; use stream tokens instead'
  }),
  STREAM_TOKEN_TTL_S: Type.Integer({
    default: 300,
    minimum: 10,
    maximum: 86_400,
    description: 'How long a stream token (GET /api/stream-token) opens streams'
  }),
  STREAM_TOKEN_SECRET: Type.Optional(Type.String({
    minLength: 32,
    description: 'The key that signs stream tokens, the same on every replica; absent: a random key the first migration stored in the database'
  })),
  AUTH_MODE: Type.Optional(Type.Literal('none', {
    description: 'none: serve without authentication on an address other than loopback, to anyone who reaches the port (said at start); absent: ' +
      'refuse to start that way'
  })),
  ALLOWED_HOSTS: Type.String({
    default: '',
    description: 'With authentication off, the Host names requests may carry besides localhost, 127.0.0.1, [::1] and HOST (any port), ' +
      'comma-separated; *: any (no defence against DNS rebinding)'
  }),
  CORS_ORIGINS: Type.String({ default: '' }),
  COMPRESS_MIN_BYTES: Type.Integer({ default: 1024, minimum: 0 }),
  MAX_EVENT_LOOP_DELAY_MS: Type.Integer({ default: 1000, minimum: 0 }),
  MAX_HEAP_USED_BYTES: Type.Integer({ default: 0, minimum: 0 }),
  MAX_RSS_BYTES: Type.Integer({ default: 0, minimum: 0 })
})

/** The settings whose default is another's share: loadConfig fills them in (perCallerDefaults). */
type PerCallerLimits = 'SSE_MAX_STREAMS_PER_CALLER' | 'DURABLE_STREAMS_MAX_LONG_POLLS_PER_CALLER'

export type Config = Omit<Static<typeof ConfigSchema>, PerCallerLimits> & Required<Pick<Static<typeof ConfigSchema>, PerCallerLimits>>

/** The demo's own settings (`npm run demo`), beside the service's: docs/development.md. */
export const DemoConfigSchema = Type.Object({
  DEMO_INTERVAL_MS: Type.Integer({ default: 1000, minimum: 10, maximum: 3_600_000, description: 'How often the demo\'s simulated orchestrator writes' })
})

export type DemoConfig = Static<typeof DemoConfigSchema>

/** A comma-separated list variable as its non-empty, trimmed items. */
export function listOf (value: string): string[] {
  return value.split(',').map((item) => item.trim()).filter((item) => item !== '')
}

export class ConfigError extends Error {
  override name = 'ConfigError'
}

/**
 * Settings that were renamed, by their old name: the old one is still read
 * when the new one is not set, with a warning at start (deprecatedSettingsIn).
 */
export const RENAMED_SETTINGS: Readonly<Record<string, keyof Static<typeof ConfigSchema>>> = {
  EVENTS_CLOCK_INTERVAL_MS: 'EVENTS_KEEPER_INTERVAL_MS',
  STREAMS_LONG_POLL_MS: 'DURABLE_STREAMS_LONG_POLL_MS',
  STREAMS_SSE_MAX_MS: 'DURABLE_STREAMS_SSE_MAX_MS',
  STREAMS_MAX_LONG_POLLS: 'DURABLE_STREAMS_MAX_LONG_POLLS',
  STREAMS_MAX_LONG_POLLS_PER_CALLER: 'DURABLE_STREAMS_MAX_LONG_POLLS_PER_CALLER'
}

/** `data` with each renamed setting under its new name; both names with different values are refused. */
function withNewNames (data: Record<string, string | undefined>): Record<string, string | undefined> {
  const renamed = { ...data }
  for (const [old, current] of Object.entries(RENAMED_SETTINGS)) {
    if (renamed[old] === undefined) continue
    if (renamed[current] !== undefined && renamed[current] !== renamed[old]) {
      throw new ConfigError(`invalid configuration: ${old} (deprecated) and ${current} are both set, to different values: set ${current} alone`)
    }
    renamed[current] = renamed[old]
    delete renamed[old]
  }
  return renamed
}

/** One warning for each deprecated setting name set in `env`, for the log at start. */
export function deprecatedSettingsIn (env: NodeJS.ProcessEnv): string[] {
  return Object.entries(RENAMED_SETTINGS).filter(([old]) => env[old] !== undefined && env[old] !== '')
    .map(([old, current]) => `${old} is deprecated: use ${current}`)
}

/** The variables of `schema` read from `env` and validated; a ConfigError names a bad one. */
function fromEnvironment<T> (schema: TObject, env: NodeJS.ProcessEnv): T {
  // An empty variable (`PORT=` in a compose file) means "use the default".
  const data = withNewNames(Object.fromEntries(Object.entries(env).filter(([, value]) => value !== undefined && value !== '')))
  try {
    return envSchema<T>({ schema: structuredClone(schema), data, env: false, dotenv: false })
  } catch (err) {
    throw new ConfigError(`invalid configuration: ${(err as Error).message}`)
  }
}

/**
 * Reads and validates the configuration; a bad or missing value throws a
 * ConfigError whose message names the variable (e.g. `env/PORT must be <= 65535`).
 */
export function loadConfig (env: NodeJS.ProcessEnv = process.env): Config {
  const config = perCallerDefaults(fromEnvironment<Static<typeof ConfigSchema>>(ConfigSchema, env))
  trustedProxiesOf(config)
  // DATABASE_URL is where migrations and the event log's keeper go: reads alone elsewhere would leave both undone.
  if (config.DATABASE_READ_URL !== undefined && config.DATABASE_URL === undefined) {
    throw new ConfigError('invalid configuration: DATABASE_READ_URL needs DATABASE_URL (the primary, for migrations and the event log\'s keeper); ' +
      'to read from a hot standby alone, set DATABASE_URL to it instead')
  }
  // An idle stream writes a keep-alive at least every SSE_KEEPALIVE_MS: the idle-socket timeout must be longer.
  if (config.CONNECTION_TIMEOUT_MS <= config.SSE_KEEPALIVE_MS) {
    throw new ConfigError('invalid configuration: CONNECTION_TIMEOUT_MS must be greater than SSE_KEEPALIVE_MS, or idle event streams would be cut')
  }
  issuersOf(config)
  checkExposure(config)
  return config
}

/** The demo's settings, read and validated as loadConfig does the service's. */
export const loadDemoConfig = (env: NodeJS.ProcessEnv = process.env): DemoConfig => fromEnvironment<DemoConfig>(DemoConfigSchema, env)

/** A failed listen as its reader should see it: a port in use names PORT; anything else is left as it was. */
export function listenFailure (error: unknown, { PORT }: Pick<Config, 'PORT'>): unknown {
  return (error as NodeJS.ErrnoException).code === 'EADDRINUSE' ? new ConfigError(`port ${PORT} is in use: set PORT to another port`) : error
}

/** Listens on HOST:PORT for a moment; rejects as listenFailure says when it cannot. */
export function portFree ({ HOST, PORT }: Pick<Config, 'HOST' | 'PORT'>): Promise<void> {
  return new Promise((resolve, reject) => {
    const server = createServer()
    server.once('error', (error) => reject(listenFailure(error, { PORT })))
    server.listen(PORT, HOST, () => server.close(() => resolve()))
  })
}

/**
 * What `npm run demo` and `npm start` check before they build
 * (scripts/check-settings.ts), so that a bad setting is said at once rather
 * than after the build: the configuration, the demo's own settings when
 * `demo`, and that HOST:PORT is free. Rejects saying what is wrong.
 */
export async function checkSettings (env: NodeJS.ProcessEnv, { demo = false } = {}): Promise<void> {
  const config = loadConfig(env)
  if (demo) loadDemoConfig(env)
  await portFree(config)
}

/** What AUTH_ISSUERS lists: an identity provider whose JWTs are accepted. */
export const IssuerSchema = Type.Object({
  issuer: Type.String({
    pattern: '^https?://',
    description: 'The issuer identifier: the tokens\' `iss`, and where discovery is (/.well-known/openid-configuration) unless jwks_uri is given'
  }),
  audience: Type.Union([Type.String({ minLength: 1 }), Type.Array(Type.String({ minLength: 1 }), { minItems: 1 })], {
    description: 'The `aud` a token must name (one of them)'
  }),
  jwks_uri: Type.Optional(Type.String({ pattern: '^https?://', description: 'Where the issuer\'s keys are, instead of discovery' })),
  algorithms: Type.Optional(Type.Array(
    Type.Enum(['RS256', 'RS384', 'RS512', 'PS256', 'PS384', 'PS512', 'ES256', 'ES384', 'ES512', 'EdDSA']),
    { minItems: 1, description: 'The signature algorithms accepted; default RS256 and ES256' }
  )),
  claims: Type.Optional(Type.Record(
    Type.String({ minLength: 1 }),
    Type.Union([Type.String(), Type.Array(Type.String(), { minItems: 1 })]),
    { description: 'Claims a token must carry: each one equal to the value given, or to one of the values listed (a CI job\'s `repository`, `ref`)' }
  )),
  ui_client_id: Type.Optional(Type.String({
    minLength: 1,
    description: 'The web UI signs in with this issuer, as this OAuth client (authorization code with PKCE)'
  }))
}, { additionalProperties: false })
export type IssuerConfig = Static<typeof IssuerSchema>

/** AUTH_ISSUERS as the issuers it lists; throws a ConfigError naming what is wrong. */
export function issuersOf (config: Pick<Config, 'AUTH_ISSUERS'>): IssuerConfig[] {
  if (config.AUTH_ISSUERS.trim() === '') return []
  let value: unknown
  try {
    value = JSON.parse(config.AUTH_ISSUERS)
  } catch (err) {
    throw new ConfigError(`invalid configuration: AUTH_ISSUERS is not JSON (${(err as Error).message})`)
  }
  const list = Array.isArray(value) ? value : [value]
  list.forEach((item, index) => {
    const error = Value.Errors(IssuerSchema, item)[0]
    if (error !== undefined) throw new ConfigError(`invalid configuration: AUTH_ISSUERS[${index}]${error.instancePath} ${error.message}`)
    for (const field of ['issuer', 'jwks_uri'] as const) {
      const url = (item as IssuerConfig)[field]
      if (url !== undefined && !URL.canParse(url)) throw new ConfigError(`invalid configuration: AUTH_ISSUERS[${index}].${field} is not a URL`)
      if (url !== undefined && !secureUrl(url)) {
        throw new ConfigError(`invalid configuration: AUTH_ISSUERS[${index}].${field} must be https (plain http only on loopback: localhost, ` +
          '127.0.0.0/8, [::1]): the keys that verify tokens must not be open to the network')
      }
    }
  })
  return list as IssuerConfig[]
}

/** Whether a URL is https, or http to this machine (a development identity provider). */
function secureUrl (text: string): boolean {
  const url = new URL(text)
  return url.protocol === 'https:' || url.hostname === 'localhost' || url.hostname === '[::1]' || /^127(\.\d{1,3}){3}$/.test(url.hostname)
}

/** Whether requests to /api and /metrics need a token. */
export function authenticationOn (config: Pick<Config, 'API_TOKENS' | 'AUTH_ISSUERS'>): boolean {
  return listOf(config.API_TOKENS).length > 0 || config.AUTH_ISSUERS.trim() !== ''
}

/** Loopback addresses: what only this machine reaches. */
const LOOPBACK = new BlockList()
LOOPBACK.addSubnet('127.0.0.0', 8, 'ipv4')
LOOPBACK.addAddress('::1', 'ipv6')

/** Whether `host` (a name or an address, an IPv6 one bracketed or not) is loopback: localhost, 127.0.0.0/8 or ::1. */
export function isLoopback (host: string): boolean {
  const name = host.toLowerCase().replace(/^\[(.*)\]$/, '$1')
  const family = isIP(name)
  return name === 'localhost' || (family !== 0 && LOOPBACK.check(name, family === 4 ? 'ipv4' : 'ipv6'))
}

/**
 * Secure by default: authentication off is a choice made explicitly
 * (AUTH_MODE=none) before anything other than this machine may connect,
 * and AUTH_MODE=none beside credentials is a contradiction, refused rather
 * than guessed at. A ConfigError names the settings.
 */
function checkExposure (config: Config): void {
  if (config.AUTH_MODE === 'none' && authenticationOn(config)) {
    throw new ConfigError('invalid configuration: AUTH_MODE=none turns authentication off, but API_TOKENS or AUTH_ISSUERS is set: unset AUTH_MODE ' +
      'to require those credentials, or empty them')
  }
  if (config.AUTH_MODE === undefined && !authenticationOn(config) && !isLoopback(config.HOST)) {
    throw new ConfigError(`invalid configuration: HOST=${config.HOST} serves the network with authentication off (API_TOKENS and AUTH_ISSUERS are empty): ` +
      'set API_TOKENS or AUTH_ISSUERS, or HOST=127.0.0.1 to serve this machine alone, or AUTH_MODE=none to serve the data to anyone who reaches the port')
  }
}

/** The unspecified addresses: HOST listens on every interface, and no client names the service so. */
const ANY_ADDRESS = new Set(['0.0.0.0', '::', '[::]'])

/**
 * The Host names (lowercase, without a port; an IPv6 address bracketed)
 * that a request may carry while authentication is off: loopback's, HOST's
 * and ALLOWED_HOSTS'; undefined when ALLOWED_HOSTS is `*` (any).
 */
export function allowedHostsOf (config: Pick<Config, 'HOST' | 'ALLOWED_HOSTS'>): Set<string> | undefined {
  const listed = listOf(config.ALLOWED_HOSTS)
  if (listed.includes('*')) return undefined
  const host = ANY_ADDRESS.has(config.HOST) ? [] : [isIP(config.HOST) === 6 ? `[${config.HOST}]` : config.HOST]
  return new Set(['localhost', '127.0.0.1', '[::1]', ...host, ...listed].map((name) => name.toLowerCase()))
}

const DURATION_UNIT_MS = { s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 } as const

/** A duration as the configuration writes it (`90s`, `15m`, `12h`, `30d`; checked by ConfigSchema) in milliseconds. */
export function durationMs (text: string): number {
  return Number(text.slice(0, -1)) * DURATION_UNIT_MS[text.slice(-1) as keyof typeof DURATION_UNIT_MS]
}

/**
 * A caller's share of a limit, unless set: a quarter of the instance's, at
 * least 1 (Kubernetes' priority and fairness gives no one flow all the seats
 * either).
 */
const aQuarterOf = (limit: number) => Math.max(1, Math.floor(limit / 4))

/** The configuration with each per-caller limit not given set to its default, a quarter of the instance's. */
function perCallerDefaults (config: Static<typeof ConfigSchema>): Config {
  return {
    ...config,
    SSE_MAX_STREAMS_PER_CALLER: config.SSE_MAX_STREAMS_PER_CALLER ?? aQuarterOf(config.SSE_MAX_STREAMS),
    DURABLE_STREAMS_MAX_LONG_POLLS_PER_CALLER: config.DURABLE_STREAMS_MAX_LONG_POLLS_PER_CALLER ?? aQuarterOf(config.DURABLE_STREAMS_MAX_LONG_POLLS)
  }
}

/** The names Fastify's trustProxy (proxy-addr) knows for ranges of addresses. */
const PROXY_RANGES = new Set(['loopback', 'linklocal', 'uniquelocal'])

/**
 * TRUSTED_PROXIES as Fastify's trustProxy takes it: the proxies whose
 * X-Forwarded-For is believed (false: none, the client is the peer).
 * Throws a ConfigError naming an item that is no address, range or name.
 */
export function trustedProxiesOf (config: Pick<Config, 'TRUSTED_PROXIES'>): string[] | false {
  const proxies = listOf(config.TRUSTED_PROXIES)
  for (const proxy of proxies) {
    const [address, prefix, ...rest] = proxy.split('/')
    const version = isIP(address!)
    const prefixFits = prefix === undefined || (/^\d{1,3}$/.test(prefix) && Number(prefix) <= (version === 4 ? 32 : 128))
    if (!PROXY_RANGES.has(proxy) && (version === 0 || !prefixFits || rest.length > 0)) {
      throw new ConfigError(`invalid configuration: TRUSTED_PROXIES lists ${JSON.stringify(proxy)}, which is no address (10.0.0.5), CIDR range ` +
        '(10.0.0.0/8) or name (loopback, linklocal, uniquelocal)')
    }
  }
  return proxies.length === 0 ? false : proxies
}
