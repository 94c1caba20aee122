import { PGlite } from '@electric-sql/pglite'
import { startEmbeddedPostgres } from '../../db/embedded.ts'

/*
 * Run by embedded-processes.test.ts under --trace-wasm-code-gc: PGlite instances made,
 * worked and closed, as a test file does, with (`embedded`) or without
 * (`bare`) the embedded database having started first. V8 prints
 * "[wasm-gc] ..." whenever its Wasm code GC runs.
 */
if (process.argv[2] === 'embedded') await (await startEmbeddedPostgres({ dataDir: 'memory://' })).close()
for (let i = 0; i < 3; i++) {
  const db = await PGlite.create()
  await db.exec(`create table t (id bigserial primary key, v text);
    insert into t (v) select md5(g::text) from generate_series(1, 20000) g;
    create index on t (v)`)
  for (let j = 0; j < 50; j++) await db.query('select count(*), max(v) from t where id > $1', [j * 100])
  await db.close()
}
console.log('churned')
