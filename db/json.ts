import { sql, type Expression, type RawBuilder } from 'kysely'
import type { TObject, TSchema } from 'typebox'

/*
 * Postgres builds every response body (see README, "How a response is
 * built"): one statement per request reads one snapshot, raw JSON columns
 * pass through byte-for-byte as jsonb prints them (no JSON.parse rounding
 * of large numbers), and timestamps keep their microseconds. The object of
 * each row is derived from the resource's TypeBox schema, so the schema
 * stays the single definition of which fields exist and which are optional.
 */

/** RFC 3339 in UTC with microseconds, e.g. 2026-11-21T09:28:40.123456Z: exact and sortable as text. */
export function utcTimestamp (value: Expression<unknown>): RawBuilder<string> {
  return sql<string>`to_char(${value} at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')`
}

interface PropertySchema { type?: unknown, format?: unknown, $ref?: unknown }

/** A raw JSON field is a schema with no type at all (Type.Unknown). */
const isRawJson = (schema: PropertySchema) => schema.type === undefined && schema.$ref === undefined
const isNested = (schema: PropertySchema) => schema.$ref !== undefined || schema.type === 'array'

const pair = (key: string, value: Expression<unknown>) => sql`${sql.lit(key)}, ${value}`

/**
 * The JSON object of one row of `table` (an alias in the query), shaped by
 * `schema`: optional fields are omitted when NULL (never null, never ""),
 * raw JSON columns are copied as stored, timestamps are formatted by
 * utcTimestamp. Nested fields (arrays, references) come from `nested`;
 * an optional nested field not given there is omitted.
 */
export function rowObject (
  schema: TObject,
  table: string,
  nested: Record<string, Expression<unknown>> = {}
): RawBuilder<unknown> {
  const required = new Set<string>(schema.required ?? [])
  const scalars: RawBuilder<unknown>[] = []
  const verbatim: RawBuilder<unknown>[] = []
  let hasOptionalScalar = false
  for (const [key, property] of Object.entries(schema.properties as Record<string, TSchema & PropertySchema>)) {
    const given = nested[key]
    if (given !== undefined) {
      verbatim.push(pair(key, given))
      continue
    }
    if (isNested(property)) {
      if (required.has(key)) throw new Error(`rowObject: ${(schema as { $id?: string }).$id ?? 'schema'}.${key} is nested and must be given`)
      continue
    }
    const column = sql.ref(`${table}.${key}`)
    if (isRawJson(property)) {
      verbatim.push(pair(key, column))
    } else {
      scalars.push(pair(key, property.format === 'date-time' ? utcTimestamp(column) : column))
      hasOptionalScalar ||= !required.has(key)
    }
  }
  // Strip before adding raw JSON, so a null inside a raw value is kept.
  let object = sql`jsonb_build_object(${sql.join(scalars)})`
  if (hasOptionalScalar) object = sql`jsonb_strip_nulls(${object})`
  return verbatim.length === 0 ? object : sql`(${object} || jsonb_build_object(${sql.join(verbatim)}))`
}

/** A JSON array of `item` over the rows of a query, `[]` when there are none. */
export function jsonArray (item: Expression<unknown>, orderBy: RawBuilder<unknown>): RawBuilder<unknown> {
  return sql`coalesce(json_agg(${item} order by ${orderBy}), '[]'::json)`
}
