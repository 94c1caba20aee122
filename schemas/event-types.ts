/*
 * The event types this project's reference writer (db/writer.ts) and demo
 * emit: what each announces, which ids it carries, and its payload. The
 * orchestrator owns the vocabulary (an event may carry another type, and
 * readers must let it pass); this catalog is what the reference, the
 * Event schema and the client's types say of it.
 */
export interface EventTypeInfo {
  /** The state change the event announces, committed in the same transaction. */
  announces: string
  /** Which of run_id, task_id and thread_id it fills (the others are ""). */
  ids: string
  /** Its payload, as the reference writer fills it. */
  payload: string
}

export const EVENT_TYPES = {
  run_created: { announces: 'A run was inserted (`runs`); `summary` is its goal', ids: 'run_id', payload: '`{}`' },
  run_status: { announces: 'A run\'s `status` (and `summary`) changed', ids: 'run_id', payload: '`{"status": <the new status>}`' },
  task_added: { announces: 'A task was inserted (`tasks`); `summary` is its title', ids: 'run_id, task_id', payload: '`{}`' },
  task_ready: { announces: 'A task\'s status became `ready`', ids: 'run_id, task_id', payload: '`{"status": "ready"}`' },
  task_dispatched: {
    announces: 'A task was dispatched: a new attempt (`task_attempts`), its thread (`threads`), the task\'s `latest_attempt_no`, and status `dispatched`',
    ids: 'run_id, task_id, thread_id',
    payload: '`{}`'
  },
  task_running: { announces: 'A task\'s status became `running`', ids: 'run_id, task_id', payload: '`{"status": "running"}`' },
  task_blocked: {
    announces: 'A task\'s status became `blocked` (after the question message that blocks it): it joins the run\'s blocked tasks',
    ids: 'run_id, task_id',
    payload: '`{"status": "blocked"}`'
  },
  task_answered: {
    announces: 'The question blocking a task was answered (after the answer message): its status became `running` again',
    ids: 'run_id, task_id, thread_id',
    payload: '`{}`'
  },
  task_done: { announces: 'A task\'s status became `done`', ids: 'run_id, task_id', payload: '`{"status": "done"}`' },
  task_failed: { announces: 'A task\'s status became `failed`', ids: 'run_id, task_id', payload: '`{"status": "failed"}`' },
  thread_claim: {
    announces: 'A worker claimed a dispatched attempt\'s thread: its status became `claimed`',
    ids: 'run_id, task_id, thread_id',
    payload: '`{}`'
  },
  thread_update: {
    announces: 'A message of kind `update` or `question` (or of a kind not listed here) was posted to a thread, with its artifacts; it is the ' +
      'thread\'s `latest_message_id`',
    ids: 'run_id, task_id, thread_id',
    payload: '`{"kind": <the message\'s kind>, "message_id": <its id>}`'
  },
  thread_reply: {
    announces: 'A message of kind `answer` or `reply` was posted to a thread, as above',
    ids: 'run_id, task_id, thread_id',
    payload: '`{"kind", "message_id"}` as above'
  },
  thread_result: {
    announces: 'A message of kind `result` was posted to a thread, as above',
    ids: 'run_id, task_id, thread_id',
    payload: '`{"kind", "message_id"}` as above'
  },
  council_tallied: {
    announces: 'A finished run\'s council counted its verdicts (no table changes)',
    ids: 'run_id',
    payload: '`{"approve": <n>, "reject": <n>}`'
  },
  council_report_persisted: { announces: 'A run\'s council report was saved', ids: 'run_id', payload: '`{"path": <where>}`' }
} as const satisfies Record<string, EventTypeInfo>

export type EventType = keyof typeof EVENT_TYPES

/** The types, in the catalog's order. */
export const eventTypeNames = Object.keys(EVENT_TYPES) as EventType[]
