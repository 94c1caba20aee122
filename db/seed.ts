#!/usr/bin/env node
import { pathToFileURL } from 'node:url'
import { loadConfig } from '../config.ts'
import { withDatabaseUrl } from './embedded.ts'
import { FixtureError, loadFixtureFile } from './fixtures.ts'
import { migrateToLatest } from './migrate.ts'
import { createDb, createJobPool } from './pool.ts'

/**
 * `npm run seed -- <file.json>`: migrates DATABASE_URL (absent: the embedded
 * database in PGLITE_DATA_DIR), then loads the
 * fixture in one transaction (idempotently; a bad fixture writes nothing
 * and is reported by the path of its problem). Exit 1 on failure.
 */
export async function seed (databaseUrl: string, file: string): Promise<string> {
  await migrateToLatest(databaseUrl)
  const db = createDb(createJobPool(databaseUrl, 'ocp-seed'))
  try {
    const { inserted } = await loadFixtureFile(db, file)
    const counts = Object.entries(inserted).filter(([, count]) => count > 0).map(([table, count]) => `${count} ${table}`).join(', ')
    return `seed: loaded ${file}: ${counts || 'nothing new'}`
  } finally {
    await db.destroy()
  }
}

/* c8 ignore start: the command-line entry, exercised through seed() and by npm run seed in the tests */
if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const [file] = process.argv.slice(2)
  if (file === undefined) {
    console.error('usage: [DATABASE_URL=postgres://...] npm run seed -- <fixture.json>  (without DATABASE_URL: the embedded database in PGLITE_DATA_DIR)')
    process.exit(2)
  }
  // loadConfig() inside the chain: a bad setting is one line, as any failure here.
  Promise.resolve().then(() => withDatabaseUrl(loadConfig(), (url) => seed(url, file))).then((message) => console.log(message), (err: unknown) => {
    console.error(err instanceof FixtureError ? `seed: refused, nothing written: ${err.message}` : `seed: ${(err as Error).message}`)
    process.exit(1)
  })
}
/* c8 ignore stop */
