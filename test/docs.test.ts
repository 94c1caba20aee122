import { readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { ConfigSchema } from '../config.js'
import { ErrorCodes } from '../errors.js'

// The documentation names every setting the code reads: the README's table
// and .env.example stay in step with config.ts.

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const readme = readFileSync(join(root, 'README.md'), 'utf8')
const example = readFileSync(join(root, '.env.example'), 'utf8')

t.test('every configuration variable is documented', async (t) => {
  const variables = Object.keys(ConfigSchema.properties)
  for (const name of variables) {
    t.match(readme, new RegExp(`^\\| \`${name}\` \\|`, 'm'), `README documents ${name}`)
    t.match(example, new RegExp(`^${name}=`, 'm'), `.env.example lists ${name}`)
  }
  const documented = [...readme.matchAll(/^\| `([A-Z_]+)` \|/gm)].map((match) => match[1])
  t.same(documented.filter((name) => !variables.includes(name!)), [], 'and the README documents no variable that does not exist')
})

t.test('every error code is documented, with its status', async (t) => {
  for (const [code, status] of Object.entries(ErrorCodes)) {
    t.match(readme, new RegExp(`^\\| ${status} \\| \`${code}\` \\|`, 'm'), `README's error table has ${status} ${code}`)
  }
})
