import { Type, type TObject } from 'typebox'
import { ErrorCodes } from '../errors.ts'
import { eventTypeNames } from './event-types.ts'

/*
 * The resources of docs/reference.md, "Resources", one schema each, registered once by $id
 * (plugins/app/schemas.ts) and referenced by the routes. Required and optional
 * fields are exactly the contract's; an optional field is omitted when its column
 * is NULL. The same definitions drive validation, the SQL projection
 * (db/json.ts) and the contract tests.
 */

const DateTime = () => Type.String({ format: 'date-time', description: 'RFC 3339, UTC, microseconds: 2026-11-21T09:28:40.123456Z' })

/** A raw JSON column: whatever JSON the orchestrator stored, passed through unchanged. */
export const RawJson = (description: string) => Type.Unknown({ description })

const additionalProperties = false

export const Run = Type.Object({
  run_id: Type.String(),
  goal: Type.String(),
  summary: Type.String(),
  status: Type.String(),
  created_at: DateTime(),
  updated_at: DateTime()
}, { $id: 'Run', additionalProperties })

/** Tasks of a run per status: one key per status present, value the number of tasks in it. */
const TaskCounts = Type.Record(Type.String(), Type.Integer({ minimum: 0 }), {
  description: 'Number of tasks of the run in each status present; {} when the run has no tasks'
})
const TotalTasks = Type.Integer({ minimum: 0, description: 'Number of tasks of the run' })

export const RunListItem = Type.Object({
  run: Type.Ref('Run'),
  task_counts: TaskCounts,
  total_tasks: TotalTasks
}, { $id: 'RunListItem', additionalProperties })

export const Task = Type.Object({
  run_id: Type.String(),
  task_id: Type.String(),
  title: Type.String(),
  summary: Type.String(),
  status: Type.String(),
  default_to: Type.Optional(Type.String()),
  priority: Type.String(),
  acceptance_json: RawJson('Acceptance criteria, raw JSON as stored'),
  latest_attempt_no: Type.Optional(Type.Integer()),
  created_at: DateTime(),
  updated_at: DateTime()
}, { $id: 'Task', additionalProperties })

export const TaskAttempt = Type.Object({
  run_id: Type.String(),
  task_id: Type.String(),
  attempt_no: Type.Integer(),
  assigned_to: Type.String(),
  thread_id: Type.String(),
  base_ref: Type.Optional(Type.String()),
  base_commit: Type.Optional(Type.String()),
  branch_name: Type.Optional(Type.String()),
  worktree_path: Type.Optional(Type.String()),
  workspace_status: Type.Optional(Type.String()),
  result_commit: Type.Optional(Type.String()),
  status: Type.String(),
  created_at: DateTime(),
  updated_at: DateTime()
}, { $id: 'TaskAttempt', additionalProperties })

export const Artifact = Type.Object({
  artifact_id: Type.String(),
  message_id: Type.String(),
  path: Type.String(),
  kind: Type.String(),
  metadata_json: RawJson('Artifact metadata, raw JSON as stored'),
  created_at: DateTime()
}, { $id: 'Artifact', additionalProperties })

export const Message = Type.Object({
  message_id: Type.String(),
  thread_id: Type.String(),
  from_agent: Type.String(),
  to_agent: Type.String(),
  kind: Type.String(),
  summary: Type.String(),
  body: Type.String(),
  payload_json: RawJson('Message payload, raw JSON as stored'),
  created_at: DateTime(),
  artifacts: Type.Optional(Type.Array(Type.Ref('Artifact'), {
    description: 'Always present in thread detail and in a blocked question, ordered by created_at then artifact_id'
  }))
}, { $id: 'Message', additionalProperties })

export const Thread = Type.Object({
  thread_id: Type.String(),
  run_id: Type.String(),
  task_id: Type.String(),
  subject: Type.String(),
  created_by: Type.String(),
  assigned_to: Type.String(),
  status: Type.String(),
  priority: Type.String(),
  latest_message_id: Type.Optional(Type.String()),
  created_at: DateTime(),
  updated_at: DateTime()
}, { $id: 'Thread', additionalProperties })

export const ThreadDetail = Type.Object({
  thread: Type.Ref('Thread'),
  messages: Type.Array(Type.Ref('Message'), { description: 'Ordered by created_at, then message_id' })
}, { $id: 'ThreadDetail', additionalProperties })

export const TaskDetail = Type.Object({
  ...Task.properties,
  attempts: Type.Array(Type.Ref('TaskAttempt'), { description: 'Every attempt of the task, newest first: attempt_no desc' }),
  threads: Type.Array(Type.Ref('Thread'), { description: 'Every thread of the task, newest first: created_at desc, then thread_id desc' })
}, {
  $id: 'TaskDetail',
  additionalProperties,
  description: 'A task (every field of Task) with its attempts and threads'
})

export const BlockedTask = Type.Object({
  task: Type.Ref('Task'),
  attempt: Type.Ref('TaskAttempt'),
  question: Type.Ref('Message')
}, {
  $id: 'BlockedTask',
  additionalProperties,
  description: 'A task in status `blocked`, its latest attempt, and the newest `question` message of that attempt\'s thread'
})

export const RunDetail = Type.Object({
  run: Type.Ref('Run'),
  task_counts: TaskCounts,
  total_tasks: TotalTasks,
  tasks: Type.Array(Type.Ref('Task'), { description: 'Ordered by created_at, then task_id' }),
  blocked_tasks: Type.Array(Type.Ref('BlockedTask'), { description: 'Ordered by created_at, then task_id' })
}, { $id: 'RunDetail', additionalProperties })

export const ErrorEnvelope = Type.Object({
  error: Type.Object({
    code: Type.String({ description: `One of ${Object.keys(ErrorCodes).join(', ')}` }),
    message: Type.String({ description: 'Human-readable explanation' })
  }, { additionalProperties })
}, { $id: 'ErrorEnvelope', additionalProperties })

/** One persisted event (docs/reference.md, "Event types"): every field always present, strings possibly empty. */
export const Event = Type.Object({
  event_id: Type.Integer({ minimum: 1, description: 'Monotonic: the only resume position' }),
  event_type: Type.String({ description: `${eventTypeNames.join(', ')}, or another the orchestrator writes (see the event types of docs/reference.md)` }),
  run_id: Type.String({ description: '"" when the event is not tied to a run' }),
  task_id: Type.String({ description: '"" when the event is not tied to a task' }),
  thread_id: Type.String({ description: '"" when the event is not tied to a thread' }),
  summary: Type.String(),
  payload: RawJson('Free-form JSON, at least {}'),
  created_at: DateTime()
}, { $id: 'Event', additionalProperties })

/** Every shared schema, in an order where each is added after those it references. */
export const resourceSchemas: TObject[] = [
  Run, RunListItem, Task, TaskAttempt, Artifact, Message, Thread, ThreadDetail, TaskDetail, BlockedTask, RunDetail, Event, ErrorEnvelope
]
