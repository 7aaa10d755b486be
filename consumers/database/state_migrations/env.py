"""Alembic's environment: the caller's connection, already in its transaction and holding the
DDL lock, and the version table inside bridge's own schema."""

from __future__ import annotations

from alembic import context

from bridge.names import STATE_VERSION_TABLE

config = context.config
schema: str = config.attributes["schema"]
context.configure(
    connection=config.attributes["connection"],
    version_table=STATE_VERSION_TABLE,
    version_table_schema=schema,
    transactional_ddl=True,
)
with context.begin_transaction():
    context.run_migrations(schema=schema)
