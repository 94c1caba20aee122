import { defineConfig } from 'vitest/config'

export default defineConfig({
  test: {
    include: ['test/conformance/suite.spec.ts'],
    testTimeout: 30_000,
    hookTimeout: 30_000,
    // One file; its tests run one after another, as the suite's own CI runs them.
    fileParallelism: false
  }
})
