import t from 'tap'
import { Type } from 'typebox'
import { rowObject } from '../db/json.js'

// The guard of the schema-driven SQL projection (its output is tested through every route).

t.test('a required nested field must be given', async (t) => {
  const schema = Type.Object({ id: Type.String(), items: Type.Array(Type.String()) }, { $id: 'Holder' })
  t.throws(() => rowObject(schema, 'h'), /Holder\.items is nested and must be given/)
  t.throws(() => rowObject(Type.Object({ items: Type.Array(Type.String()) }), 'h'), /schema\.items is nested/)
  t.doesNotThrow(() => rowObject(Type.Object({ id: Type.String(), items: Type.Optional(Type.Array(Type.String())) }), 'h'))
  t.doesNotThrow(() => rowObject(Type.Object({ note: Type.Optional(Type.String()) }), 'h'), 'a schema with no required field')
})
