// A command for Node: its types, which the library's own compilations (client/, ui/) leave out, being for browsers too.
/// <reference types="node" />
/*
 * `ocp-api`: the API from a terminal or a CI job, on this package's client
 * and Node's built-ins only (the package's bin, cli.ts, runs it). Tables for
 * people, JSON for programs (--json); progress and errors go to stderr, one
 * line each, never a stack trace. Exit codes: EXIT_CODES below.
 */
import { parseArgs, type ParseArgsConfig } from 'node:util'
import { ApiError, createClient, CursorExpired, MAX_PAGE_LIMIT, type Client, type Event, type EventFilter, type Followed, type FollowOptions, type Live, type RunDetail, type RunListItem, type StreamStatus } from './index.ts'

export const EXIT = { ok: 0, failed: 1, usage: 2, timeout: 3 } as const

export interface Io {
  stdout: (text: string) => void
  stderr: (text: string) => void
  env: Record<string, string | undefined>
  /** Colour only on a terminal. */
  color: boolean
  /** Aborted on Ctrl-C: a command stops cleanly. */
  signal?: AbortSignal
}

const DEFAULT_URL = 'http://127.0.0.1:8080'
const DEFAULT_CONNECT_TIMEOUT = '30s'
/** wait's default --until: the statuses a run ends in. */
const RUN_ENDS = 'done,failed'
/** How often a run or thread that does not exist yet is read again, besides on each event the stream has of it. */
const APPEAR_POLL_MS = 2000

const COMMON = `Options of every command:
  --url URL      the service (default: $OCP_API_URL, else ${DEFAULT_URL})
  --token TOKEN  a bearer token (default: $OCP_API_TOKEN)
  --help         this command's help`

const CONNECT_TIMEOUT = `  --connect-timeout DURATION  give up (exit 1) once the service has been out of
                              reach this long, at the start or after a drop
                              (default ${DEFAULT_CONNECT_TIMEOUT})`

const failIfMissingHelp = (what: string) => `  --fail-if-missing           exit 2 at once when the ${what} does not exist,
                              instead of waiting for it to appear`

const EXIT_CODES = `Exit codes:
  0  success (wait: the run reached a status in --ok, or --ok was not given)
  1  the service could not be reached (run, runs: at once; wait, watch: for
     --connect-timeout); wait: the run reached a status not in --ok, or was
     interrupted; watch: the events it resumes from are no longer kept
  2  usage error, refused token, unknown run or thread (run; wait and watch
     with --fail-if-missing)
  3  --timeout passed: wait: before the run reached a status in --until;
     watch: before the run or thread appeared`

const USAGE = {
  main: `Usage: ocp-api COMMAND [options]

Commands:
  runs            list runs, newest first
  run RUN_ID      a run: its task counts, tasks and blocked tasks
  watch           live events, one line each
  wait RUN_ID     wait (on the event stream) until a run ends, or reaches a status

${EXIT_CODES}

${COMMON}
Run ocp-api COMMAND --help for a command's options.`,
  runs: `Usage: ocp-api runs [--status S[,S...]] [--limit N] [--cursor C] [--json]

Runs, newest first. --status keeps runs in any of the statuses given (the
orchestrator's strings). When more remain, the next page's command is printed
to stderr.

  --status S[,S...]  only runs in these statuses
  --limit N          at most N runs (1 to ${MAX_PAGE_LIMIT})
  --cursor C         the page after page key C (printed with the previous page)
  --json             the response body as JSON

${COMMON}`,
  run: `Usage: ocp-api run RUN_ID [--json]

A run: its status, task counts, tasks and blocked tasks.

  --json   the response body as JSON

${COMMON}`,
  watch: `Usage: ocp-api watch [--run RUN_ID] [--thread THREAD_ID] [--after N] [--json] [--timeout DURATION] [--fail-if-missing] [--connect-timeout DURATION]

Live events, one line each, until interrupted. Resumes after the last event
received when the connection drops. A run or thread that does not exist yet
is waited for (read again on its events, and every ${APPEAR_POLL_MS / 1000} s), then all its
events are shown: start the watch before the orchestrator creates it.

  --run RUN_ID        only this run's events
  --thread THREAD_ID  only this thread's events
  --after N           start after event N (0: from the oldest event kept); default:
                      from now, or from the first event of a run or thread that
                      did not exist yet
  --json              each event as one line of JSON (NDJSON)
  --timeout DURATION  give up (exit 3) when the run or thread has not appeared
                      after it; default: wait as long as it takes
${failIfMissingHelp('run or thread')}
${CONNECT_TIMEOUT}

${COMMON}`,
  wait: `Usage: ocp-api wait RUN_ID [--until STATUS[,STATUS...]] [--ok STATUS[,STATUS...]] [--timeout DURATION] [--fail-if-missing] [--connect-timeout DURATION]

Waits, on the event stream, until the run's status is one of --until, then
prints the run (RunDetail) as JSON to stdout. A run that does not exist yet
is waited for (read again on its events, and every ${APPEAR_POLL_MS / 1000} s): start the wait
before the orchestrator creates the run. Progress goes to stderr.
Durations: 90s, 10m, 1h, 500ms (a bare number is seconds).

  --until S[,S...]    the statuses to wait for (the orchestrator's strings;
                      default ${RUN_ENDS}, a run's end)
  --ok S[,S...]       the statuses that mean success
  --timeout DURATION  give up (exit 3) after it, whether the run exists yet or
                      not; 0: check once, now
${failIfMissingHelp('run')}
${CONNECT_TIMEOUT}

${EXIT_CODES}

${COMMON}`
}

type Command = keyof typeof USAGE

class UsageError extends Error {
  readonly command: Command
  constructor (message: string, command: Command) {
    super(message)
    this.command = command
  }
}

const common = {
  url: { type: 'string' },
  token: { type: 'string' },
  help: { type: 'boolean' }
} as const satisfies ParseArgsConfig['options']

const commandOptions = {
  runs: { ...common, status: { type: 'string' }, limit: { type: 'string' }, cursor: { type: 'string' }, json: { type: 'boolean' } },
  run: { ...common, json: { type: 'boolean' } },
  watch: { ...common, run: { type: 'string' }, thread: { type: 'string' }, after: { type: 'string' }, json: { type: 'boolean' }, timeout: { type: 'string' }, 'fail-if-missing': { type: 'boolean' }, 'connect-timeout': { type: 'string' } },
  wait: { ...common, until: { type: 'string' }, ok: { type: 'string' }, timeout: { type: 'string' }, 'fail-if-missing': { type: 'boolean' }, 'connect-timeout': { type: 'string' } }
} as const satisfies Record<Exclude<Command, 'main'>, ParseArgsConfig['options']>

/** A duration: 90s, 10m, 1h, 500ms; a bare number is seconds. */
export function parseDuration (text: string): number | undefined {
  const match = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/.exec(text.trim())
  if (match === null) return undefined
  const unit = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 }[match[2] as 'ms' | 's' | 'm' | 'h' ?? 's']
  return Number(match[1]) * unit
}

type Values = Record<string, string | boolean | undefined>

/** The duration option `name`, as given (for messages) and in milliseconds; a usage error when malformed. */
function durationOption (text: string, name: string, command: Command): { text: string, ms: number } {
  const ms = parseDuration(text)
  if (ms === undefined) throw new UsageError(`--${name} must be a duration such as 90s, 10m, 1h or 500ms, not "${text}"`, command)
  return { text, ms }
}

const connectTimeoutOption = (values: Values, command: Command) =>
  durationOption((values['connect-timeout'] as string | undefined) ?? DEFAULT_CONNECT_TIMEOUT, 'connect-timeout', command)

const timeoutOption = (values: Values, command: Command) =>
  values.timeout === undefined ? undefined : durationOption(values.timeout as string, 'timeout', command)

const list = (text: string | undefined) => (text ?? '').split(',').map((item) => item.trim()).filter((item) => item !== '')

function style (io: Io) {
  const wrap = (code: string) => (text: string) => io.color ? `\u001b[${code}m${text}\u001b[0m` : text
  return { bold: wrap('1'), dim: wrap('2') }
}

/** Columns padded to their widest cell; the last column is not padded. */
function table (header: string[], rows: string[][], io: Io): string {
  const widths = header.map((title, i) => Math.max(title.length, ...rows.map((row) => row[i]!.length)))
  const line = (cells: string[]) => cells.map((cell, i) => i === cells.length - 1 ? cell : cell.padEnd(widths[i]!)).join('  ')
  return [style(io).bold(line(header)), ...rows.map(line)].join('\n') + '\n'
}

const counts = (taskCounts: Record<string, number>) => Object.entries(taskCounts).sort(([a], [b]) => a.localeCompare(b)).map(([status, n]) => `${n} ${status}`).join(', ')

function runsTable (runs: RunListItem[], io: Io): string {
  return table(['RUN', 'STATUS', 'TASKS', 'CREATED', 'GOAL'], runs.map(({ run, task_counts: taskCounts, total_tasks: total }) =>
    [run.run_id, run.status, total === 0 ? '0' : `${total} (${counts(taskCounts)})`, run.created_at, run.goal]), io)
}

function runText (detail: RunDetail, io: Io): string {
  const { bold } = style(io)
  const { run } = detail
  const lines = [
    `${bold('Run')} ${run.run_id}: ${run.goal}`,
    `status   ${run.status}`,
    `tasks    ${detail.total_tasks}${detail.total_tasks === 0 ? '' : ` (${counts(detail.task_counts)})`}`,
    `created  ${run.created_at}`,
    `updated  ${run.updated_at}`
  ]
  if (run.summary !== '') lines.push(`summary  ${run.summary}`)
  let text = lines.join('\n') + '\n'
  if (detail.tasks.length > 0) text += '\n' + table(['TASK', 'STATUS', 'PRIORITY', 'TITLE'], detail.tasks.map((task) => [task.task_id, task.status, task.priority, task.title]), io)
  for (const blocked of detail.blocked_tasks) {
    text += `\n${bold('Blocked')} ${blocked.task.task_id} (attempt ${blocked.attempt.attempt_no}, thread ${blocked.attempt.thread_id}): ${blocked.question.summary}\n`
  }
  return text
}

function eventLine (event: Event, io: Io): string {
  const { dim } = style(io)
  const where = [['run', event.run_id], ['task', event.task_id], ['thread', event.thread_id]].filter(([, value]) => value !== '').map(([name, value]) => `${name}=${value}`).join(' ')
  return `${dim(String(event.event_id))}  ${dim(event.created_at)}  ${event.event_type}  ${where}${event.summary === '' ? '' : `  ${event.summary}`}\n`
}

/** Says what the stream is doing, on stderr, once per change. */
function streamProgress (io: Io) {
  let last = ''
  return (status: StreamStatus) => {
    const text = status.state === 'retrying'
      ? `${status.error?.message ?? status.reason}; retrying in ${(status.delayMs / 1000).toFixed(1)} s`
      : status.state === 'live' ? 'connected' : ''
    if (text !== '' && text !== last) io.stderr(`ocp-api: ${text}\n`)
    last = text
  }
}

/**
 * --connect-timeout: `giveUp` once the service has been out of reach for
 * `ms`, counted from the first failed attempt; `clear` when it answered (an
 * open stream, a read) or the command ends. Its onStatus also says what the
 * stream does (streamProgress).
 */
function connectDeadline ({ ms, text }: { text: string, ms: number }, io: Io, giveUp: (reason: string) => void) {
  const progress = streamProgress(io)
  let timer: ReturnType<typeof setTimeout> | undefined
  let reason = ''
  const clear = () => {
    clearTimeout(timer)
    timer = undefined
  }
  return {
    clear,
    onStatus: (status: StreamStatus) => {
      progress(status)
      if (status.state === 'live') clear()
      if (status.state !== 'retrying') return
      reason = status.error?.message ?? status.reason
      timer ??= setTimeout(() => giveUp(`gave up after ${text} (--connect-timeout) out of reach of the service: ${reason}`), ms)
    }
  }
}

async function runsCommand (client: Client, values: Values, io: Io): Promise<number> {
  let limit: number | undefined
  if (values.limit !== undefined) {
    limit = Number(values.limit)
    if (!Number.isInteger(limit) || limit < 1 || limit > MAX_PAGE_LIMIT) throw new UsageError(`--limit must be an integer from 1 to ${MAX_PAGE_LIMIT}, not "${values.limit}"`, 'runs')
  }
  const read = await client.runsRead({ status: list(values.status as string | undefined), limit, cursor: values.cursor as string | undefined })
  io.stdout(values.json ? JSON.stringify(read.body) + '\n' : read.body.runs.length === 0 ? 'No runs.\n' : runsTable(read.body.runs, io))
  if (read.next !== undefined) {
    const again = ['ocp-api runs', values.status ? `--status ${values.status}` : '', limit ? `--limit ${limit}` : '', `--cursor ${read.next}`, values.json ? '--json' : ''].filter(Boolean).join(' ')
    io.stderr(`ocp-api: more runs: ${again}\n`)
  }
  return EXIT.ok
}

async function runCommand (client: Client, runId: string, json: boolean, io: Io): Promise<number> {
  const body = await client.run(runId)
  io.stdout(json ? JSON.stringify(body) + '\n' : runText(body.run, io))
  return EXIT.ok
}

type Deadline = ReturnType<typeof connectDeadline>

const isNotFound = (error: unknown) => error instanceof ApiError && error.status === 404

/**
 * After a read of a run or thread answered 404: waits for it to exist. It
 * is read again on each of its events (the stream filtered by `filter`, from
 * now) and at least every APPEAR_POLL_MS, which also catches what the stream
 * cannot tell: a creation committed before the position it starts from (a
 * position read on a replica ahead of the one that answered 404). True once
 * a read answers; false once `signal` aborts. A refusal retrying cannot fix
 * (but 404) throws; any other goes to the deadline, and is tried again.
 */
async function appears (client: Client, read: (signal: AbortSignal) => Promise<unknown>, filter: EventFilter, signal: AbortSignal, deadline: Deadline): Promise<boolean> {
  const stop = new AbortController()
  const abort = () => stop.abort()
  signal.addEventListener('abort', abort, { once: true })
  let wake!: () => void
  const events = async () => {
    for await (const _event of client.watch(filter, { signal: stop.signal })) wake() // eslint-disable-line @typescript-eslint/no-unused-vars -- any event wakes the reads
  }
  // The stream only hastens the reads, which meet (and report) its refusals too.
  events().catch(() => {})
  try {
    while (!signal.aborted) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(woken, APPEAR_POLL_MS)
        function woken () {
          clearTimeout(timer)
          stop.signal.removeEventListener('abort', woken)
          resolve()
        }
        wake = woken
        stop.signal.addEventListener('abort', woken, { once: true })
      })
      if (signal.aborted) break
      try {
        await read(stop.signal)
        return true
      } catch (error) {
        /* c8 ignore next 2: stopped while a read was under way (timing); anything but an ApiError is a bug */
        if (signal.aborted) break
        if (!(error instanceof ApiError)) throw error
        if (error.terminal && error.status !== 404) throw error
        if (error.status === 404) deadline.clear() // an answer: the service is in reach
        else deadline.onStatus({ state: 'retrying', delayMs: APPEAR_POLL_MS, reason: error.detail, error })
      }
    }
    return false
  } finally {
    stop.abort()
    signal.removeEventListener('abort', abort)
  }
}

/** What watch follows: a run, a thread. */
interface Target {
  name: string
  filter: EventFilter
  follow: (options: FollowOptions) => AsyncGenerator<Followed<unknown>, void, undefined>
  read: (signal: AbortSignal) => Promise<unknown>
}

async function watchCommand (client: Client, values: Values, io: Io): Promise<number> {
  let after: number | undefined
  if (values.after !== undefined) {
    after = /^\d{1,16}$/.test(values.after as string) ? Number(values.after) : Number.NaN
    if (!Number.isSafeInteger(after)) throw new UsageError(`--after must be an event id (a non-negative integer), not "${values.after}"`, 'watch')
  }
  const timeout = timeoutOption(values, 'watch')
  const connectTimeout = connectTimeoutOption(values, 'watch')
  const runId = values.run as string | undefined
  const threadId = values.thread as string | undefined
  const targets: Target[] = [
    ...(runId ? [{ name: `run ${runId}`, filter: { run_id: runId }, follow: (options: FollowOptions) => client.followRun(runId, options), read: (signal: AbortSignal) => client.runRead(runId, signal) }] : []),
    ...(threadId ? [{ name: `thread ${threadId}`, filter: { thread_id: threadId }, follow: (options: FollowOptions) => client.followThread(threadId, options), read: (signal: AbortSignal) => client.threadRead(threadId, signal) }] : [])
  ]
  const stop = new AbortController()
  const interrupted = () => stop.abort()
  io.signal?.addEventListener('abort', interrupted, { once: true })
  /** Why the watch ended other than interrupted: its exit code and what to say. */
  let ended: { code: number, reason: string } | undefined
  const end = (code: number, reason: string) => {
    ended = { code, reason }
    stop.abort()
  }
  const deadline = connectDeadline(connectTimeout, io, (reason) => end(EXIT.failed, reason))
  const options = { signal: stop.signal, onStatus: deadline.onStatus }
  let timer: ReturnType<typeof setTimeout> | undefined
  try {
    // The stream takes any id: a read first, so that an unknown one is a 404 (follow* retries the read as the stream would).
    const missing: Target[] = []
    for (const target of targets) {
      try {
        for await (const _read of target.follow(options)) break // eslint-disable-line @typescript-eslint/no-unused-vars, no-unreachable-loop -- the first read only: it throws for a missing target
      } catch (error) {
        if (values['fail-if-missing'] || !isNotFound(error)) throw error
        missing.push(target)
      }
    }
    if (missing.length > 0) {
      deadline.clear()
      for (const target of missing) io.stderr(`ocp-api: ${target.name} does not exist yet; waiting for it to appear (--fail-if-missing: exit 2 instead)\n`)
      if (timeout !== undefined) timer = setTimeout(() => end(EXIT.timeout, `timed out after ${timeout.text}: ${missing.map((target) => target.name).join(' and ')} did not appear`), timeout.ms)
      for (const target of missing) await appears(client, target.read, target.filter, stop.signal, deadline)
      clearTimeout(timer)
      // Every event of what did not exist at the start came after it.
      after ??= 0
    }
    deadline.clear()
    const filter = { ...(runId ? { run_id: runId } : {}), ...(threadId ? { thread_id: threadId } : {}) }
    for await (const event of client.watch(filter, { after, ...options })) io.stdout(values.json ? JSON.stringify(event) + '\n' : eventLine(event, io))
  } catch (error) {
    if (!(error instanceof CursorExpired)) throw error
    io.stderr(`ocp-api: the events after ${error.cursor} are no longer kept (the service's EVENTS_RETENTION); --after 0 starts from the oldest kept\n`)
    return EXIT.failed
  } finally {
    clearTimeout(timer)
    deadline.clear()
    io.signal?.removeEventListener('abort', interrupted)
  }
  if (ended === undefined) return EXIT.ok
  io.stderr(`ocp-api: ${ended.reason}\n`)
  return ended.code
}

async function waitCommand (client: Client, runId: string, values: Values, io: Io): Promise<number> {
  const until = list((values.until as string | undefined) ?? RUN_ENDS)
  if (until.length === 0) throw new UsageError('--until must name a status: the statuses to wait for, comma-separated', 'wait')
  const ok = values.ok === undefined ? undefined : list(values.ok as string)
  const timeout = timeoutOption(values, 'wait')
  const connectTimeout = connectTimeoutOption(values, 'wait')
  const failIfMissing = Boolean(values['fail-if-missing'])
  /** The exit code once the run's status is one of --until (the run printed), else undefined. */
  const outcome = (detail: RunDetail): number | undefined => {
    const { status } = detail.run
    if (!until.includes(status)) return undefined
    io.stdout(JSON.stringify(detail) + '\n')
    const success = ok === undefined || ok.includes(status)
    if (!success) io.stderr(`ocp-api: run ${runId} ended ${status}, not ${ok!.join(' or ')}\n`)
    return success ? EXIT.ok : EXIT.failed
  }
  if (timeout?.ms === 0) {
    // No time to wait: one read decides (an error is the main catch's).
    let detail: RunDetail
    try {
      detail = (await client.run(runId)).run
    } catch (error) {
      if (failIfMissing || !isNotFound(error)) throw error
      io.stderr(`ocp-api: run ${runId} does not exist (--timeout 0: checked once)\n`)
      return EXIT.timeout
    }
    const code = outcome(detail)
    if (code !== undefined) return code
    io.stderr(`ocp-api: run ${runId} is ${detail.run.status}, not ${until.join(' or ')} (--timeout 0: checked once)\n`)
    return EXIT.timeout
  }
  return await new Promise<number>((resolve) => {
    const stop = new AbortController()
    let lastStatus: string | undefined
    /** Where the run is, for the timeout's message. */
    let state = 'is not read yet'
    let live: Live | undefined
    const finish = (code: number) => {
      stop.abort()
      clearTimeout(timer)
      deadline.clear()
      io.signal?.removeEventListener('abort', interrupted)
      live?.close()
      resolve(code)
    }
    const interrupted = () => finish(EXIT.failed)
    /** A refusal retrying cannot fix (a refused token; an unknown run, with --fail-if-missing) ends the wait. */
    const refused = (error: ApiError) => {
      io.stderr(`ocp-api: ${error.message}\n`)
      finish(exitCodeOf(error))
    }
    const deadline = connectDeadline(connectTimeout, io, (reason) => {
      io.stderr(`ocp-api: ${reason}\n`)
      finish(EXIT.failed)
    })
    const timer = timeout === undefined
      ? undefined
      : setTimeout(() => {
        io.stderr(`ocp-api: timed out after ${timeout.text}: run ${runId} ${state}, waiting for ${until.join(', ')}\n`)
        finish(EXIT.timeout)
      }, timeout.ms)
    /** The run, kept current; when it does not exist (yet, or on this replica yet), once it appears. */
    const follow = () => {
      live = client.liveRun(runId, ({ run: detail }) => {
        deadline.clear()
        const { status } = detail.run
        if (status !== lastStatus) io.stderr(`ocp-api: run ${runId} is ${status}${until.includes(status) ? '' : `, waiting for ${until.join(', ')}`}\n`)
        lastStatus = status
        state = `is still ${status}`
        const code = outcome(detail)
        if (code !== undefined) finish(code)
      }, {
        onStatus: deadline.onStatus,
        onError: (error) => {
          if (failIfMissing || !isNotFound(error)) {
            refused(error)
            return
          }
          deadline.clear()
          state = 'does not exist yet'
          io.stderr(`ocp-api: run ${runId} does not exist yet; waiting for it to appear (--fail-if-missing: exit 2 instead)\n`)
          appears(client, (signal) => client.runRead(runId, signal), { run_id: runId }, stop.signal, deadline)
            .then((found) => { if (found) follow() }, refused)
        }
      })
    }
    follow()
    io.signal?.addEventListener('abort', interrupted, { once: true })
  })
}

/** 2 for what the caller must fix (a bad request, an unknown id, a refused token), else 1 (out of reach, or failing). */
const exitCodeOf = (error: ApiError) => error.terminal ? EXIT.usage : EXIT.failed

/** Runs the command line `argv` (without node and the script); resolves to the exit code. */
export async function main (argv: string[], io: Io): Promise<number> {
  let command: Command = 'main'
  try {
    const [first, ...rest] = argv
    if (first === undefined || first === '--help' || first === '-h' || first === 'help') {
      io.stdout(USAGE.main + '\n')
      return first === undefined ? EXIT.usage : EXIT.ok
    }
    if (!(first in commandOptions)) throw new UsageError(`unknown command "${first}"`, 'main')
    command = first as Command
    const { values, positionals } = parseArgs({ args: rest, options: commandOptions[command as Exclude<Command, 'main'>], allowPositionals: true, strict: true })
    if (values.help) {
      io.stdout(USAGE[command] + '\n')
      return EXIT.ok
    }
    const needsId = command === 'run' || command === 'wait'
    if (positionals.length !== (needsId ? 1 : 0)) {
      throw new UsageError(needsId ? `${command} takes one RUN_ID${positionals.length > 1 ? `, not ${positionals.length} arguments` : ''}` : `${command} takes no argument, not "${positionals.join(' ')}"`, command)
    }
    const url = (values.url as string | undefined) ?? (io.env.OCP_API_URL || DEFAULT_URL)
    if (!/^https?:\/\/[^/]/.test(url)) throw new UsageError(`--url must be an http(s) URL, not "${url}"`, command)
    const token = (values.token as string | undefined) ?? (io.env.OCP_API_TOKEN || undefined)
    const client = createClient({ url, ...(token ? { token } : {}) })
    const v = values as Values
    switch (command) {
      case 'runs': return await runsCommand(client, v, io)
      case 'run': return await runCommand(client, positionals[0]!, Boolean(v.json), io)
      case 'watch': return await watchCommand(client, v, io)
      default: return await waitCommand(client, positionals[0]!, v, io)
    }
  } catch (error) {
    if (error instanceof ApiError) {
      io.stderr(`ocp-api: ${error.message}\n`)
      return exitCodeOf(error)
    }
    if (error instanceof UsageError || (error as { code?: string }).code?.startsWith('ERR_PARSE_ARGS')) {
      // parseArgs adds advice on positionals starting with '-' after the first sentence: the usage says enough.
      const message = (error as Error).message.split('. To specify')[0]
      io.stderr(`ocp-api: ${message}\n\n${USAGE[error instanceof UsageError ? error.command : command]}\n`)
      return EXIT.usage
    }
    /* c8 ignore next 2: a bug; still one line, with the stack only when asked for */
    io.stderr(`ocp-api: unexpected error: ${(error as Error).message}${io.env.OCP_API_DEBUG ? `\n${(error as Error).stack}` : ''}\n`)
    return EXIT.failed
  }
}

/** The process's side of main: its arguments, streams and environment; exits with the code. */
/* c8 ignore start: run as a process by the bin tests, whose coverage is not collected */
export async function run (): Promise<void> {
  const controller = new AbortController()
  process.once('SIGINT', () => controller.abort())
  process.once('SIGTERM', () => controller.abort())
  const code = await main(process.argv.slice(2), {
    stdout: (text) => { process.stdout.write(text) },
    stderr: (text) => { process.stderr.write(text) },
    env: process.env,
    color: Boolean(process.stdout.isTTY) && !process.env.NO_COLOR,
    signal: controller.signal
  })
  process.exitCode = code
  process.stdout.write('', () => process.exit(code))
}
/* c8 ignore stop */
