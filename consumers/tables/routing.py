"""Which table each topic's records go to, as a `Target`, checked against the table.

A named topic is routed at start-up, and a table that cannot take its records refuses the start
(ConfigError). A topic a pattern matched is routed the first time its records come, or at
start-up when Kafka lists it then; while its table cannot take them (missing, without a column,
not granted) `route` raises RouteUnresolved, and the records wait. A route with `auto_create` or
`auto_evolve` comes with the `TableFollower` that keeps its table in step with the writer schemas.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from bridge.errors import BridgeError, ConfigError, PermissionMissing
from bridge.settings import ConsumerSettings, RouteSettings
from consumers.database.state import sqlalchemy_engine
from consumers.decoding.registry_schemas import SchemaCache
from consumers.tables.table_follower import TableFollower, follow_table
from consumers.tables.targets import Target, reflect_target

log = logging.getLogger("bridge.consumer")

_CONNECT_TIMEOUT_S = 10  # reading a followed table again: a database that does not answer

Routed = tuple[Target, TableFollower | None]


class RouteUnresolved(BridgeError):
    """A topic a pattern matched whose table cannot take its records yet (missing, lacking a
    column, not granted): not the records' fault, so they wait, as for a table mismatch."""

    def __init__(self, message: str, *, topic: str) -> None:
        super().__init__(message)
        self.topic: str | None = topic  # whose partitions wait


class Router:
    def __init__(self, *, dsn: str, config: ConsumerSettings, schemas: SchemaCache | None) -> None:
        self._dsn = dsn
        self._config = config
        self._schemas = schemas

    def named(self, engine: Engine) -> dict[str, Routed]:
        """At start-up: each topic a route names, checked against its table. A table that
        cannot take the records refuses the start: every route's problems in one ConfigError,
        so that a configuration with three mistakes takes one run to see them (or
        PermissionMissing, when a grant is all that is missing)."""
        routed: dict[str, Routed] = {}
        problems: list[tuple[str, str]] = []
        missing: PermissionMissing | None = None
        for index, route in enumerate(self._config.routes):
            if route.topic is None:
                continue
            try:
                routed[route.topic] = self._routed(engine, index, route)
            except ConfigError as exc:
                problems += exc.problems
            except PermissionMissing as exc:
                problems.append((f"consumer.routes.{index}.table", str(exc)))
                missing = missing or exc
        if len(problems) == 1 and missing is not None:
            raise missing
        if problems:
            raise ConfigError(problems)
        return routed

    def matched(self, topics: list[str]) -> dict[str, Routed]:
        """At start-up: the topics among `topics` a pattern matches, routed as the named ones
        are (a table that cannot take them refuses the start)."""
        engine = sqlalchemy_engine(self._dsn)
        try:
            found = {}
            for topic in sorted(topics):
                route = self._config.route_for(topic)
                if route is not None:
                    found[topic] = self._routed(engine, *route)
            return found
        finally:
            engine.dispose()

    def route(self, topic: str) -> Routed:
        """A topic a pattern matched, routed once its records come: RouteUnresolved while its
        table cannot take them (missing, without a column, not granted), or no route reads it."""
        found = self._config.route_for(topic)
        if found is None:
            raise RouteUnresolved(f"no route reads topic {topic}", topic=topic)
        index, route = found
        engine = sqlalchemy_engine(self._dsn)
        try:
            routed = self._routed(engine, index, route)
        except ConfigError as exc:
            problems = "; ".join(f"{path}: {message}" for path, message in exc.problems)
            raise RouteUnresolved(
                f"topic {topic} into {route.table}: {problems}", topic=topic
            ) from None
        except (PermissionMissing, SQLAlchemyError, psycopg.Error) as exc:
            raise RouteUnresolved(f"topic {topic} into {route.table}: {exc}", topic=topic) from None
        finally:
            engine.dispose()
        log.info("topic routed", extra={"topic": topic, "route": index, "table": route.table})
        return routed

    def _routed(self, engine: Engine, index: int, route: RouteSettings) -> Routed:
        """A topic's target (its route as it applies to it), checked against its table; with
        the follower that keeps the table in step, for auto routes."""
        if route.auto_create or route.auto_evolve:
            assert self._schemas is not None  # noqa: S101 - settings need the registry
            follower = follow_table(engine, route, index, self._schemas, self._connect)
            return follower.target or follower.placeholder(), follower
        return reflect_target(engine, route, index, schemas=self._schemas), None

    def _connect(self) -> psycopg.Connection[Any]:
        """A connection of its own, for reading a followed table again (the session's may have
        a batch in flight)."""
        return psycopg.connect(self._dsn, autocommit=True, connect_timeout=_CONNECT_TIMEOUT_S)
