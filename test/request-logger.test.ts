import { pino } from 'pino'
import t from 'tap'
import { requestLogger } from '../plugins/app/request-log.js'
import { buildApp } from '../app.js'
import { testConfig } from './helpers/app.js'

// Each request's logger is made when a line first goes through it (plugins/app/request-log.ts).

function capture (level: string) {
  const lines: Array<Record<string, unknown>> = []
  const parent = pino({ level }, { write: (line: string) => { lines.push(JSON.parse(line)) } })
  let children = 0
  const child = parent.child
  parent.child = function (this: pino.Logger, ...args: Parameters<typeof child>) { children++; return child.apply(this, args) } as typeof child
  return { parent, lines, children: () => children }
}

t.test('a line at a level that is off makes no child; one that is on makes it once, with the bindings', async (t) => {
  const { parent, lines, children } = capture('warn')
  const log = requestLogger(parent, { reqId: 'r-1' }, {})
  log.info('not written')
  log.debug('not written')
  log.trace('not written')
  log.silent('never written')
  t.equal(children(), 0, 'nothing made')
  t.equal(log.level, 'warn')
  t.notOk((log as unknown as pino.Logger).isLevelEnabled('info'))
  log.warn('first')
  log.error({ n: 2 }, 'second')
  log.fatal('third')
  t.equal(children(), 1, 'made once')
  t.same(lines.map((line) => [line.msg, line.reqId]), [['first', 'r-1'], ['second', 'r-1'], ['third', 'r-1']])
  t.equal(lines[1]!.n, 2)
})

t.test('its level can be raised for one request; its children carry both bindings', async (t) => {
  const { parent, lines } = capture('warn')
  const log = requestLogger(parent, { reqId: 'r-2' }, {})
  log.level = 'debug'
  t.equal(log.level, 'debug')
  t.equal(parent.level, 'warn', 'the parent keeps its level')
  log.debug('now written')
  log.child({ part: 'x' }).info('from a child')
  t.same(lines.map((line) => [line.msg, line.reqId, line.part]), [['now written', 'r-2', undefined], ['from a child', 'r-2', 'x']])
})

t.test('a route\'s own log level makes the child at once, at that level', async (t) => {
  const { parent, lines, children } = capture('warn')
  const log = requestLogger(parent, { reqId: 'r-3' }, { level: 'info' })
  t.equal(children(), 1)
  log.info('written at the route\'s level')
  t.equal(lines.length, 1)
})

t.test('in the application: a warning of a request carries its id', async (t) => {
  const lines: Array<{ msg: string, reqId?: string, level: number }> = []
  const app = await buildApp(await testConfig(), { logger: { level: 'warn', stream: { write: (line: string) => { lines.push(JSON.parse(line)) } } } })
  t.teardown(() => app.close())
  app.get('/test/warn', async (request) => {
    request.log.info('off at warn')
    request.log.warn('a warning')
    return { ok: true }
  })
  await app.inject({ url: '/test/warn', headers: { 'x-request-id': 'warn-1' } })
  t.same(lines.filter((line) => line.reqId === 'warn-1').map((line) => line.msg), ['a warning'])
})
