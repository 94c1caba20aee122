import type { Migration } from 'kysely/migration'
import * as controlPlaneSchema from './0001_control_plane_schema.ts'
import * as eventStream from './0002_event_stream.ts'
import * as eventOrderWithoutLock from './0003_event_order_without_lock.ts'
import * as eventsPartitionedById from './0004_events_partitioned_by_id.ts'
import * as eventWritersInlined from './0005_event_writers_inlined.ts'
import * as eventsSettledByIndex from './0006_events_settled_by_index.ts'
import * as runsStatusIndex from './0007_runs_status_index.ts'
import * as eventsCensusBySequenceLock from './0008_events_census_by_sequence_lock.ts'
import * as eventsSettledByTheKeeper from './0009_events_settled_by_the_keeper.ts'
import * as eventsSettledExactly from './0010_events_settled_exactly.ts'
import * as eventsDrawnForReaders from './0011_events_drawn_for_readers.ts'
import * as streamTokenKey from './0012_stream_token_key.ts'
import * as eventsSettledWithoutPartitionLocks from './0013_events_settled_without_partition_locks.ts'
import * as eventsSettledInlined from './0014_events_settled_inlined.ts'
import * as eventsForksAndLease from './0015_events_forks_and_lease.ts'
import * as summariesDefaultEmpty from './0016_summaries_default_empty.ts'
import * as leastPrivilege from './0017_least_privilege.ts'
import * as eventsSettleMarkAtSettled from './0018_events_settle_mark_at_settled.ts'

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
