#!/usr/bin/env bash
# The secured compose PostgreSQL's first start (after 01-orders.sql): the consumer's role of
# least rights, from the SQL `bridge stack credentials` wrote (a SCRAM verifier, never the
# password), and the rights its upsert route to public.orders needs (deploy/bridge.yaml).
set -euo pipefail
run_sql() { psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" "$@"; }
run_sql --file /secure/postgres/roles.sql
run_sql <<'SQL'
GRANT USAGE ON SCHEMA public TO bridge_consumer;
GRANT SELECT, INSERT, UPDATE, DELETE ON public.orders TO bridge_consumer;
SQL
