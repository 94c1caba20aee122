import t from 'tap'

// Run by test/test-runner.test.ts through `npm test`'s runner (test/run.mjs): says which backend it was given.
t.test('the runner chose a backend', async (t) => {
  t.pass(`TEST_BACKEND=${process.env.TEST_BACKEND ?? 'server'}`)
  console.log(`probe: TEST_BACKEND=${process.env.TEST_BACKEND ?? 'server'}`)
})
