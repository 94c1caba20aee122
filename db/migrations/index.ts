import type { Migration } from 'kysely/migration'
import * as controlPlaneSchema from './0001_control_plane_schema.js'
import * as eventStream from './0002_event_stream.js'
import * as eventOrderWithoutLock from './0003_event_order_without_lock.js'
import * as eventsPartitionedById from './0004_events_partitioned_by_id.js'
import * as eventWritersInlined from './0005_event_writers_inlined.js'
import * as eventsSettledByIndex from './0006_events_settled_by_index.js'
import * as runsStatusIndex from './0007_runs_status_index.js'
import * as eventsCensusBySequenceLock from './0008_events_census_by_sequence_lock.js'
import * as eventsSettledByTheKeeper from './0009_events_settled_by_the_keeper.js'
import * as eventsSettledExactly from './0010_events_settled_exactly.js'
import * as eventsDrawnForReaders from './0011_events_drawn_for_readers.js'
import * as streamTokenKey from './0012_stream_token_key.js'
import * as eventsSettledWithoutPartitionLocks from './0013_events_settled_without_partition_locks.js'
import * as eventsSettledInlined from './0014_events_settled_inlined.js'
import * as eventsForksAndLease from './0015_events_forks_and_lease.js'
import * as summariesDefaultEmpty from './0016_summaries_default_empty.js'
import * as leastPrivilege from './0017_least_privilege.js'
import * as eventsSettleMarkAtSettled from './0018_events_settle_mark_at_settled.js'

/**
 * Every migration, by name; names sort in the order they apply. Listed here
 * rather than read from the folder so that the same list works from the
 * TypeScript sources and from the compiled dist/. A migration is frozen
 * once it has run anywhere: a later one that redefines a function or
 * trigger of an earlier one writes its SQL out again rather than importing
 * it, so that what a migration does never changes after the fact (the
 * copies among these files are on purpose).
 */
export const migrations: Record<string, Migration> = {
  '0001_control_plane_schema': controlPlaneSchema,
  '0002_event_stream': eventStream,
  '0003_event_order_without_lock': eventOrderWithoutLock,
  '0004_events_partitioned_by_id': eventsPartitionedById,
  '0005_event_writers_inlined': eventWritersInlined,
  '0006_events_settled_by_index': eventsSettledByIndex,
  '0007_runs_status_index': runsStatusIndex,
  '0008_events_census_by_sequence_lock': eventsCensusBySequenceLock,
  '0009_events_settled_by_the_keeper': eventsSettledByTheKeeper,
  '0010_events_settled_exactly': eventsSettledExactly,
  '0011_events_drawn_for_readers': eventsDrawnForReaders,
  '0012_stream_token_key': streamTokenKey,
  '0013_events_settled_without_partition_locks': eventsSettledWithoutPartitionLocks,
  '0014_events_settled_inlined': eventsSettledInlined,
  '0015_events_forks_and_lease': eventsForksAndLease,
  '0016_summaries_default_empty': summariesDefaultEmpty,
  '0017_least_privilege': leastPrivilege,
  '0018_events_settle_mark_at_settled': eventsSettleMarkAtSettled
}
