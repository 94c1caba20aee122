import type { Migration } from 'kysely'
import * as controlPlaneSchema from './0001_control_plane_schema.js'
import * as eventStream from './0002_event_stream.js'
import * as eventOrderWithoutLock from './0003_event_order_without_lock.js'
import * as eventsPartitionedById from './0004_events_partitioned_by_id.js'

/**
 * Every migration, by name; names sort in the order they apply. Listed here
 * rather than read from the folder so that the same list works from the
 * TypeScript sources and from the compiled dist/.
 */
export const migrations: Record<string, Migration> = {
  '0001_control_plane_schema': controlPlaneSchema,
  '0002_event_stream': eventStream,
  '0003_event_order_without_lock': eventOrderWithoutLock,
  '0004_events_partitioned_by_id': eventsPartitionedById
}
