import { createServer } from 'node:net'
import t from 'tap'
import { allowedHostsOf, checkSettings, ConfigError, deprecatedSettingsIn, durationMs, isLoopback, listenFailure, loadConfig, loadDemoConfig, portFree, trustedProxiesOf } from '../config.ts'

const url = 'postgres://postgres@127.0.0.1:5432/postgres'

t.test('without DATABASE_URL the embedded database is used', async (t) => {
  const config = loadConfig({})
  t.notOk('DATABASE_URL' in config)
  t.equal(config.PGLITE_DATA_DIR, 'data/pglite')
})

t.test('a renamed setting: its old name still works, with a warning; both names must agree', async (t) => {
  t.equal(loadConfig({ DATABASE_URL: url, EVENTS_CLOCK_INTERVAL_MS: '200' }).EVENTS_KEEPER_INTERVAL_MS, 200, 'the old name alone is read')
  t.notOk('EVENTS_CLOCK_INTERVAL_MS' in loadConfig({ DATABASE_URL: url, EVENTS_CLOCK_INTERVAL_MS: '200' }), 'under the new name only')
  t.equal(loadConfig({ DATABASE_URL: url, EVENTS_KEEPER_INTERVAL_MS: '300' }).EVENTS_KEEPER_INTERVAL_MS, 300, 'the new name')
  t.equal(loadConfig({ DATABASE_URL: url, EVENTS_CLOCK_INTERVAL_MS: '300', EVENTS_KEEPER_INTERVAL_MS: '300' }).EVENTS_KEEPER_INTERVAL_MS, 300, 'both, agreeing')
  t.throws(() => loadConfig({ DATABASE_URL: url, EVENTS_CLOCK_INTERVAL_MS: '200', EVENTS_KEEPER_INTERVAL_MS: '300' }),
    new ConfigError('invalid configuration: EVENTS_CLOCK_INTERVAL_MS (deprecated) and EVENTS_KEEPER_INTERVAL_MS are both set, to different values: set EVENTS_KEEPER_INTERVAL_MS alone'))
  t.throws(() => loadConfig({ EVENTS_CLOCK_INTERVAL_MS: '10' }), /EVENTS_KEEPER_INTERVAL_MS must be >= 50/, 'validated under its new name')
  t.same(deprecatedSettingsIn({ EVENTS_CLOCK_INTERVAL_MS: '200', EVENTS_KEEPER_INTERVAL_MS: '200' }), ['EVENTS_CLOCK_INTERVAL_MS is deprecated: use EVENTS_KEEPER_INTERVAL_MS'], 'one warning per old name')
  t.same(deprecatedSettingsIn({ EVENTS_CLOCK_INTERVAL_MS: '', EVENTS_KEEPER_INTERVAL_MS: '200' }), [], 'none for an empty old name, nor the new one')
})

t.test('the Durable Streams settings\' old names (STREAMS_*) are read as DURABLE_STREAMS_*', async (t) => {
  const config = loadConfig({ DATABASE_URL: url, STREAMS_LONG_POLL_MS: '1000', STREAMS_SSE_MAX_MS: '2000', STREAMS_MAX_LONG_POLLS: '40', STREAMS_MAX_LONG_POLLS_PER_CALLER: '3' })
  t.same([config.DURABLE_STREAMS_LONG_POLL_MS, config.DURABLE_STREAMS_SSE_MAX_MS, config.DURABLE_STREAMS_MAX_LONG_POLLS, config.DURABLE_STREAMS_MAX_LONG_POLLS_PER_CALLER], [1000, 2000, 40, 3])
  t.equal(loadConfig({ DATABASE_URL: url, STREAMS_MAX_LONG_POLLS: '40' }).DURABLE_STREAMS_MAX_LONG_POLLS_PER_CALLER, 10, 'the per-caller default follows the old name\'s value')
  t.same(deprecatedSettingsIn({ STREAMS_SSE_MAX_MS: '2000', STREAMS_MAX_LONG_POLLS: '40' }),
    ['STREAMS_SSE_MAX_MS is deprecated: use DURABLE_STREAMS_SSE_MAX_MS', 'STREAMS_MAX_LONG_POLLS is deprecated: use DURABLE_STREAMS_MAX_LONG_POLLS'])
})

t.test('defaults', async (t) => {
  t.same(loadConfig({ DATABASE_URL: url }), {
    DATABASE_URL: url,
    PGLITE_DATA_DIR: 'data/pglite',
    PGLITE_PORT: 0,
    HOST: '127.0.0.1',
    PORT: 8080,
    LOG_LEVEL: 'info',
    DB_POOL_MAX: 10,
    DB_PIPELINED_CONNECTIONS: 4,
    DB_STATEMENT_TIMEOUT_MS: 5000,
    DB_CONNECT_TIMEOUT_MS: 5000,
    MIGRATE_ON_START: true,
    RUN_LIST_DEFAULT_LIMIT: 1000,
    EVENTS_POLL_INTERVAL_MS: 250,
    EVENTS_WAKEUP: 'auto',
    EVENTS_WAKEUP_POLL_INTERVAL_MS: 1000,
    EVENTS_WINDOW_BYTES: 33554432,
    EVENTS_KEEPER_INTERVAL_MS: 1000,
    SSE_KEEPALIVE_MS: 15000,
    SSE_RETRY_MS: 2000,
    SSE_MAX_BUFFERED_BYTES: 1048576,
    SSE_SLOW_CLIENT_TIMEOUT_MS: 30000,
    LOG_FORMAT: 'auto',
    SHUTDOWN_GRACE_MS: 10000,
    SSE_MAX_STREAMS: 10000,
    DURABLE_STREAMS_LONG_POLL_MS: 20000,
    DURABLE_STREAMS_SSE_MAX_MS: 60000,
    SSE_MAX_STREAMS_PER_CALLER: 2500,
    DURABLE_STREAMS_MAX_LONG_POLLS: 10000,
    DURABLE_STREAMS_MAX_LONG_POLLS_PER_CALLER: 2500,
    TRUSTED_PROXIES: '',
    REQUEST_TIMEOUT_MS: 30000,
    CONNECTION_TIMEOUT_MS: 120000,
    API_TOKENS: '',
    AUTH_ISSUERS: '',
    AUTH_CLOCK_TOLERANCE_S: 30,
    AUTH_ALLOW_TOKEN_IN_URL: false,
    STREAM_TOKEN_TTL_S: 300,
    ALLOWED_HOSTS: '',
    CORS_ORIGINS: '',
    COMPRESS_MIN_BYTES: 1024,
    MAX_EVENT_LOOP_DELAY_MS: 1000,
    MAX_HEAP_USED_BYTES: 0,
    MAX_RSS_BYTES: 0
  })
})

t.test('values are parsed from their text', async (t) => {
  const config = loadConfig({
    DATABASE_URL: 'postgresql://u:p@db:5432/x',
    PORT: '9090',
    HOST: '127.0.0.1',
    LOG_LEVEL: 'debug',
    DB_POOL_MAX: '3',
    DB_STATEMENT_TIMEOUT_MS: '250',
    DB_CONNECT_TIMEOUT_MS: '100',
    MIGRATE_ON_START: 'false',
    RUN_LIST_DEFAULT_LIMIT: '50'
  })
  t.match(config, { PORT: 9090, HOST: '127.0.0.1', LOG_LEVEL: 'debug', DB_POOL_MAX: 3, DB_STATEMENT_TIMEOUT_MS: 250, MIGRATE_ON_START: false, RUN_LIST_DEFAULT_LIMIT: 50 })
})

t.test('DATABASE_READ_URL: where reads go, beside DATABASE_URL', async (t) => {
  const read = 'postgres://ocp_reader@replica:5432/ocp'
  t.match(loadConfig({ DATABASE_URL: url, DATABASE_READ_URL: read }), { DATABASE_URL: url, DATABASE_READ_URL: read })
  t.notOk('DATABASE_READ_URL' in loadConfig({ DATABASE_URL: url, DATABASE_READ_URL: '' }), 'empty: reads go to DATABASE_URL')
  t.throws(() => loadConfig({ DATABASE_URL: url, DATABASE_READ_URL: 'mysql://x' }), { message: /DATABASE_READ_URL must match/ })
  t.throws(() => loadConfig({ DATABASE_READ_URL: read }), ConfigError, 'not without DATABASE_URL')
  t.throws(() => loadConfig({ DATABASE_READ_URL: read }), { message: /DATABASE_READ_URL needs DATABASE_URL .*set DATABASE_URL to it instead/ })
})

t.test('an empty variable means its default', async (t) => {
  t.equal(loadConfig({ DATABASE_URL: url, PORT: '' }).PORT, 8080)
})

t.test('a bad or missing value is refused, naming the variable', async (t) => {
  const cases: Array<[Record<string, string>, RegExp]> = [
    [{ DATABASE_URL: 'mysql://x' }, /DATABASE_URL/],
    [{ DATABASE_URL: url, PORT: '65536' }, /PORT/],
    [{ DATABASE_URL: url, PORT: 'eighty' }, /PORT/],
    [{ DATABASE_URL: url, LOG_LEVEL: 'loud' }, /LOG_LEVEL/],
    [{ DATABASE_URL: url, DB_POOL_MAX: '0' }, /DB_POOL_MAX/],
    [{ DATABASE_URL: url, DB_STATEMENT_TIMEOUT_MS: '-5' }, /DB_STATEMENT_TIMEOUT_MS/],
    [{ DATABASE_URL: url, DB_CONNECT_TIMEOUT_MS: '1.5' }, /DB_CONNECT_TIMEOUT_MS/],
    [{ DATABASE_URL: url, MIGRATE_ON_START: 'perhaps' }, /MIGRATE_ON_START/],
    [{ DATABASE_URL: url, RUN_LIST_DEFAULT_LIMIT: '5000' }, /RUN_LIST_DEFAULT_LIMIT/],
    [{ DATABASE_URL: url, EVENTS_WAKEUP: 'notify' }, /EVENTS_WAKEUP/],
    [{ DATABASE_URL: url, EVENTS_WAKEUP_POLL_INTERVAL_MS: '5' }, /EVENTS_WAKEUP_POLL_INTERVAL_MS/],
    ...['30', '10x', '0s', '-5s', '1.5h', '10 days', '30D', '1234567890s'].map((value): [Record<string, string>, RegExp] => [{ DATABASE_URL: url, EVENTS_RETENTION: value }, /EVENTS_RETENTION/]),
    [{ DATABASE_URL: url, CONNECTION_TIMEOUT_MS: '10000', SSE_KEEPALIVE_MS: '15000' }, /CONNECTION_TIMEOUT_MS must be greater than SSE_KEEPALIVE_MS/]
  ]
  for (const [env, pattern] of cases) {
    t.throws(() => loadConfig(env), ConfigError, JSON.stringify(env))
    t.throws(() => loadConfig(env), { message: pattern })
  }
})

t.test('a caller\'s share of the streams and long-polls: by default a quarter of the instance\'s, at least 1', async (t) => {
  t.match(loadConfig({ DATABASE_URL: url, SSE_MAX_STREAMS: '100', DURABLE_STREAMS_MAX_LONG_POLLS: '42' }), { SSE_MAX_STREAMS_PER_CALLER: 25, DURABLE_STREAMS_MAX_LONG_POLLS_PER_CALLER: 10 })
  t.match(loadConfig({ DATABASE_URL: url, SSE_MAX_STREAMS: '3', DURABLE_STREAMS_MAX_LONG_POLLS: '1' }), { SSE_MAX_STREAMS_PER_CALLER: 1, DURABLE_STREAMS_MAX_LONG_POLLS_PER_CALLER: 1 }, 'at least 1')
  t.match(loadConfig({ DATABASE_URL: url, SSE_MAX_STREAMS_PER_CALLER: '7', DURABLE_STREAMS_MAX_LONG_POLLS_PER_CALLER: '' }), { SSE_MAX_STREAMS_PER_CALLER: 7, DURABLE_STREAMS_MAX_LONG_POLLS_PER_CALLER: 2500 }, 'set, it is taken as given; empty, the default')
  t.throws(() => loadConfig({ DATABASE_URL: url, DURABLE_STREAMS_MAX_LONG_POLLS_PER_CALLER: '0' }), { message: /DURABLE_STREAMS_MAX_LONG_POLLS_PER_CALLER must be >= 1/ })
})

t.test('TRUSTED_PROXIES: addresses, CIDR ranges and proxy-addr\'s names; anything else is refused, named', async (t) => {
  t.equal(loadConfig({ DATABASE_URL: url, TRUSTED_PROXIES: ' 10.0.0.5, 172.16.0.0/12,::1, fd00::/8 ,loopback,uniquelocal' }).TRUSTED_PROXIES, ' 10.0.0.5, 172.16.0.0/12,::1, fd00::/8 ,loopback,uniquelocal')
  t.same(trustedProxiesOf({ TRUSTED_PROXIES: '10.0.0.5, fd00::/8,loopback' }), ['10.0.0.5', 'fd00::/8', 'loopback'])
  t.equal(trustedProxiesOf({ TRUSTED_PROXIES: '' }), false, 'none: the client is the connection\'s peer')
  for (const bad of ['nginx', '10.0.0.0/33', 'fd00::/129', '10.0.0.0/', '10.0.0.0/8/8', '10.0.0.300', 'all']) {
    t.throws(() => loadConfig({ DATABASE_URL: url, TRUSTED_PROXIES: `127.0.0.1,${bad}` }), { message: `invalid configuration: TRUSTED_PROXIES lists ${JSON.stringify(bad)}, which is no address (10.0.0.5), CIDR range (10.0.0.0/8) or name (loopback, linklocal, uniquelocal)` }, bad)
  }
})

t.test('EVENTS_RETENTION: a duration in seconds, minutes, hours or days; absent keeps every event', async (t) => {
  t.notOk('EVENTS_RETENTION' in loadConfig({ DATABASE_URL: url }), 'absent by default')
  t.notOk('EVENTS_RETENTION' in loadConfig({ DATABASE_URL: url, EVENTS_RETENTION: '' }), 'empty: the default')
  t.equal(loadConfig({ DATABASE_URL: url, EVENTS_RETENTION: '90s' }).EVENTS_RETENTION, '90s')
  t.same(['90s', '15m', '12h', '30d', '10s'].map(durationMs), [90_000, 900_000, 43_200_000, 2_592_000_000, 10_000])
})

t.test('HOST other than loopback with authentication off: refused at start unless AUTH_MODE=none says so', async (t) => {
  const refusal = /^invalid configuration: HOST=0\.0\.0\.0 serves the network with authentication off \(API_TOKENS and AUTH_ISSUERS are empty\): set API_TOKENS or AUTH_ISSUERS, or HOST=127\.0\.0\.1 to serve this machine alone, or AUTH_MODE=none/
  t.throws(() => loadConfig({ DATABASE_URL: url, HOST: '0.0.0.0' }), ConfigError)
  t.throws(() => loadConfig({ DATABASE_URL: url, HOST: '0.0.0.0' }), { message: refusal }, 'the error names the settings')
  for (const host of ['0.0.0.0', '::', '10.1.2.3', 'fd00::1', 'api.example', '128.0.0.1']) {
    t.throws(() => loadConfig({ DATABASE_URL: url, HOST: host }), { message: new RegExp(`^invalid configuration: HOST=${host.replace(/\./g, '\\.')} serves the network`) }, `HOST=${host}: refused`)
    t.match(loadConfig({ DATABASE_URL: url, HOST: host, AUTH_MODE: 'none' }), { HOST: host, AUTH_MODE: 'none' }, `HOST=${host}, AUTH_MODE=none: served`)
    t.match(loadConfig({ DATABASE_URL: url, HOST: host, API_TOKENS: 'secret-token' }), { HOST: host }, `HOST=${host} with API_TOKENS: served`)
  }
  const issuers = JSON.stringify([{ issuer: 'https://idp.example', audience: 'ocp-api' }])
  t.match(loadConfig({ DATABASE_URL: url, HOST: '0.0.0.0', AUTH_ISSUERS: issuers }), { HOST: '0.0.0.0' }, 'with AUTH_ISSUERS: served')
  for (const host of ['127.0.0.1', '127.0.0.2', 'localhost', 'LOCALHOST', '::1', '[::1]', '0:0:0:0:0:0:0:1', '::ffff:127.0.0.1']) {
    t.ok(isLoopback(host), `${host} is loopback`)
    t.equal(loadConfig({ DATABASE_URL: url, HOST: host }).HOST, host, `HOST=${host}: served without authentication or AUTH_MODE`)
  }
  t.throws(() => loadConfig({ DATABASE_URL: url, AUTH_MODE: 'none', API_TOKENS: 'secret-token' }),
    { message: /^invalid configuration: AUTH_MODE=none turns authentication off, but API_TOKENS or AUTH_ISSUERS is set: unset AUTH_MODE/ }, 'AUTH_MODE=none beside credentials: a contradiction, refused')
  t.throws(() => loadConfig({ DATABASE_URL: url, AUTH_MODE: 'off' }), { message: /AUTH_MODE/ }, 'AUTH_MODE is none or unset')
  t.notOk('AUTH_MODE' in loadConfig({ DATABASE_URL: url, AUTH_MODE: '' }), 'empty: unset')
})

t.test('the Host names answered with authentication off: loopback\'s, HOST\'s and ALLOWED_HOSTS\', or any with *', async (t) => {
  const names = (env: Record<string, string>) => { const set = allowedHostsOf(loadConfig({ DATABASE_URL: url, AUTH_MODE: 'none', ...env })); return set === undefined ? set : [...set] }
  t.same(names({}), ['localhost', '127.0.0.1', '[::1]'], 'by default, loopback\'s')
  t.same(names({ HOST: '0.0.0.0' }), ['localhost', '127.0.0.1', '[::1]'], 'HOST on every interface names nothing')
  t.same(names({ HOST: '::' }), ['localhost', '127.0.0.1', '[::1]'], 'nor on every IPv6 interface')
  t.same(names({ HOST: '10.1.2.3' }), ['localhost', '127.0.0.1', '[::1]', '10.1.2.3'], 'HOST an address: that address')
  t.same(names({ HOST: 'FD00::1' }), ['localhost', '127.0.0.1', '[::1]', '[fd00::1]'], 'an IPv6 one bracketed, lowercase')
  t.same(names({ HOST: '0.0.0.0', ALLOWED_HOSTS: 'API.example, ocp.internal ,' }), ['localhost', '127.0.0.1', '[::1]', 'api.example', 'ocp.internal'], 'ALLOWED_HOSTS adds names')
  t.equal(names({ ALLOWED_HOSTS: 'api.example,*' }), undefined, '* allows any Host')
})

t.test('the demo\'s settings are read and checked as the service\'s', async (t) => {
  t.same(loadDemoConfig({}), { DEMO_INTERVAL_MS: 1000 })
  t.equal(loadDemoConfig({ DEMO_INTERVAL_MS: '250' }).DEMO_INTERVAL_MS, 250)
  t.throws(() => loadDemoConfig({ DEMO_INTERVAL_MS: 'soon' }), { message: /^invalid configuration: env\/DEMO_INTERVAL_MS must be integer/ })
})

t.test('before npm run demo and npm start build: the settings, and a port in use named by PORT', async (t) => {
  const taken = createServer()
  await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve))
  t.teardown(() => taken.close())
  const { port } = taken.address() as { port: number }
  const inUse = `port ${port} is in use: set PORT to another port`
  await t.rejects(portFree({ HOST: '127.0.0.1', PORT: port }), new ConfigError(inUse))
  await t.resolves(portFree({ HOST: '127.0.0.1', PORT: 0 }), 'a free port')
  const other = Object.assign(new Error('listen EACCES: permission denied'), { code: 'EACCES' })
  t.equal(listenFailure(other, { PORT: 80 }), other, 'any other failure as it was')

  await t.rejects(checkSettings({ DATABASE_URL: url, HOST: '127.0.0.1', PORT: String(port) }), { message: inUse })
  await t.rejects(checkSettings({ DATABASE_URL: url, PORT: '99999' }), { message: /PORT must be <= 65535/ })
  await t.rejects(checkSettings({ HOST: '127.0.0.1', PORT: '0', DEMO_INTERVAL_MS: 'soon' }, { demo: true }), { message: /DEMO_INTERVAL_MS must be integer/ })
  await t.resolves(checkSettings({ HOST: '127.0.0.1', PORT: '0', DEMO_INTERVAL_MS: 'soon' }), 'npm start reads no demo setting')
})
