-- The consumer's target table in docker-compose, created by the postgres image on its first start
-- (files in /docker-entrypoint-initdb.d run once, on an empty data directory). The same columns
-- as the demo's table; order_id is the upsert key (deploy/bridge.yaml).
CREATE TABLE IF NOT EXISTS public.orders (
    order_id bigint PRIMARY KEY,
    run_id text NOT NULL,
    customer text,
    amount numeric(12, 2),
    currency text,
    created_at timestamptz,
    applied_at timestamptz NOT NULL DEFAULT now()
);
