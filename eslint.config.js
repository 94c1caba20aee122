// `npm run lint`: neostandard (standard style, TypeScript included) checks and
// formats the code; `npm run lint:fix` applies what it can fix.
import comments from '@eslint-community/eslint-plugin-eslint-comments/configs'
import neostandard, { resolveIgnoresFromGitignore } from 'neostandard'

export default [
  ...neostandard({
    ts: true,
    ignores: [
      // Build output, coverage, tap's state (.gitignore), and the client's
      // types, generated from the schemas by client/scripts/generate-types.ts.
      ...resolveIgnoresFromGitignore(),
      'client/src/types.ts'
    ]
  }),
  {
    rules: {
      // `void promise;` marks a promise deliberately left to run on its own.
      'no-void': ['error', { allowAsStatement: true }]
    }
  },
  {
    // The service's lines stay readable in a review: a long description is
    // joined from parts ('…' + '…'). Not held to it: tests, benchmarks, the
    // client and the UI; migrations, which are never edited (db/README.md).
    ignores: [
      'bench/**', 'client/**', 'test/**', 'ui/**', 'db/migrations/**'
    ],
    rules: {
      'max-len': ['error', { code: 160 }]
    }
  },
  // An eslint-disable names its rules and says why: `-- the reason`.
  comments.recommended,
  {
    linterOptions: { reportUnusedDisableDirectives: 'error' },
    rules: {
      '@eslint-community/eslint-comments/require-description': ['error', { ignore: ['eslint-enable'] }]
    }
  }
]
