"""The long-running consumer: its poll loop and the wiring of its parts.

read_committed records -> a batch of the partitions this member holds, planned, sent and settled by
its one owner (`consumers.batch.lifecycle`): one PostgreSQL transaction per batch holding the fenced
offset advance and the rows together (`consumers.batch.committer`). Leases follow Kafka's assignment
and the offsets table (`consumers.membership.leases`); the database session comes back on its own
after a lost connection (`consumers.database.db_session`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from bridge.settings import BridgeSettings, ConsumerSettings, LibrdkafkaValue
from consumers.batch.committer import Committer
from consumers.batch.lifecycle import BatchLifecycle, Stage
from consumers.batch.planner import Planner
from consumers.batch.work_log import WorkLog
from consumers.database.db_session import DatabaseSession, at_start, is_lost
from consumers.database.offsets import OffsetStore, PartitionKey
from consumers.database.state import ensure_state_tables, sqlalchemy_engine, state_tables
from consumers.decoding.registry_schemas import SchemaCache
from consumers.epochs.assembly import EpochAssembly
from consumers.epochs.ledger import knows_epochs
from consumers.epochs.publisher import EpochPublisher
from consumers.epochs.staging import EpochStager
from consumers.epochs.whole_routes import WholeRoutes
from consumers.membership.kafka_health import KafkaHealth
from consumers.membership.leases import LeaseKeeper
from consumers.membership.manifest_start import ManifestStart
from consumers.membership.topic_sizes import TopicSizes
from consumers.membership.unit_owners import UnitOwners
from consumers.metrics import ConsumerMetrics, HealthServer
from consumers.partitions import PartitionTable
from consumers.tables.applier import Applier
from consumers.tables.routing import Routed, Router

log = logging.getLogger("bridge.consumer")
# librdkafka's own log lines (a broker refusing connections, a coordinator moving), as records of
# this logger, so that they reach stderr as JSON like every other line of the service instead of
# librdkafka's raw `%3|...` lines. They are forwarded from the polling thread, in its polls.
rdkafka_log = logging.getLogger("bridge.rdkafka")

# Fetch tuning the user may override in kafka.properties. librdkafka stops fetching a partition
# once queued.min.messages (100,000) are queued locally, then waits fetch.queue.backoff.ms, 1 s by
# default, before it fetches again, although the loop drains that queue in a fraction of it:
# catching up after downtime crawled at about 170k records/s with the process mostly idle.
CONSUMER_FETCH_DEFAULTS: dict[str, LibrdkafkaValue] = {"fetch.queue.backoff.ms": 10}
# With the classic protocol, how soon a dead member's partitions move: librdkafka's 45 s session
# held every whole epoch of the group back for over a minute after a SIGKILL (each epoch spans
# the dead member's partitions). Heartbeats come from librdkafka's own thread, so a long batch
# does not miss them; 6 s is the broker's least session (`group.min.session.timeout.ms`).
CLASSIC_SESSION_DEFAULTS: dict[str, LibrdkafkaValue] = {
    "session.timeout.ms": 6_000,
    "heartbeat.interval.ms": 2_000,
}
_METADATA_REFRESH_MS = 10_000
_STATISTICS_INTERVAL_MS = 5_000  # how often librdkafka reports the last stable offsets (lag)
_RECONCILE_INTERVAL_S = 1.0  # how often leases are compared with the offsets table
_STALLED_AFTER_S = 60.0  # /healthz fails when the poll loop has not turned for this long
_LIST_TOPICS_TIMEOUT_S = 10  # the topics patterns match at start-up: a Kafka that does not answer
_LIST_TOPICS_EVERY_S = 10.0  # as librdkafka looks for a pattern's topics (metadata refresh)
_LIST_TOPICS_WAIT_S = 2.0  # between batches: a Kafka slow to answer is asked again later
# The member's own client settings and callbacks (its statistics, health and commits), which the
# manifest's start-up reader (an assigned consumer, never in the group) does without.
_MEMBER_ONLY = frozenset(
    ("group.protocol", "partition.assignment.strategy", "statistics.interval.ms", "stats_cb",
     "error_cb", "on_commit")
)  # fmt: skip


@dataclass
class _Member:
    """What exists once the service is in its group: the client, the batches' owner, the
    leases."""

    consumer: Consumer
    batches: BatchLifecycle
    leases: LeaseKeeper
    publisher: EpochPublisher | None  # with routes that want whole epochs
    sizes: TopicSizes | None  # with them too: the whole topics' partition counts
    whole: WholeRoutes  # when it reads the whole routes, and asks the ledger about them


class ConsumerService:
    def __init__(self, settings: BridgeSettings, *, owner: str | None = None) -> None:
        self._settings = settings
        self._config: ConsumerSettings = settings.consumer_to_run()
        self._dsn = settings.postgres.dsn.get_secret_value()
        self._owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        self._tables = state_tables(self._config.state_schema)
        self._store = OffsetStore(
            schema=self._config.state_schema, group_id=self._config.group_id, owner=self._owner
        )
        self._stop = threading.Event()
        self.metrics = ConsumerMetrics(self._config.group_id)
        self._db = self._session()
        # Writer schemas by id, for the routes whose values are registry-framed (from start).
        self._schemas: SchemaCache | None = None
        self._partitions = PartitionTable(out_of_range_notes=self._out_of_range_notes())
        self._member: _Member | None = None
        self._applied_total = 0  # once stopped; see `applied_total`
        self._next_reconcile = 0.0
        self._behind = False  # the last poll filled a batch: more records are waiting
        self._subscribed: list[str] = []  # what the member is subscribed to (`_subscribe`)
        self._listed: frozenset[str] = frozenset()  # the topics Kafka has (`_list_topics`)
        self._list_at = 0.0  # monotonic: when they are listed again
        self._whole_patterns = any(
            r.epochs == "whole" and r.topic_pattern is not None for r in self._config.routes
        )
        self._owner_queries: set[str] = set()  # the queries the owner metric names
        self._manifest_absent_noted = False  # said once: the manifest topic is not made yet
        self._ended_with: dict[str, Any] | None = None  # `context()` when an error ended the loop
        self._http: HealthServer | None = None
        self._last_turn = time.monotonic()
        self._turns = 0
        self._starting = "creating the state tables and reading the routes' tables"
        self._kafka = KafkaHealth(
            bootstrap_servers=settings.kafka.bootstrap_servers,
            unavailable_after_s=self._config.kafka_unavailable_timeout_ms / 1000,
            security_protocol=str(settings.kafka.properties.get("security.protocol", "plaintext")),
            principal=_principal(settings.kafka.properties),
        )

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Create the state tables, check every route's table, join the group. Refuses a bad
        configuration (missing table or column) before consuming anything. /healthz and /readyz
        are served from the first moment, so that an orchestrator tells a member that starts
        (waiting for its database, say) from one that is dead."""
        self._serve_http()
        try:
            self._start()
        except BaseException:
            self._stop_http()
            raise

    def _start(self) -> None:
        registry = self._settings.schema_registry
        if registry is not None and any(r.needs_registry for r in self._config.routes):
            self._schemas = SchemaCache(
                registry, max_decoded_bytes=self._config.max_decoded_record_bytes
            )
        router = Router(dsn=self._dsn, config=self._config, schemas=self._schemas)
        engine = sqlalchemy_engine(self._dsn)

        def prepare() -> dict[str, Routed]:
            with engine.connect() as conn:
                ensure_state_tables(conn, self._tables)
            return router.named(engine)  # a pattern's topics are routed as they are found

        def waiting(why: str) -> None:
            self._starting, self._last_turn = why, time.monotonic()  # starting, not stalled

        try:
            named = at_start(prepare, stop=self._stop, waiting=waiting)
        except BaseException:
            if self._schemas is not None:
                self._schemas.close()
            raise
        finally:
            engine.dispose()
        self._starting = "routing the topics that patterns match now"
        applier = Applier(tables=self._tables, group_id=self._config.group_id)
        stager = self._stager(applier)
        planner = Planner(
            applier=applier, router=router, routed=named, metrics=self.metrics, stager=stager
        )
        consumer = Consumer(self._kafka_config())
        try:
            self._join(consumer, router, planner, applier)
        except BaseException:  # refused, or failed: nothing is left open (a client left
            # behind would go on connecting, and its callbacks keep this service alive)
            if self._member is not None:
                self._member.whole.close()  # an election's lock with it
            consumer.close()
            self._db.close()
            if self._schemas is not None:
                self._schemas.close()
            raise

    def _join(self, consumer: Consumer, router: Router, planner: Planner, applier: Applier) -> None:
        """Route the topics patterns match now, connect, and join the group."""
        self._route_existing_topics(consumer, router, planner)
        self._starting = "connecting to the database"
        self._db.connect()
        first_read = self._manifest_start()
        if first_read is not None:
            self._starting = "looking for the first records of the whole topics"
            first_read.prepare()  # before the group assigns anything: outside its callbacks
        publisher = self._publisher(planner, applier)
        sizes = None if publisher is None else TopicSizes(self._partitions, self._whole_topics())
        batches = BatchLifecycle(
            planner=planner,
            committer=Committer(
                store=self._store,
                applier=applier,
                timeout_s=self._db.reply_timeout_s,
                stager=planner.stager,
            ),
            table=self._partitions,
            store=self._store,
            db=self._db,
            consumer=consumer,
            metrics=self.metrics,
            work_log=WorkLog(
                dead_letters_table=f"{self._config.state_schema}.{self._tables.dead_letters.name}",
                behind_at=self._config.batch_max_records,
            ),
            mirror_offsets=self._config.mirror_offsets_to_kafka,
            assembly=self._assembly(sizes),
            whole_topic=self._config.whole_topic,
        )
        leases = LeaseKeeper(
            table=self._partitions,
            store=self._store,
            db=self._db,
            config=self._config,
            consumer=consumer,
            batches=batches,
            forget=self.metrics.forget,
            dead_letters_ends=applier.dead_letters_ends,
            manifest_start=first_read,
        )
        whole = WholeRoutes(
            whole_epochs=self._config.whole_epochs,
            named_whole=any(
                r.epochs == "whole" and "epochs" in r.model_fields_set for r in self._config.routes
            ),
            one_member=self._config.epochs_members == "one",
            knows_epochs=self._ledger_knows_epochs,
            elect=self._owners,
        )
        self._member = _Member(consumer, batches, leases, publisher, sizes, whole)
        if self._config.whole_epochs:
            self._starting = "asking the ledger for epochs, trying for the whole routes"
            whole.start()
        topics = self._subscribe(self._member, self._subscription(self._member))
        log.info(
            "consumer started",
            extra={"owner": self._owner, "topics": topics, "http_port": self.http_port},
        )

    def _out_of_range_notes(self) -> dict[str, str]:
        """The manifest's records lost before this group read them (its retention, the sink's
        `epochs.retention.ms`, outlived by a group stopped or behind) are parts of epochs: what
        that means and the way out, after the partition's own reason (docs/operations.md)."""
        if not self._config.whole_epochs:
            return {}
        topic = self._config.epochs_topic
        where = f"--group {self._config.group_id} --schema {self._config.state_schema}"
        return {
            topic: (
                "they were the parts of epochs, which this group cannot judge whole without "
                "them (the sink's epochs.retention.ms deleted them before the group read "
                f"them): reset it (`bridge offsets reset {where} --topic {topic} --to "
                "earliest --execute --force`), then settle each epoch /readyz then names "
                "incomplete (`bridge epochs publish` or `bridge epochs discard`)"
            )
        }

    def _subscription(self, member: _Member) -> list[str]:
        """The routes' topics and the manifest: of the whole routes, while the group's
        ownership is known, those this member reads (its units', and those no unit names)."""
        owned = member.whole.owned()
        if owned is None:
            return self._config.subscription()
        if self._whole_patterns and time.monotonic() >= self._list_at:
            self._list_topics(member.consumer)
        return self._config.subscription(owned.reads, owned.named, self._listed)

    def _subscribe(self, member: _Member, topics: list[str]) -> list[str]:
        """Subscribe to `topics` (the group rebalances); an empty subscription leaves it."""
        if topics:
            leases = member.leases
            member.consumer.subscribe(
                topics, on_assign=leases.on_assign, on_revoke=leases.on_revoke,
                on_lost=leases.on_lost,
            )  # fmt: skip
        else:
            member.consumer.unsubscribe()
        self._subscribed = topics
        self._owner_metric(member)
        return topics

    def _list_topics(self, consumer: Consumer) -> None:
        """The topics Kafka has, which a whole route's pattern may match: a member subscribes
        to those it reads by name once a unit names one of them (between batches; the last
        answer kept when Kafka does not give one)."""
        self._list_at = time.monotonic() + _LIST_TOPICS_EVERY_S
        try:
            self._listed = frozenset(consumer.list_topics(timeout=_LIST_TOPICS_WAIT_S).topics)
        except KafkaException as exc:
            log.warning("topics not listed for the whole routes' patterns: %s", exc)

    def _owner_metric(self, member: _Member) -> None:
        owned = member.whole.owned()
        if owned is None:
            return
        for query in self._owner_queries - set(owned.queries):
            self.metrics.epochs_owner.remove(query)  # its unit is gone (unseen for a week)
        for query, reads in owned.queries.items():
            self.metrics.epochs_owner.labels(query).set(int(reads))
        self._owner_queries = set(owned.queries)

    def _owners(self) -> UnitOwners:
        """This member's share of the group's units of queries (`epochs_members: one`)."""
        return UnitOwners(
            db=self._session(),  # its own: the locks live as long as this session
            ledger=self._tables.ledger,
            group_id=self._config.group_id,
            name=f"{self._config.state_schema}:{self._config.group_id}",
            whole_topic=self._config.whole_topic,
        )

    def _ledger_knows_epochs(self) -> bool | None:
        """Whether the group has had an epoch; None when the database cannot say now (asked
        again after a claim, `WholeRoutes.claims_meet_epochs`). Never reconnects: the loop's
        own reconnection reports an unreachable database."""
        conn = self._db.open_connection()
        if conn is None:
            return None
        try:
            return knows_epochs(conn, self._tables.ledger, self._config.group_id)
        except psycopg.Error as exc:
            if is_lost(exc):  # the loop's next batch reconnects, and says so meanwhile
                self._db.close()
            log.warning("the ledger could not say whether the group has had epochs: %s", exc)
            return None

    def _session(self) -> DatabaseSession:
        return DatabaseSession(
            self._dsn,
            group_id=self._config.group_id,
            session_timeout_ms=self._config.db_session_timeout_ms,
            stop=self._stop,
            on_reconnect=self.metrics.reconnects.inc,
            on_refusal=lambda refusal: self.metrics.refusals(refusal.sqlstate).inc(),
        )

    def _stager(self, applier: Applier) -> EpochStager | None:
        if not self._config.whole_epochs:
            return None
        return EpochStager(
            ledger=self._tables.ledger,
            group_id=self._config.group_id,
            manifest_topic=self._config.epochs_topic,
            whole_topic=self._config.whole_topic,
            applier=applier,
        )

    def _assembly(self, sizes: TopicSizes | None) -> EpochAssembly | None:
        if sizes is None:  # no whole epochs
            return None
        return EpochAssembly(
            group_id=self._config.group_id,
            manifest_topic=self._config.epochs_topic,
            whole_topic=self._config.whole_topic,
            held_in_full=sizes.held_in_full,
            hold_records=self._config.epochs_hold_records,
            hold_s=self._config.epochs_hold_ms / 1000,
        )

    def _whole_topics(self) -> list[str]:
        """The routes' named topics that wait for whole epochs (a pattern's are found later)."""
        return [
            r.topic for r in self._config.routes if r.topic and self._config.whole_topic(r.topic)
        ]

    def _publisher(self, planner: Planner, applier: Applier) -> EpochPublisher | None:
        if not self._config.whole_epochs:
            return None
        return EpochPublisher(
            db=self._session(),  # its own: the batches' may have one in flight
            ledger=self._tables.ledger,
            group_id=self._config.group_id,
            planner=planner,
            applier=applier,
            metrics=self.metrics,
            whole_topic=self._config.whole_topic,
            incomplete_after_s=self._config.epochs_incomplete_after_ms / 1000,
            hold_bound=self._config.epochs_hold_s,
        )

    def _serve_http(self) -> None:
        if self._config.http_port is not None and self._http is None:
            self._http = HealthServer(
                self.metrics,
                host=self._config.http_host,
                port=self._config.http_port,
                healthy=self.healthy,
                not_ready=self.not_ready,
            )
            self._http.start()

    def _stop_http(self) -> None:
        if self._http is not None:
            self._http.stop()
            self._http = None

    def _route_existing_topics(self, consumer: Consumer, router: Router, planner: Planner) -> None:
        """At start-up, the topics patterns match now, routed as the named ones are: a table
        that cannot take them refuses the start (ConfigError). Topics created later, or all of
        them when Kafka cannot be asked now, are routed as their records come."""
        if all(route.topic is not None for route in self._config.routes):
            return
        try:
            topics = consumer.list_topics(timeout=_LIST_TOPICS_TIMEOUT_S).topics
        except KafkaException as exc:
            log.warning("topics not listed at start-up, routed as they come: %s", exc)
            return
        planner.add(router.matched([topic for topic in topics if topic not in planner]))

    def _manifest_start(self) -> ManifestStart | None:
        """With whole epochs, where a manifest partition the group never read starts; read by
        a consumer of its own, assigned and never in a group, with the member's connection."""
        if not self._config.whole_epochs:
            return None
        config = {k: v for k, v in self._kafka_config().items() if k not in _MEMBER_ONLY}
        config |= {
            "group.id": f"{self._config.group_id}.manifest-start",
            "client.id": f"{config.get('client.id', 'bridge-consumer')}-manifest-start",
            "auto.offset.reset": "earliest",
        }
        return ManifestStart(
            manifest_topic=self._config.epochs_topic,
            whole_topic=self._config.whole_topic,
            earliest=self._config.start_policy == "earliest",
            probe_config=config,
            stored=lambda keys: self._db.run(lambda conn: self._store.stored(conn, keys)),
            lookback_s=self._config.epochs_manifest_lookback_ms / 1000,
        )

    def _kafka_config(self) -> dict[str, Any]:
        # Positions come from the database only: nothing is committed to Kafka, and a fetch
        # outside the log is an error rather than a jump.
        overrides: dict[str, LibrdkafkaValue] = {
            "group.id": self._config.group_id,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
            "statistics.interval.ms": _STATISTICS_INTERVAL_MS,
        }
        if self._config.whole_epochs:
            # The manifest topic may come after the member (the sink makes it on its first
            # run): a subscribed topic that does not exist yet is looked for at this interval.
            overrides["topic.metadata.refresh.interval.ms"] = _METADATA_REFRESH_MS
        # Both protocols hand partitions over incrementally, which the leases rely on: a member
        # keeps what it is not asked to give up, with its batch in flight.
        if self._config.group_protocol == "consumer":
            overrides["group.protocol"] = "consumer"
        else:
            overrides["partition.assignment.strategy"] = "cooperative-sticky"
        # Each member by name in `bridge offsets show` and the broker's tools (librdkafka's own
        # is `rdkafka`, the same for every member on a host).
        defaults: dict[str, LibrdkafkaValue] = {
            **CONSUMER_FETCH_DEFAULTS,
            "client.id": f"bridge-consumer-{socket.gethostname()}-{os.getpid()}",
        }
        if self._config.group_protocol == "classic":
            defaults |= CLASSIC_SESSION_DEFAULTS  # the broker owns the session under `consumer`
        config: dict[str, Any] = self._settings.kafka.client_config(defaults=defaults, **overrides)
        config["stats_cb"] = self._on_statistics
        config["error_cb"] = self._kafka.client_error
        config["on_commit"] = _on_mirror_commit
        config["logger"] = rdkafka_log
        return config

    def stop(self) -> None:
        """Ask the loop to stop after the batch in hand (safe from a signal handler)."""
        self._stop.set()

    def run(self) -> None:
        """Consume until `stop`; then leave the group and close. An error that ends the loop
        is raised as it is: closing after it never replaces it."""
        try:
            self._loop()
        except BaseException:
            # What the member held when the error came: closing releases its partitions.
            self._ended_with = self.context()
            try:
                self.close()
            except Exception:  # the batch in flight was cut short by the error itself
                log.warning("closing after an error failed too", exc_info=True)
            raise
        self.close()

    def context(self) -> dict[str, Any]:
        """What an error report says about this member: its group, owner and partitions (as
        they were when an error ended its loop, if one did)."""
        if self._ended_with is not None:
            return self._ended_with
        member = self._member
        return {
            "group": self._config.group_id,
            "owner": self._owner,
            "stage": str(member.batches.stage) if member is not None else None,
            "partitions": {
                f"{lease.topic}[{lease.partition}]": lease.next_offset
                for lease in self._partitions.leases()
            },
        }

    def _loop(self) -> None:
        member = self._member
        assert member is not None, "start() first"  # noqa: S101
        batches = member.batches
        while not self._stop.is_set():
            self._last_turn = time.monotonic()
            self._turns += 1
            if self._last_turn >= self._next_reconcile:
                self._next_reconcile = self._last_turn + _RECONCILE_INTERVAL_S
                member.leases.reconcile()
                topics = self._subscription(member)
                if topics != self._subscribed:  # units taken or let go: the group rebalances
                    self._subscribe(member, topics)
                self._owner_metric(member)
                self.metrics.states(batches.partition_states())
                batches.report()
            if not self._behind:
                batches.settle()  # caught up: nothing to overlap the commit with
            # The database refused a batch, the registry could not answer for one, a table
            # does not fit its schema, or a record stopped its partition.
            retry_at = batches.retry_at
            if self._last_turn < retry_at:
                self._stop.wait(min(1.0, retry_at - self._last_turn))
                continue
            if member.sizes is not None and member.sizes.wanted():
                member.sizes.refresh(member.consumer)  # Kafka's metadata, between batches
            batches.polling()
            messages = member.consumer.consume(
                self._config.batch_max_records, self._config.batch_max_wait_ms / 1000
            )
            self._behind = len(messages) >= self._config.batch_max_records
            if any(map(Message.error, messages)):  # one C loop; errors are rare
                for message in messages:
                    if message.error() is not None:
                        self._kafka_error(message)
                messages = [m for m in messages if m.error() is None]
            self._kafka.check()
            # Before the batch goes: a claim in this poll settled the one in flight first.
            claims_met_epochs = member.publisher is not None and member.whole.claims_meet_epochs(
                frozenset(self._partitions.keys()),
                idle=batches.stage is Stage.IDLE,
                now=self._last_turn,
            )
            if messages or batches.holding_due():
                batches.submit(messages)
            else:
                batches.settle()
            if member.publisher is not None:
                member.whole.after_batch(
                    claims_met_epochs=claims_met_epochs, epochs_seen=batches.epochs_seen()
                )
            if member.publisher is not None and member.whole.looks:
                # A publication, or an epoch the ledger no longer holds open, lets later
                # epochs of its query go in a batch (`consumers.epochs.assembly`).
                batches.epochs_looked(member.publisher.look(batches.epochs_asking()))
                member.whole.after_look(publisher_knows_epochs=member.publisher.knows_epochs)

    def _kafka_error(self, message: Message) -> None:
        error = cast(KafkaError, message.error())  # the caller saw one
        if error.fatal():
            raise KafkaException(error)
        self._kafka.denied(error, group=self._config.group_id, topic=message.topic())
        if (
            error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
            and message.topic() == self._config.epochs_topic
        ):
            # The sink makes the manifest topic with its first epoch: a group started before
            # any is not at fault, and reads it once it exists (metadata refreshed every 10 s).
            if not self._manifest_absent_noted:
                self._manifest_absent_noted = True
                log.info(
                    "the epoch manifest topic %s does not exist yet: the sink makes it with its "
                    "first epoch, and the group reads it from then on", message.topic(),
                )  # fmt: skip
            return
        if error.code() == KafkaError._AUTO_OFFSET_RESET and message.topic() is not None:
            assert self._member is not None  # noqa: S101 - only the running loop gets errors
            self._member.leases.fell_out_of_range(
                cast(PartitionKey, (message.topic(), message.partition()))
            )
            return
        log.warning("kafka error: %s", error.str())

    def close(self) -> None:
        member = self._member
        try:
            if member is not None:
                member.batches.settle()  # the batch in flight commits or rolls back first
        finally:
            if member is not None:  # counted once the batch in flight has settled
                self._applied_total = member.batches.applied_total
            self._member = None
            self._stop_http()
            if member is not None:
                member.consumer.close()  # leaves the group: partitions are revoked and released
                member.whole.close()  # after leaving: a standby takes the whole routes
                if member.publisher is not None:
                    member.publisher.close()
            self._db.close()
            if self._schemas is not None:
                self._schemas.close()

    @property
    def ready(self) -> bool:
        return not self.not_ready()

    def not_ready(self) -> list[str]:
        """Why the member is not ready, one line a reason; empty when it is."""
        if self._member is None:
            return [f"starting: {self._starting}", *self._kafka.reasons()]
        stalled_after = max(_STALLED_AFTER_S, 3 * self._config.batch_max_wait_ms / 1000)
        return (
            self._kafka.reasons()
            + self._member.leases.reasons()
            + self._db.reasons()
            + self._member.batches.reasons()
            + self._partitions.not_progressing(stalled_after_s=stalled_after)
            + (self._member.publisher.reasons() if self._member.publisher is not None else [])
            + self._member.whole.reasons()
        )

    def healthy(self) -> bool:
        """The poll loop turns (a database outage past the reconnect budget stops it)."""
        return time.monotonic() - self._last_turn < max(
            _STALLED_AFTER_S, 3 * self._config.batch_max_wait_ms / 1000
        )

    @property
    def http_port(self) -> int | None:
        return self._http.port if self._http is not None else None

    @property
    def turns(self) -> int:
        """How many times the member's loop has turned: each turn polls Kafka or waits out a
        hold. A caller that must see that nothing happened waits for turns, not for time."""
        return self._turns

    @property
    def applied_total(self) -> int:
        """Records this member applied (rows inserted, upserted or deleted), also once it has
        stopped, for tests and tools in the same process."""
        return self._applied_total if self._member is None else self._member.batches.applied_total

    def _on_statistics(self, report: str) -> None:
        next_offsets = {lease.key: lease.next_offset for lease in self._partitions.leases()}
        caught_up = self._partitions.caught_up(next_offsets)
        self._kafka.brokers(self.metrics.statistics(report, next_offsets, caught_up))


def _on_mirror_commit(error: Any, partitions: list[TopicPartition]) -> None:
    # The mirror is for outside tools only; a failed or refused commit (a partition that just
    # moved to another member) changes nothing here.
    if error is not None:
        log.warning("mirroring offsets to the Kafka group failed: %s", error)


def _principal(properties: Mapping[str, object]) -> str | None:
    """The SASL user the member logs in as, to name in errors; None without SASL."""
    user = properties.get("sasl.username")
    return str(user) if user is not None else None
