import { sql, type Expression, type RawBuilder } from 'kysely'
import type { TObject, TSchema } from 'typebox'

/*
 * Postgres builds every response body (see docs/database.md, "How a response is
 * built"): one statement per request reads one snapshot, raw JSON columns
 * pass through byte-for-byte as jsonb prints them (no JSON.parse rounding
 * of large numbers), and timestamps keep their microseconds. The object of
 * each row is derived from the resource's TypeBox schema, so the schema
 * stays the single definition of which fields exist and which are optional.
 * Every body, and the event envelope the stream sends, is built as text by
 * rowJson and its companions below.
 */

/** RFC 3339 in UTC with microseconds, e.g. 2026-11-21T09:28:40.123456Z: exact and sortable as text. */
export function utcTimestamp (value: Expression<unknown>): RawBuilder<string> {
  return sql<string>`to_char(${value} at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')`
}

interface PropertySchema { type?: unknown, format?: unknown, $ref?: unknown }

/** A raw JSON field is a schema with no type at all (Type.Unknown). */
const isRawJson = (schema: PropertySchema) => schema.type === undefined && schema.$ref === undefined
const isNested = (schema: PropertySchema) => schema.$ref !== undefined || schema.type === 'array'

/** Between members, and after each key a space, as jsonb prints objects: the bodies read as they always have. */
const SEPARATOR = ', '

/** The JSON text of a scalar column: to_json escapes it; a raw JSON column is its own text, as jsonb prints it. */
function jsonValue (property: PropertySchema, column: Expression<unknown>): RawBuilder<unknown> {
  if (isRawJson(property)) return sql`${column}`
  if (property.format === 'date-time') return sql`'"' || ${utcTimestamp(column)} || '"'`
  return sql`to_json(${column})`
}

/**
 * The JSON object of one row of `table` (an alias in the query), as text,
 * shaped by `schema`: optional fields are omitted when NULL (never null,
 * never ""), raw JSON columns are copied as stored, timestamps are
 * formatted by utcTimestamp, and the nested fields (arrays, references),
 * which have no column, come from `nested` (an optional one not given is
 * omitted, a required one refused). Concatenated rather than built as
 * jsonb: each value is written once, where jsonb would build, sort, strip
 * and print the object again.
 * An optional field's `, "key": value` piece is NULL when its column is,
 * and concat() leaves NULLs out. Required fields come first, so that the object opens
 * with one and no piece needs its leading separator removed.
 */
export function rowJson (
  schema: TObject,
  table: string,
  nested: Record<string, Expression<unknown>> = {}
): RawBuilder<string> {
  const required = new Set<string>(schema.required ?? [])
  const fields: Array<{ key: string, value: RawBuilder<unknown>, optional: boolean }> = []
  for (const [key, property] of Object.entries(schema.properties as Record<string, TSchema & PropertySchema>)) {
    const given = nested[key]
    if (given !== undefined) {
      fields.push({ key, value: sql`${given}`, optional: false })
      continue
    }
    if (isNested(property)) {
      if (required.has(key)) throw new Error(`rowJson: ${(schema as { $id?: string }).$id ?? 'schema'}.${key} is nested and must be given`)
      continue
    }
    fields.push({ key, value: jsonValue(property, sql.ref(`${table}.${key}`)), optional: !required.has(key) })
  }
  fields.sort((a, b) => Number(a.optional) - Number(b.optional))
  // With no required field at all, every piece has its separator and the first one is cut.
  const cut = fields[0]?.optional ?? false
  const pieces = fields.map((field, i) => {
    const label = sql.lit(`${i === 0 && !cut ? '' : SEPARATOR}${JSON.stringify(field.key)}: `)
    return field.optional ? sql`${label} || ${field.value}` : sql`${label}, ${field.value}`
  })
  if (pieces.length === 0) return sql<string>`'{}'`
  return cut
    ? sql<string>`'{' || substr(concat(${sql.join(pieces)}), ${SEPARATOR.length + 1}) || '}'`
    : sql<string>`concat('{', ${sql.join(pieces)}, '}')`
}

/** A JSON object, as text, of fixed keys whose values are JSON text (never NULL). */
export function jsonObject (entries: Record<string, Expression<unknown>>): RawBuilder<string> {
  const pieces = Object.entries(entries).map(([key, value], i) => sql`${sql.lit(`${i === 0 ? '{' : SEPARATOR}${JSON.stringify(key)}: `)}, ${value}`)
  return sql<string>`concat(${sql.join(pieces)}, '}')`
}

/** A JSON array, as text, of `item` (JSON text) over the rows of a query that pass `filter`, `[]` when there are none. */
export function jsonArray (item: Expression<unknown>, orderBy: RawBuilder<unknown>, filter?: RawBuilder<unknown>): RawBuilder<string> {
  const where = filter === undefined ? sql`` : sql` filter (where ${filter})`
  return sql<string>`coalesce('[' || string_agg(${item}, ${sql.lit(SEPARATOR)} order by ${orderBy})${where} || ']', '[]')`
}
