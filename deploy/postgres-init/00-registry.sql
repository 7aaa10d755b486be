-- The schema registry's own schema (docker-compose's schema-registry service keeps its schemas
-- there, through currentSchema in its JDBC URL), apart from the pipeline's tables. Runs once,
-- on an empty data directory, as the database's owner.
CREATE SCHEMA IF NOT EXISTS registry;
