#!/bin/sh
# The deployment's three roles, run by the compose service db-roles at every
# `up`, before the migrations (safe to run again; docs/database.md, "Roles
# and privileges"). None is a superuser, nor may make databases or roles:
# - ocp, the owner: it owns the database and so its public schema (it runs
#   the migrations and the event log's keeper, and owns what they make) and
#   may open a replication connection (the event wake-up). Its password is
#   POSTGRES_PASSWORD.
# - ocp_reader, the service's reads (DATABASE_READ_URL): read-only by
#   default, no replication. Its password is OCP_READER_PASSWORD, or
#   POSTGRES_PASSWORD when that is empty.
# - ocp_writer, the orchestrator: no replication. Its password is
#   OCP_WRITER_PASSWORD, or POSTGRES_PASSWORD when that is empty.
# Every password is set again at every run. What the reader and the writer
# may do is granted once the migrations have made the tables: grants.sql,
# run by db-grants. It connects as the superuser through Postgres's socket,
# shared by a volume: pg_hba.conf refuses the superuser any connection over
# the network.
set -eu
psql -v ON_ERROR_STOP=1 --host /var/run/postgresql --username postgres --dbname "$POSTGRES_DB" \
  -v database="$POSTGRES_DB" -v owner_password="$POSTGRES_PASSWORD" \
  -v reader_password="${OCP_READER_PASSWORD:-$POSTGRES_PASSWORD}" \
  -v writer_password="${OCP_WRITER_PASSWORD:-$POSTGRES_PASSWORD}" <<'SQL'
select not exists (select from pg_roles where rolname = 'ocp') as missing \gset
\if :missing
  create role ocp;
\endif
alter role ocp login replication nosuperuser nocreatedb nocreaterole password :'owner_password';
-- Postgres 15: public belongs to pg_database_owner, so ocp, the database's owner, owns it.
alter database :"database" owner to ocp;

select not exists (select from pg_roles where rolname = 'ocp_reader') as missing \gset
\if :missing
  create role ocp_reader;
\endif
alter role ocp_reader login noreplication nosuperuser nocreatedb nocreaterole password :'reader_password';
alter role ocp_reader set default_transaction_read_only = on;

select not exists (select from pg_roles where rolname = 'ocp_writer') as missing \gset
\if :missing
  create role ocp_writer;
\endif
alter role ocp_writer login noreplication nosuperuser nocreatedb nocreaterole password :'writer_password';
SQL
