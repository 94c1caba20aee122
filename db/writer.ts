import { sql, type Insertable, type Kysely, type Transaction } from 'kysely'
import type { ArtifactsTable, Database, EventsTable, MessagesTable, RunsTable, TaskAttemptsTable, TasksTable, ThreadsTable } from './schema.ts'

/*
 * How an orchestrator records state: the reference for its authors, and
 * what the demo and the tests write with. Each change and the event that
 * announces it commit in ONE transaction (the outbox pattern), so a
 * subscriber never sees an event for a change it cannot read, nor a change
 * without its event. Its event_id is left out: the column's default
 * gives the transaction its id, then draws the event's (events_next_id,
 * db/sql/event-ids.sql); writers never wait for each other.
 *
 * This service's own request path never writes: its sessions are
 * read-only. These functions need a connection with write rights.
 */

export type Writer = Kysely<Database>
type Tx = Transaction<Database>

export type EventInput = Omit<Insertable<EventsTable>, 'event_id' | 'created_at' | 'payload'> & { payload?: unknown }

/** Runs `change` and records `event` after it, in one transaction; returns the event's id. */
export async function recordChange (db: Writer, event: EventInput, change: (trx: Tx) => Promise<void> = async () => {}): Promise<number> {
  return db.transaction().execute(async (trx) => {
    await change(trx)
    const { payload = {}, ...fields } = event
    const row = await trx.insertInto('events')
      .values({ ...fields, payload: JSON.stringify(payload) })
      .returning('event_id')
      .executeTakeFirstOrThrow()
    return Number(row.event_id)
  })
}

const now = () => sql<Date>`now()`

/** Task statuses and the event each transition announces (docs/reference.md, "Event types"). */
export const TASK_STATUS_EVENTS = {
  ready: 'task_ready',
  dispatched: 'task_dispatched',
  running: 'task_running',
  blocked: 'task_blocked',
  done: 'task_done',
  failed: 'task_failed'
} as const
export type TaskStatus = keyof typeof TASK_STATUS_EVENTS

export function createRun (db: Writer, run: Insertable<RunsTable>): Promise<number> {
  return recordChange(db, { event_type: 'run_created', run_id: run.run_id, summary: run.goal }, async (trx) => {
    await trx.insertInto('runs').values(run).execute()
  })
}

export function setRunStatus (db: Writer, runId: string, status: string, summary: string): Promise<number> {
  return recordChange(db, { event_type: 'run_status', run_id: runId, summary, payload: { status } }, async (trx) => {
    await trx.updateTable('runs').set({ status, summary, updated_at: now() }).where('run_id', '=', runId).execute()
  })
}

export function addTask (db: Writer, task: Insertable<TasksTable>): Promise<number> {
  return recordChange(db, { event_type: 'task_added', run_id: task.run_id, task_id: task.task_id, summary: task.title }, async (trx) => {
    await trx.insertInto('tasks').values(task).execute()
  })
}

export function setTaskStatus (db: Writer, runId: string, taskId: string, status: TaskStatus, summary = ''): Promise<number> {
  return recordChange(db, { event_type: TASK_STATUS_EVENTS[status], run_id: runId, task_id: taskId, summary, payload: { status } }, async (trx) => {
    await trx.updateTable('tasks').set({ status, updated_at: now() }).where('run_id', '=', runId).where('task_id', '=', taskId).execute()
  })
}

/**
 * Dispatches a task: a new attempt, its thread (claimed by the worker), the
 * task's latest_attempt_no, and status `dispatched`; announced as
 * task_dispatched (the thread's claim follows as thread_claim).
 */
export async function dispatchTask (
  db: Writer,
  attempt: Insertable<TaskAttemptsTable>,
  thread: Omit<Insertable<ThreadsTable>, 'run_id' | 'task_id' | 'thread_id'>
): Promise<number> {
  const { run_id: runId, task_id: taskId, thread_id: threadId } = attempt
  await recordChange(db, {
    event_type: 'task_dispatched',
    run_id: runId,
    task_id: taskId,
    thread_id: threadId,
    summary: `attempt ${attempt.attempt_no} to ${attempt.assigned_to}`
  }, async (trx) => {
    await trx.insertInto('threads').values({ ...thread, run_id: runId, task_id: taskId, thread_id: threadId }).execute()
    await trx.insertInto('task_attempts').values(attempt).execute()
    await trx.updateTable('tasks').set({ status: 'dispatched', latest_attempt_no: attempt.attempt_no, updated_at: now() })
      .where('run_id', '=', runId).where('task_id', '=', taskId).execute()
  })
  return recordChange(db, {
    event_type: 'thread_claim',
    run_id: runId,
    task_id: taskId,
    thread_id: threadId,
    summary: `${attempt.assigned_to} claimed the thread`
  }, async (trx) => {
    await trx.updateTable('threads').set({ status: 'claimed', updated_at: now() }).where('thread_id', '=', threadId).execute()
  })
}

/** Message kinds and the event each announces. */
export const MESSAGE_EVENTS: Record<string, string> = {
  update: 'thread_update',
  question: 'thread_update',
  answer: 'thread_reply',
  reply: 'thread_reply',
  result: 'thread_result'
}

/** Posts a message (and its artifacts) to a thread, as its latest message. */
export function postMessage (
  db: Writer,
  thread: { run_id: string, task_id: string },
  message: Insertable<MessagesTable>,
  artifacts: Array<Insertable<ArtifactsTable>> = []
): Promise<number> {
  const eventType = MESSAGE_EVENTS[message.kind] ?? 'thread_update'
  return recordChange(db, {
    event_type: eventType,
    run_id: thread.run_id,
    task_id: thread.task_id,
    thread_id: message.thread_id,
    summary: message.summary,
    payload: { kind: message.kind, message_id: message.message_id }
  }, async (trx) => {
    await trx.insertInto('messages').values(message).execute()
    if (artifacts.length > 0) await trx.insertInto('artifacts').values(artifacts).execute()
    await trx.updateTable('threads').set({ latest_message_id: message.message_id, updated_at: now() }).where('thread_id', '=', message.thread_id).execute()
  })
}

/** Blocks a task on a question: the question message, then status `blocked` (task_blocked). */
export async function blockOnQuestion (db: Writer, thread: { run_id: string, task_id: string }, question: Insertable<MessagesTable>): Promise<number> {
  await postMessage(db, thread, { ...question, kind: 'question' })
  return setTaskStatus(db, thread.run_id, thread.task_id, 'blocked', question.summary)
}

/** Answers the question that blocks a task: the answer message, then task_answered and status `running`. */
export async function answerQuestion (db: Writer, thread: { run_id: string, task_id: string }, answer: Insertable<MessagesTable>): Promise<number> {
  await postMessage(db, thread, { ...answer, kind: 'answer' })
  return recordChange(db, {
    event_type: 'task_answered', run_id: thread.run_id, task_id: thread.task_id, thread_id: answer.thread_id, summary: answer.summary
  }, async (trx) => {
    await trx.updateTable('tasks').set({ status: 'running', updated_at: now() })
      .where('run_id', '=', thread.run_id).where('task_id', '=', thread.task_id).execute()
  })
}
