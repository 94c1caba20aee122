import type pg from 'pg'
import { listRuns, type PageKey, type RunFilters } from '../../db/queries.ts'

/** A node of an EXPLAIN (FORMAT JSON) plan, with the fields the tests and bench:explain read. */
export interface PlanNode {
  'Node Type'?: string
  'Relation Name'?: string
  'Index Name'?: string
  'Actual Rows'?: number
  'Actual Loops'?: number
  'Rows Removed by Filter'?: number
  Plans?: PlanNode[]
}

/** The statement listRuns sends for a page, with its parameter values, taken from a pool that records instead of sending. */
async function listRunsStatement (page: RunFilters & { limit: number, after?: PageKey }) {
  let sent: { text: string, values: unknown[] } | undefined
  const recorder = {
    connect: async () => ({
      query: async (config: { text: string, values: unknown[] }) => {
        sent = config
        return { rows: [{ body: '{"runs": []}', next_created_at: null, next_id: null, event_cursor: '0' }] }
      },
      release () {}
    })
  }
  await listRuns(recorder as unknown as pg.Pool, page, 0)
  return sent!
}

/**
 * Every node of the EXPLAIN ANALYZE of listRuns's statement for `page`,
 * prepared under `mode` (the service prepares it, so it may run its
 * generic plan).
 */
export async function listRunsPlan (db: pg.Client, page: RunFilters & { limit: number, after?: PageKey }, mode: 'force_custom_plan' | 'force_generic_plan'): Promise<PlanNode[]> {
  const { text, values } = await listRunsStatement(page)
  const literal = (value: unknown): string => Array.isArray(value)
    ? `array[${value.map(literal).join(', ')}]::text[]`
    : typeof value === 'number' ? String(value) : db.escapeLiteral(String(value))
  await db.query(`set plan_cache_mode = ${mode}`)
  await db.query(`prepare page as ${text}`)
  try {
    const { rows: [plan] } = await db.query(`explain (analyze, format json) execute page(${values.map(literal).join(', ')})`)
    return planNodes(plan['QUERY PLAN'][0].Plan)
  } finally {
    await db.query('deallocate page')
  }
}

/** A plan's nodes, the root first, then each child's, depth first. */
export const planNodes = (node: PlanNode): PlanNode[] => [node, ...(node.Plans ?? []).flatMap(planNodes)]

/** Rows a node read (returned or filtered out), over all its loops. */
export const nodeRowsRead = (node: PlanNode) => ((node['Actual Rows'] ?? 0) + (node['Rows Removed by Filter'] ?? 0)) * (node['Actual Loops'] ?? 1)

/** Rows of `relation` that a plan's scans read, over all their loops. */
export const rowsRead = (plan: PlanNode[], relation: string) => plan
  .filter((node) => node['Relation Name'] === relation)
  .reduce((sum, node) => sum + nodeRowsRead(node), 0)
