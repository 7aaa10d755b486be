"""Everything a batch needs before it is sent, in one call: `plan`.

For the records of one poll, by topic:

1. the topic routed, if no route named it (`consumers.tables.routing`): RouteUnresolved while its
   table cannot take them;
2. a followed table brought in step with the records' writer schemas
   (`consumers.tables.table_follower`): RegistryUnavailable, TableMismatch;
3. what decoding needs fetched (writer schemas), and the fields no column takes reported once
   each, in a line and a count;
4. the statements of each topic (`consumers.tables.applier`), with each COPY's text formatted now
   (`consumers.batch.pipelined.formatted`) while the batch before is still in flight.

The records of a topic whose route wants whole epochs, and those of the epoch manifest, skip
steps 1 to 3: they are staged in the ledger (`consumers.epochs.staging`), and planned as
rows when their epoch is published (`plan(..., publishing=True)`). Those of the epochs the
batch publishes itself (`consumers.epochs.assembly`), and those without the sink's
provenance, are planned as any topic's.

The three errors are infrastructure faults, never a record's: nothing is written or
dead-lettered, and the records are fetched again after a wait. The planner keeps the routed
targets and the followers; what a batch needs of them is handed to the committer as data
(`Planned`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import psycopg
from confluent_kafka import Message

from consumers.batch.pipelined import formatted
from consumers.database.offsets import PartitionKey
from consumers.decoding.records import Record
from consumers.epochs.assembly import Assembled, PendingEpochs
from consumers.epochs.chunks import PlannedStep, pack_plan, plan_fingerprint
from consumers.epochs.ledger import Ahead, EpochKey
from consumers.epochs.staging import EpochPlanner, EpochStager
from consumers.metrics import ConsumerMetrics
from consumers.tables.applier import Applier, EveryStage, Step
from consumers.tables.routing import Routed, Router
from consumers.tables.table_follower import TableFollower, TableMismatch
from consumers.tables.targets import Target

log = logging.getLogger("bridge.consumer")

# At most one line a topic this often about the fields left out of its records.
LEFT_OUT_LOG_S = 60.0


@dataclass
class _LeftOutSince:
    """What was left out of a topic's records since its last line, and when that was."""

    records: int = 0
    fields: Counter[str] = field(default_factory=Counter)
    logged: float = float("-inf")


@dataclass(frozen=True)
class Planned:
    """What one poll's records become before they are sent."""

    targets: dict[str, Target]  # the table of each topic of the batch
    # Each topic's statements, when every record is a row; None: written statement by statement.
    plans: dict[str, list[Step]] | None
    # Changes to followed tables the batch makes first, after the offset advance.
    changes: list[Step]
    # The member follows tables: an error naming a missing column or table may be a drift.
    followed: bool
    # Topics whose records are staged for whole epochs, or are the epoch manifest, and how
    # many records of each are staged.
    staging: frozenset[str] = frozenset()
    staged_records: dict[str, int] = field(default_factory=dict)
    # Epochs the batch publishes itself (`consumers.epochs.assembly`), in order; the rows
    # their records write, per topic; the records, for the latency; and the statements that
    # settle them in the ledger, after every other, or refuse the batch.
    epochs: tuple[EpochKey, ...] = ()
    published_rows: dict[str, int] = field(default_factory=dict)
    published_records: list[Record] = field(default_factory=list)
    bare_records: list[Record] = field(default_factory=list)  # of no epoch, in their tables
    # Where those go ahead of epochs staged before them (`consumers.epochs.ledger.Ahead`).
    ahead: dict[PartitionKey, Ahead] = field(default_factory=dict)
    guards: list[Step] = field(default_factory=list)
    # What the batch holds pending of whole epochs, settled or dropped with its outcome.
    pending: PendingEpochs | None = None


def by_topic(records: dict[PartitionKey, list[Record]]) -> dict[str, list[Record]]:
    of_topic: dict[str, list[Record]] = defaultdict(list)
    for (topic, _), of_partition in records.items():
        of_topic[topic].extend(of_partition)
    return of_topic


class Planner:
    def __init__(
        self,
        *,
        applier: Applier,
        router: Router,
        routed: dict[str, Routed],
        metrics: ConsumerMetrics,
        stager: EpochStager | None = None,
    ) -> None:
        self._applier = applier
        self.stager = stager
        self._router = router
        self._metrics = metrics
        self._left_out: dict[str, _LeftOutSince] = {}
        self._targets: dict[str, Target] = {}
        self._followers: dict[str, TableFollower] = {}
        self.add(routed)

    def __contains__(self, topic: str) -> bool:
        return topic in self._targets

    def add(self, routed: dict[str, Routed]) -> None:
        for topic, (target, follower) in routed.items():
            self._targets[topic] = target
            if follower is not None:
                self._followers[topic] = follower

    def plan(
        self,
        records: dict[PartitionKey, list[Record]],
        conn: psycopg.Connection[Any] | None,
        *,
        in_flight: list[Step],
        publishing: bool = False,
        staged: set[str] | None = None,
        assembled: Assembled | None = None,
    ) -> Planned:
        """Steps 1 to 4 for `records`. `conn`: the session's connection, even while a batch is
        in flight on it (formatting sends nothing); without it the COPY text is formatted when
        sent. `in_flight`: the table changes of the batch in flight, which it makes; should it
        not commit whole, the positions rewind and this batch is dropped and planned again.
        `publishing`: the records are an epoch's, planned for their tables rather than staged;
        `staged`: the upsert staging tables the transaction used before (see `Applier.plan`);
        `assembled`: which whole topics' records are of epochs the batch publishes, planned
        for their tables now, and which are staged."""
        of_topics = by_topic(records)
        staging = {}
        stager = self.stager
        if stager is not None and not publishing:
            staging = {t: of_topics.pop(t) for t in list(of_topics) if stager.stages(t)}
        published: dict[str, list[Record]] = {}
        if assembled is not None:
            # Of a whole topic, the records of the epochs the batch publishes and those of no
            # epoch (without the sink's provenance) go to their tables now; the rest is staged.
            for topic in staging:
                if topic in assembled.published:
                    published[topic] = of_topics[topic] = assembled.published[topic]
                    staging[topic] = assembled.staged.get(topic, [])
        # A whole epoch's records are routed and decoded now too, and each epoch's are planned
        # for their table (the plan runs when the epoch is published); a followed table's are
        # planned when published, against the table as it is then.
        whole = [t for t in staging if stager is not None and t != stager.manifest_topic]
        for topic in [*of_topics, *whole]:  # step 1
            if topic not in self._targets:
                self.add({topic: self._router.route(topic)})
        for topic, of_topic in of_topics.items():  # step 2
            follower = self._followers.get(topic)
            if follower is not None:
                try:
                    follower.follow(
                        list(filter(None, map(Message.value, of_topic))),
                        list(filter(None, map(Message.key, of_topic))),
                    )
                except TableMismatch as exc:
                    first = exc.first_record(of_topic)
                    if first is None:
                        exc.topic = topic
                        raise
                    named = TableMismatch(
                        f"{exc}; first record: topic {topic} partition {first.partition()} "
                        f"offset {first.offset()}"
                    )
                    named.topic, named.writer = topic, exc.writer
                    named.partitions = exc.partitions_at_fault(of_topic)
                    raise named from exc
                if follower.target is not None:
                    self._targets[topic] = follower.target
        targets = {topic: self._targets[topic] for topic in of_topics}
        planned_whole = {t: self._targets[t] for t in whole if t not in self._followers}
        for topic, target in {**planned_whole, **targets}.items():  # step 3
            for of_topic in (of_topics.get(topic, []), staging.get(topic, [])):
                if of_topic:
                    target.prepare(of_topic)
        followers = [f for topic, f in self._followers.items() if topic in of_topics]
        changes = [step for f in followers for step in f.pending_after(in_flight)]
        plans = self._statements(targets, of_topics, conn, set() if staged is None else staged)
        rows = {
            topic: sum(len(s.rows) for s in plan[topic] if s.rows is not None)
            for plan in ([plans] if plans is not None else [])
            for topic in published
        }
        if staging:
            plans = self._staged(plans, staging, conn, planned_whole)
        epochs = assembled.epochs if assembled is not None and published else ()
        return Planned(
            targets,
            plans,
            changes,
            followed=bool(self._followers),
            staging=frozenset(staging),
            staged_records={topic: len(staging[topic]) for topic in whole},
            epochs=epochs,
            published_rows=rows,
            published_records=[r for of_topic in published.values() for r in of_topic],
            bare_records=assembled.bare_records if assembled is not None else [],
            ahead=assembled.ahead if assembled is not None else {},
            guards=self._guards(assembled, epochs),
            pending=assembled.pending if assembled is not None else None,
        )

    def _guards(self, assembled: Assembled | None, epochs: tuple[EpochKey, ...]) -> list[Step]:
        """The ledger's checks of what the batch writes of whole topics: the epochs it
        publishes, and its records of no epoch, which no staged record may come before."""
        if assembled is None or self.stager is None:
            return []
        return [
            *(self.stager.publish_steps(epochs, assembled.judged) if epochs else []),
            *self.stager.bare_steps(assembled.bare_firsts, assembled.ahead),
        ]

    @property
    def follows(self) -> bool:
        """Whether some table is followed: an error naming a missing column may be a drift."""
        return bool(self._followers)

    def made(self, changes: list[Step]) -> None:
        """A batch making `changes` committed: the followed tables have them."""
        if changes:
            for follower in self._followers.values():
                follower.committed(changes)

    def drifted(self) -> None:
        """A followed table changed other than its follower knew: each reads its table again."""
        for follower in self._followers.values():
            follower.drifted()

    def _statements(
        self,
        targets: dict[str, Target],
        of_topics: dict[str, list[Record]],
        conn: psycopg.Connection[Any] | None,
        staged: set[str],
    ) -> dict[str, list[Step]] | None:
        """Step 4: each topic's statements when every record is a row; else None. `staged`:
        the upsert staging tables used before, in the transaction the plans go in."""
        plans = {}
        for topic, of_topic in of_topics.items():
            plan = self._applier.plan(targets[topic], of_topic, staged)
            if plan is None:
                return None
            try:
                plans[topic] = self._formatted(plan, conn)
            except psycopg.Error:  # no I/O here: a value psycopg will not send
                return None  # written statement by statement, which names the record
        return plans

    def _staged(
        self,
        plans: dict[str, list[Step]] | None,
        staging: dict[str, list[Record]],
        conn: psycopg.Connection[Any] | None,
        planned: dict[str, Target],
    ) -> dict[str, list[Step]] | None:
        """Step 4 for the topics staged for whole epochs, each epoch's records with their plan
        where `planned` has their target: None when a record is a dead letter."""
        assert self.stager is not None  # noqa: S101 - only with one is anything staged
        for topic, of_topic in staging.items():
            if not of_topic:
                continue  # every record of the topic is of an epoch the batch publishes
            target = planned.get(topic)
            plan_epoch = None if target is None else self._epoch_planner(target, conn)
            plan = self.stager.plan(topic, of_topic, plan_epoch)
            if plans is None or plan is None:
                return None
            try:
                plans[topic] = [*plans.get(topic, []), *self._formatted(plan, conn)]
            except psycopg.Error:  # a header psycopg will not send: the slow path names it
                return None
        return plans

    def _epoch_planner(
        self, target: Target, conn: psycopg.Connection[Any] | None
    ) -> EpochPlanner | None:
        """An epoch's records of this batch planned for `target`, packed for the ledger, with
        the rows they write; None where `Applier.plan` has no plan (a record that is not a row,
        a mode that counts what it skips), and the records are planned when published."""
        if conn is None:
            return None
        made_for = plan_fingerprint(target)

        def planned(records: list[Record]) -> tuple[bytes, int, str] | None:
            steps = self._applier.plan(target, records, EveryStage())
            if steps is None:
                return None
            try:
                packed = pack_plan([
                    PlannedStep(s.statement.as_bytes(conn),
                                None if s.rows is None else formatted(conn, s.rows))
                    for s in steps
                ])  # fmt: skip
            except psycopg.Error:  # a value psycopg will not send: planned when published
                return None
            return packed, sum(len(s.rows) for s in steps if s.rows is not None), made_for

        return planned

    def fingerprint(self, topic: str) -> str | None:
        """What this member would plan `topic`'s records for now
        (`consumers.epochs.chunks.plan_fingerprint`); None before its route is resolved."""
        target = self._targets.get(topic)
        return None if target is None else plan_fingerprint(target)

    @staticmethod
    def _formatted(plan: list[Step], conn: psycopg.Connection[Any] | None) -> list[Step]:
        if conn is None:
            return plan
        return [
            s if s.rows is None or s.data is not None else s._replace(data=formatted(conn, s.rows))
            for s in plan
        ]

    def report_left_out(self) -> None:
        """The fields `unknown_fields: ignore` left out of the records written since the last
        report: each one counted, and a line naming them per topic, the first at once and then
        at most one a `LEFT_OUT_LOG_S` (with what it left out since the one before), so that
        someone adds the columns, or decides not to, without a line per batch."""
        now = time.monotonic()
        for topic, target in self._targets.items():
            records, fields = target.left_out.take()
            if records:
                self._metrics.ignored_fields(topic).inc(fields.total())
                noted = self._left_out.setdefault(topic, _LeftOutSince())
                noted.records += records
                noted.fields.update(fields)
            since = self._left_out.get(topic)
            if since is None or not since.records or now < since.logged + LEFT_OUT_LOG_S:
                continue
            names = sorted(since.fields)
            log.warning(
                "topic %s: %d record(s) carried field(s) %s that are not columns of %s; left "
                "out (unknown_fields: ignore)",
                topic, since.records, ", ".join(names[:20]), target.route.table,
                extra={"topic": topic, "fields": names[:20], "records": since.records,
                       "table": target.route.table},
            )  # fmt: skip
            since.records, since.fields, since.logged = 0, Counter(), now
