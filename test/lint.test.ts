import { ESLint } from 'eslint'
import t from 'tap'
import { root } from './helpers/run.ts'

// What `npm run lint` (eslint.config.js) holds the code to; CI runs it over
// the whole repository. These check the settings themselves.

const eslint = new ESLint({ cwd: root })

/** The problems ESLint finds in `code`, were it the file at `path`: each its rule (null for a directive's own problem) and message. */
async function problems (code: string, path: string) {
  const [result] = await eslint.lintText(code, { filePath: `${root}/${path}` })
  return result!.messages.map((message) => ({ rule: message.ruleId, message: message.message }))
}

const longLine = `export const description = '${'x'.repeat(140)}'\n`

t.test('standard style: a semicolon is an error, in TypeScript too', async (t) => {
  t.match(await problems("export const a = 'a';\n", 'routes/example.ts'), [{ rule: '@stylistic/semi' }])
  t.same(await problems("export const a = 'a'\n", 'routes/example.ts'), [])
})

t.test('a service line is at most 160 characters; tests, benchmarks, client, UI and migrations are not held to it', async (t) => {
  t.equal(longLine.length - 1, 169)
  for (const path of ['routes/example.ts', 'events/example.ts', 'config.ts']) {
    t.match(await problems(longLine, path), [{ rule: 'max-len' }], path)
  }
  for (const path of ['test/example.test.ts', 'bench/example.ts', 'client/src/example.ts', 'ui/example.ts', 'db/migrations/9999_example.ts']) {
    t.same(await problems(longLine, path), [], path)
  }
})

t.test('an eslint-disable says why, and disables something', async (t) => {
  t.match(await problems('new Date() // eslint-disable-line no-new\n', 'routes/example.ts'),
    [{ rule: '@eslint-community/eslint-comments/require-description' }])
  t.same(await problems('new Date() // eslint-disable-line no-new -- made for its side effect\n', 'routes/example.ts'), [])
  t.match(await problems('export const a = 1 // eslint-disable-line no-new -- nothing to disable\n', 'routes/example.ts'),
    [{ rule: null, message: /Unused eslint-disable directive/ }])
})

t.test('`void promise;` is allowed as a statement only', async (t) => {
  t.same(await problems('void Promise.resolve()\n', 'routes/example.ts'), [])
  t.match(await problems('export const a = void 0\n', 'routes/example.ts'), [{ rule: 'no-void' }])
})

t.test('build output, coverage and the generated client types are not linted', async (t) => {
  for (const path of ['dist/app.js', 'ui/build/app.js', 'coverage/x.js', '.tap/x.js', 'client/src/types.ts']) {
    t.ok(await eslint.isPathIgnored(`${root}/${path}`), path)
  }
  t.notOk(await eslint.isPathIgnored(`${root}/client/src/client.ts`))
})
