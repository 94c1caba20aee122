import { spawn } from 'node:child_process'
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import type { Test } from 'tap'
import { freePort, waitUntil } from './wait.ts'

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..')
const NGINX = process.env.NGINX_BIN ?? '/usr/sbin/nginx'

/** Whether `url` answers 2xx now. */
export const answers = async (url: string) => {
  try { return (await fetch(url)).ok } catch { return false }
}

/**
 * Debian's nginx with the shipped deploy/nginx config in front of the
 * replicas on `ports`, in a directory of its own (its cache included),
 * stopped when the test ends. Resolves with its base URL.
 */
export async function startNginx (t: Test, ports: number[]): Promise<string> {
  if (!existsSync(NGINX)) throw new Error(`nginx not found at ${NGINX}: apt-get install nginx-light (or set NGINX_BIN)`)
  const dir = mkdtempSync(join(tmpdir(), 'ocp-nginx-'))
  chmodSync(dir, 0o777) // workers run as an unprivileged user when nginx starts as root
  for (const temp of ['client_body', 'proxy', 'fastcgi', 'uwsgi', 'scgi', 'cache', 'streams-cache']) {
    mkdirSync(join(dir, temp))
    chmodSync(join(dir, temp), 0o777) // past the umask
  }
  const lbPort = await freePort()
  const site = readFileSync(join(root, 'deploy/nginx/ocp-api.conf.template'), 'utf8')
    .replace('${OCP_API_UPSTREAMS}', ports.map((port) => `server 127.0.0.1:${port};`).join(' ')) // eslint-disable-line no-template-curly-in-string -- the template's envsubst placeholder
    .replace('${OCP_LB_PORT}', `127.0.0.1:${lbPort}`) // eslint-disable-line no-template-curly-in-string -- the template's envsubst placeholder
    .replace('/tmp/ocp-api-cache', join(dir, 'cache'))
    .replace('/tmp/ocp-api-streams-cache', join(dir, 'streams-cache'))
  writeFileSync(join(dir, 'ocp-api.conf'), site)
  writeFileSync(join(dir, 'nginx.conf'), `
worker_processes 1;
daemon off;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path ${dir}/client_body;
  proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fastcgi;
  uwsgi_temp_path ${dir}/uwsgi;
  scgi_temp_path ${dir}/scgi;
  include ${dir}/ocp-api.conf;
}
`)
  const nginx = spawn(NGINX, ['-p', dir, '-c', join(dir, 'nginx.conf')], { stdio: ['ignore', 'ignore', 'inherit'] })
  t.teardown(() => { nginx.kill('SIGTERM'); rmSync(dir, { recursive: true, force: true }) })
  const lb = `http://127.0.0.1:${lbPort}`
  await waitUntil(() => answers(`${lb}/health`), 'nginx', 60_000)
  return lb
}
