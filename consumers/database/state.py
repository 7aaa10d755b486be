"""The consumer's own tables in PostgreSQL: offsets with an owner lease, resets, dead letters.

SQLAlchemy Core describes them as this release uses them. Their shape has a version, kept in the
schema's version table: `ensure_state_tables` brings it to this release's version with the
migrations of `consumers.database.state_migrations`, in one transaction, under an advisory lock so
that two instances starting together do not race, and refuses a version newer than it knows. The
offsets table and its audit trail are defined by `consumers.database.offsets`, their only home; this
module puts them in a schema beside the dead letters.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from typing import TYPE_CHECKING, Final

import psycopg
from psycopg import sql
from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Connection,
    DateTime,
    Engine,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.schema import CreateSchema

from bridge.errors import PermissionMissing, StateSchemaTooNew
from bridge.names import (
    DEAD_LETTER_REPLAYS_TABLE,
    DEAD_LETTERS_TABLE,
    OFFSET_DELETIONS_TABLE,
    STATE_VERSION_TABLE,
)
from consumers.database import ledger_tables
from consumers.database.offsets import define_tables

if TYPE_CHECKING:
    from alembic.config import Config

# This release's version of the state tables: its newest migration's revision (a unit test holds
# the two together). A schema at it is used as it is, without alembic: importing alembic and
# loading the migrations were a third of the time every consumer took to start.
STATE_HEAD: Final = "0008"
# Any constant works: it only has to be the same for every instance of bridge.
_DDL_LOCK_KEY = 0x62726964  # "brid"


@dataclass(frozen=True)
class StateTables:
    schema: str
    offsets: Table
    dead_letters: Table
    offset_resets: Table
    ledger: ledger_tables.LedgerNames  # whole epochs' tables
    dead_letter_replays: Table  # `bridge dead-letters replay`'s audit trail
    offset_deletions: Table  # `bridge offsets delete`'s

    def qualified(self, table: Table) -> sql.Identifier:
        return sql.Identifier(self.schema, table.name)


def state_tables(schema: str) -> StateTables:
    metadata = MetaData(schema=schema)
    offsets, offset_resets = define_tables(metadata)
    dead_letters = Table(
        DEAD_LETTERS_TABLE,
        metadata,
        Column("id", BigInteger, primary_key=True, autoincrement=True),
        Column("group_id", Text, nullable=False),
        Column("topic", Text, nullable=False),
        Column("partition", Integer, nullable=False),
        Column("offset", BigInteger, nullable=False),
        Column("key", LargeBinary),
        Column("value", LargeBinary),
        Column("headers", JSONB),
        Column("error", Text, nullable=False),
        Column("failed_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        # How many times it was tried: 1, and one more for each replay that failed again.
        Column("attempts", Integer, nullable=False, server_default=text("1")),
        Column("kafka_timestamp_ms", BigInteger),  # None: the record had none, or came before 0003
        # A record is dead-lettered at most once: its offset moves past it in the same transaction.
        UniqueConstraint("group_id", "topic", "partition", "offset"),
    )
    dead_letter_replays = Table(
        DEAD_LETTER_REPLAYS_TABLE,
        metadata,
        Column("id", BigInteger, primary_key=True, autoincrement=True),
        Column("group_id", Text, nullable=False),
        Column("topic", Text, nullable=False),
        Column("partition", Integer, nullable=False),
        Column("offset", BigInteger, nullable=False),
        Column("outcome", Text, nullable=False),  # landed, skipped, dead again
        Column("error", Text),  # the new one, when dead again
        Column("attempt", Integer, nullable=False),
        Column("requested_by", Text, nullable=False),
        Column("replayed_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    )
    offset_deletions = Table(
        OFFSET_DELETIONS_TABLE,
        metadata,
        Column("id", BigInteger, primary_key=True, autoincrement=True),
        Column("group_id", Text, nullable=False),
        Column("topic", Text, nullable=False),
        Column("partition", Integer, nullable=False),
        Column("old_offset", BigInteger, nullable=False),
        Column("old_owner", Text),
        Column("forced", Boolean, nullable=False),
        Column("requested_by", Text, nullable=False),
        Column("deleted_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    )
    ledger_tables.define_tables(metadata)
    return StateTables(
        schema=schema,
        offsets=offsets,
        dead_letters=dead_letters,
        offset_resets=offset_resets,
        ledger=ledger_tables.LedgerNames(schema),
        dead_letter_replays=dead_letter_replays,
        offset_deletions=offset_deletions,
    )


def ensure_state_tables(conn: Connection, tables: StateTables) -> None:
    """Create the schema when missing and migrate its tables to this release's version; commits.

    Refuses, with `StateSchemaTooNew`, a schema that a newer release has migrated further."""
    with conn.begin():
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _DDL_LOCK_KEY})
        exists = conn.execute(
            text("SELECT 1 FROM pg_namespace WHERE nspname = :schema"), {"schema": tables.schema}
        ).first()
        # Not CREATE SCHEMA IF NOT EXISTS: PostgreSQL checks the right to create before it
        # checks existence, and a consumer of least rights owns its schema without that right.
        if exists is None:
            try:
                conn.execute(CreateSchema(tables.schema))
            except ProgrammingError as exc:
                if not isinstance(exc.orig, psycopg.errors.InsufficientPrivilege):
                    raise
                raise PermissionMissing(
                    f"the consumer's role may not create its state schema {tables.schema!r}: "
                    f"create it for the role (CREATE SCHEMA {tables.schema} AUTHORIZATION "
                    "<role>), or grant the role CREATE on the database"
                ) from None
        _migrate(conn, tables.schema)


def state_version(conn: Connection, schema: str) -> str | None:
    """The version of the state tables in `schema`; None before the first migration."""
    from alembic.runtime.migration import MigrationContext  # see STATE_HEAD

    context = MigrationContext.configure(
        conn, opts={"version_table": STATE_VERSION_TABLE, "version_table_schema": schema}
    )
    return context.get_current_revision()


def known_state_version() -> str:
    """The newest version of the state tables this release knows."""
    from alembic.script import ScriptDirectory  # see STATE_HEAD

    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    assert head is not None  # noqa: S101 - the package ships at least its first version
    return head


def _migrate(conn: Connection, schema: str) -> None:
    """Step 1: refuse a version this release does not know (a newer release made it).
    Step 2: run the migrations after the stored version, in the caller's transaction."""
    if _stored_versions(conn, schema) == [STATE_HEAD]:
        return
    from alembic import command
    from alembic.script import ScriptDirectory

    config = _alembic_config()
    found = state_version(conn, schema)
    if found is not None:
        scripts = ScriptDirectory.from_config(config)
        if found not in {script.revision for script in scripts.walk_revisions()}:
            head = scripts.get_current_head() or "none"
            raise StateSchemaTooNew(schema=schema, found=found, known=head)
    config.attributes["connection"] = conn
    config.attributes["schema"] = schema
    command.upgrade(config, "head")


def _stored_versions(conn: Connection, schema: str) -> list[str]:
    """The revisions alembic's version table in `schema` holds; none when it has no such table."""
    table = conn.execute(
        text("SELECT to_regclass(format('%I.%I', CAST(:schema AS text), CAST(:table AS text)))"),
        {"schema": schema, "table": STATE_VERSION_TABLE},
    ).scalar()
    if table is None:
        return []
    return list(conn.execute(text(f"SELECT version_num FROM {table}")).scalars())  # noqa: S608 - a regclass PostgreSQL named


def _alembic_config() -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(files("consumers.database") / "state_migrations"))
    return config


def sqlalchemy_engine(dsn: str) -> Engine:
    """An engine over psycopg for DDL and reflection; takes URL and key=value DSNs alike."""
    return create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn))


def ensure_state(dsn: str, schema: str) -> StateTables:
    """`ensure_state_tables` on a connection of its own."""
    tables = state_tables(schema)
    engine = sqlalchemy_engine(dsn)
    try:
        with engine.connect() as conn:
            ensure_state_tables(conn, tables)
    finally:
        engine.dispose()
    return tables
