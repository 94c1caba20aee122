/*
 * The plans of the hot statements (bench/sql), at one or both scales:
 * EXPLAIN (ANALYZE, BUFFERS) of each, run the way the service and pgbench
 * run it: as a prepared statement, executed a few times first, so that the
 * plan shown is the one Postgres settled on (its generic plan, typically)
 * and the buffers are those of a warm cache.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm run bench:explain -- --scale both
 *   ... npm run bench:explain -- --scale large --only run200 --costs     (one plan, with the planner's estimates)
 *
 * Prints each plan, then a table: planning and execution time, buffers
 * touched, and the largest number of rows any scan node read, which must
 * not grow with the scale (no statement may scan a whole table).
 */
import { parseArgs } from 'node:util'
import pg from 'pg'
import { adminUrl, defaultDatabaseFor, formatInt, isScaleName, readMarker, withDatabase, type ScaleName, type Targets } from './common.ts'
import { generate } from './generate.ts'
import { readFloorStatement, STATEMENTS, writeFloorStatements } from './sql.ts'
import { nodeRowsRead, planNodes, type PlanNode } from '../test/helpers/plans.ts'

const { values: args } = parseArgs({
  options: {
    scale: { type: 'string', default: 'small' },
    only: { type: 'string' },
    costs: { type: 'boolean', default: false },
    quiet: { type: 'boolean', default: false }
  }
})
const scales = args.scale === 'both' ? ['small', 'large'] : [args.scale]
if (!scales.every(isScaleName)) {
  console.error('usage: npm run bench:explain -- [--scale small|large|both] [--only runs,run10,run200,blocked,thread] [--costs] [--quiet]')
  process.exit(2)
}

interface Case { key: string, label: string, file: string, variables: (targets: Targets) => Record<string, string> }

const CASES: Case[] = [
  { key: 'runs', label: 'listRuns (default page)', file: STATEMENTS.listRuns!.file, variables: STATEMENTS.listRuns!.variables },
  { key: 'run10', label: 'getRunDetail (10 tasks)', file: STATEMENTS.getRunDetail!.file, variables: (targets) => ({ ...STATEMENTS.getRunDetail!.variables(targets), run_id: targets.run10 }) },
  { key: 'run200', label: 'getRunDetail (200 tasks)', file: STATEMENTS.getRunDetail!.file, variables: STATEMENTS.getRunDetail!.variables },
  { key: 'blocked', label: 'listBlockedTasks (200 tasks)', file: STATEMENTS.listBlockedTasks!.file, variables: STATEMENTS.listBlockedTasks!.variables },
  { key: 'thread', label: 'getThreadDetail (200 messages)', file: STATEMENTS.getThreadDetail!.file, variables: STATEMENTS.getThreadDetail!.variables }
]
const only = args.only === undefined ? undefined : new Set(args.only.split(','))

/** Rows read by the scan nodes of a plan, the largest of them, and any sequential scan. */
function scans (root: PlanNode) {
  const found = { largest: 0, where: '', seqScans: [] as string[] }
  for (const node of planNodes(root)) {
    const relation = node['Relation Name']
    if (!(node['Node Type'] ?? '').includes('Scan') || relation === undefined) continue
    const rows = nodeRowsRead(node)
    if (rows > found.largest) { found.largest = rows; found.where = `${node['Node Type']} on ${relation}${node['Index Name'] ? ` (${node['Index Name']})` : ''}` }
    if (node['Node Type'] === 'Seq Scan') found.seqScans.push(relation)
  }
  return found
}

async function explainScale (scale: ScaleName): Promise<string[][]> {
  const database = defaultDatabaseFor(scale)
  const url = withDatabase(adminUrl(), database)
  const marker = (await readMarker(url)) ?? await generate({ scale, database, seed: 1, force: false })
  await writeFloorStatements(marker.targets)
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  await client.query('set TimeZone = UTC')
  const rows: string[][] = []
  try {
    for (const item of CASES.filter((candidate) => only === undefined || only.has(candidate.key))) {
      const { text, values } = readFloorStatement(item.file, item.variables(marker.targets))
      await client.query('deallocate all')
      await client.query(`prepare hot as ${text}`)
      const execute = `execute hot(${values.map((value) => client.escapeLiteral(value)).join(', ')})`
      for (let run = 0; run < 6; run++) await client.query(execute)
      const options = `analyze, buffers${args.costs ? '' : ', costs off'}`
      const plan = await client.query(`explain (${options}) ${execute}`)
      const json = await client.query(`explain (analyze, buffers, format json) ${execute}`)
      const summary = json.rows[0]['QUERY PLAN'][0] as { Plan: PlanNode & { 'Shared Hit Blocks': number, 'Shared Read Blocks': number }, 'Planning Time': number, 'Execution Time': number }
      const found = scans(summary.Plan)
      if (!args.quiet) {
        console.log(`\n#### ${item.label}, scale ${scale} (bench/sql/${item.file}, ${Object.entries(item.variables(marker.targets)).map(([name, value]) => `${name}=${value}`).join(' ')})\n`)
        console.log('```')
        console.log(plan.rows.map((row) => row['QUERY PLAN']).join('\n'))
        console.log('```')
      }
      rows.push([
        item.label, scale,
        summary['Planning Time'].toFixed(2), summary['Execution Time'].toFixed(2),
        formatInt(summary.Plan['Shared Hit Blocks'] + summary.Plan['Shared Read Blocks']),
        `${formatInt(found.largest)} (${found.where})`,
        found.seqScans.length === 0 ? 'none' : found.seqScans.join(', ')
      ])
    }
  } finally {
    await client.end()
  }
  return rows
}

async function main () {
  const rows: string[][] = []
  for (const scale of scales as ScaleName[]) rows.push(...await explainScale(scale))
  console.log('\n| statement | scale | planning ms | execution ms | buffers | most rows read by one scan node | sequential scans |')
  console.log('| --- | --- | ---: | ---: | ---: | --- | --- |')
  for (const row of rows) console.log(`| ${row.join(' | ')} |`)
}

main().catch((err: unknown) => {
  console.error(err)
  process.exit(1)
})
