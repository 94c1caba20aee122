#!/bin/sh
# The service's role, ocp, run by the compose service db-roles at every
# `up`, before the service starts (safe to run again): it owns the database
# and so its public schema (it runs the migrations and the event log's
# upkeep, and owns what they make) and may open a replication connection
# (the event wake-up), and nothing else: no superuser, no CREATEDB, no
# CREATEROLE. Its password is POSTGRES_PASSWORD, set again at every run.
# It connects as the superuser through Postgres's socket, shared by a
# volume: pg_hba.conf refuses the superuser any connection over the
# network. The reader's and the writer's grants, once the migrations have
# made the tables: grants.sql (docs/database.md, "Roles and privileges").
set -eu
psql -v ON_ERROR_STOP=1 --host /var/run/postgresql --username postgres --dbname "$POSTGRES_DB" \
  -v database="$POSTGRES_DB" -v password="$POSTGRES_PASSWORD" <<'SQL'
select not exists (select from pg_roles where rolname = 'ocp') as missing \gset
\if :missing
  create role ocp;
\endif
alter role ocp login replication nosuperuser nocreatedb nocreaterole password :'password';
-- Postgres 15: public belongs to pg_database_owner, so ocp, the database's owner, owns it.
alter database :"database" owner to ocp;
SQL
