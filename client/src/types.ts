// Generated from the server's TypeBox schemas (schemas/) by client/scripts/generate-types.ts: do not edit.

/** The largest `limit` a page may ask for. */
export const MAX_PAGE_LIMIT = 1000

/** The event types of the reference writer and the demo (schemas/event-types.ts, docs/reference.md); an orchestrator may write others. */
export type EventType = "run_created" | "run_status" | "task_added" | "task_ready" | "task_dispatched" | "task_running" | "task_blocked" | "task_answered" | "task_done" | "task_failed" | "thread_claim" | "thread_update" | "thread_reply" | "thread_result" | "council_tallied" | "council_report_persisted" | (string & {})

export interface Run {
  run_id: string
  goal: string
  summary: string
  status: string
  /** RFC 3339, UTC, microseconds: 2026-11-21T09:28:40.123456Z */
  created_at: string
  /** RFC 3339, UTC, microseconds: 2026-11-21T09:28:40.123456Z */
  updated_at: string
}

export interface RunListItem {
  run: Run
  /** Number of tasks of the run in each status present; {} when the run has no tasks */
  task_counts: Record<string, number>
  /** Number of tasks of the run */
  total_tasks: number
}

export interface Task {
  run_id: string
  task_id: string
  title: string
  summary: string
  status: string
  default_to?: string
  priority: string
  /** Acceptance criteria, raw JSON as stored */
  acceptance_json: unknown
  latest_attempt_no?: number
  /** RFC 3339, UTC, microseconds: 2026-11-21T09:28:40.123456Z */
  created_at: string
  /** RFC 3339, UTC, microseconds: 2026-11-21T09:28:40.123456Z */
  updated_at: string
}

export interface TaskAttempt {
  run_id: string
  task_id: string
  attempt_no: number
  assigned_to: string
  thread_id: string
  base_ref?: string
  base_commit?: string
  branch_name?: string
  worktree_path?: string
  workspace_status?: string
  result_commit?: string
  status: string
  /** RFC 3339, UTC, microseconds: 2026-11-21T09:28:40.123456Z */
  created_at: string
  /** RFC 3339, UTC, microseconds: 2026-11-21T09:28:40.123456Z */
  updated_at: string
}

export interface Artifact {
  artifact_id: string
  message_id: string
  path: string
  kind: string
  /** Artifact metadata, raw JSON as stored */
  metadata_json: unknown
  /** RFC 3339, UTC, microseconds: 2026-11-21T09:28:40.123456Z */
  created_at: string
}

export interface Message {
  message_id: string
  thread_id: string
  from_agent: string
  to_agent: string
  kind: string
  summary: string
  body: string
  /** Message payload, raw JSON as stored */
  payload_json: unknown
  /** RFC 3339, UTC, microseconds: 2026-11-21T09:28:40.123456Z */
  created_at: string
  /** Always present in thread detail and in a blocked question, ordered by created_at then artifact_id */
  artifacts?: Array<Artifact>
}

export interface Thread {
  thread_id: string
  run_id: string
  task_id: string
  subject: string
  created_by: string
  assigned_to: string
  status: string
  priority: string
  latest_message_id?: string
  /** RFC 3339, UTC, microseconds: 2026-11-21T09:28:40.123456Z */
  created_at: string
  /** RFC 3339, UTC, microseconds: 2026-11-21T09:28:40.123456Z */
  updated_at: string
}

export interface ThreadDetail {
  thread: Thread
  /** Ordered by created_at, then message_id */
  messages: Array<Message>
}

/** A task (every field of Task) with its attempts and threads */
export interface TaskDetail {
  run_id: string
  task_id: string
  title: string
  summary: string
  status: string
  default_to?: string
  priority: string
  /** Acceptance criteria, raw JSON as stored */
  acceptance_json: unknown
  latest_attempt_no?: number
  /** RFC 3339, UTC, microseconds: 2026-11-21T09:28:40.123456Z */
  created_at: string
  /** RFC 3339, UTC, microseconds: 2026-11-21T09:28:40.123456Z */
  updated_at: string
  /** Every attempt of the task, newest first: attempt_no desc */
  attempts: Array<TaskAttempt>
  /** Every thread of the task, newest first: created_at desc, then thread_id desc */
  threads: Array<Thread>
}

/** A task in status `blocked`, its latest attempt, and the newest `question` message of that attempt's thread */
export interface BlockedTask {
  task: Task
  attempt: TaskAttempt
  question: Message
}

export interface RunDetail {
  run: Run
  /** Number of tasks of the run in each status present; {} when the run has no tasks */
  task_counts: Record<string, number>
  /** Number of tasks of the run */
  total_tasks: number
  /** Ordered by created_at, then task_id */
  tasks: Array<Task>
  /** Ordered by created_at, then task_id */
  blocked_tasks: Array<BlockedTask>
}

export interface Event {
  /** Monotonic: the only resume position */
  event_id: number
  /** run_created, run_status, task_added, task_ready, task_dispatched, task_running, task_blocked, task_answered, task_done, task_failed, thread_claim, thread_update, thread_reply, thread_result, council_tallied, council_report_persisted, or another the orchestrator writes (see the event types of docs/reference.md) */
  event_type: EventType
  /** "" when the event is not tied to a run */
  run_id: string
  /** "" when the event is not tied to a task */
  task_id: string
  /** "" when the event is not tied to a thread */
  thread_id: string
  summary: string
  /** Free-form JSON, at least {} */
  payload: unknown
  /** RFC 3339, UTC, microseconds: 2026-11-21T09:28:40.123456Z */
  created_at: string
}

export interface ErrorEnvelope {
  error: {
    /** One of not_found, bad_request, unauthorized, unavailable, cursor_expired, method_not_allowed, too_many_requests, misdirected_request, internal */
    code: string
    /** Human-readable explanation */
    message: string
  }
}

export interface Health {
  status: "ok"
}

export interface RunList {
  /** Newest first: created_at desc, then run_id desc */
  runs: Array<RunListItem>
}

export interface RunDetailEnvelope {
  run: RunDetail
}

export interface TaskDetailEnvelope {
  task: TaskDetail
}

export interface TaskList {
  /** Ordered by created_at, then task_id */
  tasks: Array<Task>
}

export interface BlockedTaskList {
  /** Ordered by created_at, then task_id */
  blocked: Array<BlockedTask>
}

export interface ThreadDetailEnvelope {
  thread: ThreadDetail
}

export interface EventList {
  /** Ascending event_id */
  events: Array<Event>
}

/** A stream opens if every filter named here is the stream's own */
export interface StreamScope {
  /** Only the streams of this run (its events, and its Durable Streams route) */
  run_id?: string
  /** Only the streams of this thread */
  thread_id?: string
}

export interface StreamToken {
  /** Pass it as `stream_token` in the URL of /api/events/stream or a /api/streams route (or as a bearer token there) */
  token: string
  /** After it the token opens no new stream; a stream already open stays open */
  expires_at: string
  scope: StreamScope
}

/** The identity provider the web UI signs in with (authorization code with PKCE) */
export interface SignIn {
  issuer: string
  authorization_endpoint: string
  token_endpoint: string
  client_id: string
  scope: string
}

export interface AuthInfo {
  /** Whether /api routes need a token */
  required: boolean
  sign_in: SignIn | null
}
