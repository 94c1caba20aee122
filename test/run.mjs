#!/usr/bin/env node
// `npm test`. With a Postgres server to test on (DATABASE_URL, or a Docker
// engine for testcontainers): the whole suite, coverage required. With
// neither: the embedded-database suite (`npm run test:embedded`), and a word
// on how to run the rest. Arguments go on to tap.
import { spawnSync } from 'node:child_process'
import { existsSync } from 'node:fs'

const args = process.argv.slice(2)
const server = (process.env.DATABASE_URL ?? '') !== '' || (process.env.DOCKER_HOST ?? '') !== '' || existsSync('/var/run/docker.sock')

function run (command, commandArgs, env = process.env) {
  const { status, signal } = spawnSync(command, commandArgs, { stdio: 'inherit', env })
  process.exit(status ?? (signal ? 1 : 0))
}

if (server) run('npx', ['tap', ...args])

console.log(`No DATABASE_URL and no Docker engine: running the tests that need no Postgres server,
on the embedded database (npm run test:embedded). The whole suite, with coverage, runs on a server:
  DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm test
`)
// Named files (npm test -- test/runs.test.ts) run alone; otherwise the embedded suite.
if (args.length > 0) run('npx', ['tap', '--disable-coverage', ...args], { ...process.env, TEST_BACKEND: 'embedded' })
run('npm', ['run', '--silent', 'test:embedded'])
