import { execFileSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { freePort, waitUntil } from './wait.ts'

/*
 * The project's docker-compose.yml as a stack of its own: its own project
 * name and free ports on loopback, so it never touches another stack.
 * Shared by the compose test (test/compose/stack.ts) and the crowd
 * benchmark (bench/crowd.ts); nothing here imports tap.
 */

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..')

/** `docker compose` (v2) where it is installed, else the v1 `docker-compose`. */
function composeCommand (): string[] {
  try {
    execFileSync('docker', ['compose', 'version'], { stdio: 'pipe' })
    return ['docker', 'compose']
  } catch {
    return ['docker-compose']
  }
}

export interface ComposeStack {
  /** What runs compose, the project name and the ports: for a log line. */
  description: string
  /** `compose ...` on the default profile; its output. */
  compose: (...args: string[]) => string
  /** `compose --profile scale ...` (three replicas behind nginx); its output. */
  scale: (...args: string[]) => string
  docker: (...args: string[]) => string
  containerOf: (service: string) => string
  /** `docker kill` of the services' containers; resolves once none runs. */
  kill: (...services: string[]) => Promise<void>
  /** Waits until every service's healthcheck says healthy; how long it took (ms). */
  healthy: (services: string[], timeoutMs?: number) => Promise<number>
  /** A replica's /metrics, read inside its container (only the default replica publishes a port). */
  metricsOf: (service: string) => string
  /** The database on loopback as its owner, ocp (migrations, the event log's keeper). */
  database: string
  /** As the orchestrator, ocp_writer, with OCP_WRITER_PASSWORD (made up for this stack). */
  orchestrator: string
  /** As the service's reader, ocp_reader, with POSTGRES_PASSWORD (OCP_READER_PASSWORD is left empty). */
  reader: string
  /** `psql` as the superuser inside the Postgres container (the one way it may connect), database ocp; its output, unaligned. */
  psql: (query: string) => string
  /** POSTGRES_PASSWORD, which the compose file requires: made up for this stack. */
  password: string
  /** The default replica and nginx (scale profile), on loopback. */
  api: string
  lb: string
}

export async function composeStack (name: string): Promise<ComposeStack> {
  const [cli, ...cliArgs] = composeCommand()
  const ports = { POSTGRES_PORT: await freePort(), API_PORT: await freePort(), LB_PORT: await freePort() }
  const project = `${name}-${process.pid}`
  const password = randomBytes(18).toString('base64url')
  const writerPassword = randomBytes(18).toString('base64url')
  const env = { ...process.env, COMPOSE_PROJECT_NAME: project, POSTGRES_PASSWORD: password, OCP_WRITER_PASSWORD: writerPassword, OCP_READER_PASSWORD: '', DATABASE_READ_URL: '', ...Object.fromEntries(Object.entries(ports).map(([key, port]) => [key, String(port)])) }
  const docker = (...args: string[]) => execFileSync('docker', args, { stdio: 'pipe', maxBuffer: 64 * 1024 * 1024 }).toString().trim()
  /** Each container of the stack with its healthcheck's last answers: what a failed `up` is read with. */
  const healthOfEach = () => docker('ps', '-aq', '--filter', `label=com.docker.compose.project=${project}`).split('\n').filter(Boolean)
    .map((id) => docker('inspect', '-f', '{{.Name}} {{.State.Status}} {{json .State.Health}}', id)).join('\n')
  const compose = (...args: string[]) => {
    try {
      return execFileSync(cli!, [...cliArgs, '-f', join(root, 'docker-compose.yml'), ...args], { cwd: root, env, stdio: 'pipe' }).toString()
    } catch (error) {
      if (error instanceof Error && /unhealthy/.test(error.message)) error.message += `\nthe containers:\n${healthOfEach()}`
      throw error
    }
  }
  const containerOf = (service: string) => compose('ps', '-q', service).trim()
  const isRunning = (id: string) => docker('inspect', '-f', '{{.State.Running}}', id) === 'true'
  return {
    description: `${cli} ${cliArgs.join(' ')}, project ${project}, ports ${JSON.stringify(ports)}`,
    compose,
    scale: (...args) => compose('--profile', 'scale', ...args),
    docker,
    containerOf,
    kill: async (...services) => {
      const ids = services.map(containerOf)
      // The daemon sends the kill but waits only 10 s for the exit, then
      // answers with an error (a loaded machine can take longer): what
      // counts is that the containers stop.
      let answered: unknown
      try {
        docker('kill', ...ids)
      } catch (error) {
        answered = error
      }
      await waitUntil(() => !ids.some(isRunning), `${services.join(', ')} to stop after docker kill`).catch((error) => { throw answered ?? error })
    },
    healthy: async (services, timeoutMs = 120_000) => {
      const started = Date.now()
      await waitUntil(() => services.every((service) => {
        const id = containerOf(service)
        // A container that compose replaces between ps and inspect is not healthy yet.
        try {
          return id !== '' && docker('inspect', '-f', '{{.State.Health.Status}}', id) === 'healthy'
        } catch {
          return false
        }
      }), `${services.join(', ')} healthy`, timeoutMs)
      return Date.now() - started
    },
    metricsOf: (service) => docker('exec', containerOf(service), 'node', '-e',
      'fetch("http://127.0.0.1:8080/metrics").then((r) => r.text()).then((text) => console.log(text))'),
    database: `postgres://ocp:${password}@127.0.0.1:${ports.POSTGRES_PORT}/ocp`,
    orchestrator: `postgres://ocp_writer:${writerPassword}@127.0.0.1:${ports.POSTGRES_PORT}/ocp`,
    reader: `postgres://ocp_reader:${password}@127.0.0.1:${ports.POSTGRES_PORT}/ocp`,
    psql: (query) => compose('exec', '-T', 'postgres', 'psql', '-U', 'postgres', '-d', 'ocp', '-AtX', '-v', 'ON_ERROR_STOP=1', '-c', query).trim(),
    password,
    api: `http://127.0.0.1:${ports.API_PORT}`,
    lb: `http://127.0.0.1:${ports.LB_PORT}`
  }
}
