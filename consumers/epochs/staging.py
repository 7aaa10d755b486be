"""Whole epochs, the first half: a batch stages what it cannot publish yet.

For a group whose routes want whole epochs, two kinds of topic are written to the ledger
(`consumers.epochs.ledger`) instead of a table, in the batch's own transaction, so that
they commit with their offsets exactly as rows do:

- a **whole topic**'s records (a route with `epochs: whole`) are staged as a chunk per epoch
  (`consumers.epochs.chunks`): the records as Kafka gave them, and, when the planner
  could plan them for their table now (`EpochPlanner`), the statements that write them, which
  the publication runs. They are counted per (query, epoch, Spark partition, topic, Kafka
  partition). Their epoch comes from the sink's provenance headers. A record with none of
  them (another producer's) is of no epoch: it is never staged, and goes to its table in the
  batch that reads it, as in the per-partition mode (`consumers.epochs.assembly`; `apply`
  hands it back). One with some of them only, or with values out of range, claims an epoch it
  does not name: it is a dead letter naming why (it would otherwise wait for a manifest that
  can never name it). A record that cannot be a row leaves its chunk without a plan: it is
  found, and dead-lettered, when its epoch is published, and never holds it back;
- the **manifest topic**'s records (`bridge.epoch_manifest`) become the ledger's rows: a part,
  or the epoch's record. A record that is not one is a dead letter, its error naming the field.

A batch whose records all fit goes as statements (`plan`), in the one message of the pipelined
path; one that holds a dead letter, or a record of no epoch, goes statement by statement
(`apply`).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any, NamedTuple, cast

import psycopg
from confluent_kafka import Message
from psycopg import sql

from bridge.epoch_manifest import Epoch, ManifestError, Part, parse
from bridge.names import (
    PROVENANCE_EPOCH,
    PROVENANCE_PARTITION,
    PROVENANCE_QUERY,
    PROVENANCE_WHOLE,
    WHOLE_EPOCHS,
)
from consumers.database.ledger_tables import LedgerNames
from consumers.database.offsets import PartitionKey
from consumers.decoding.records import Record, offset_of
from consumers.epochs.chunks import (
    CHUNK_COLUMNS,
    Chunk,
    Run,
    copy_binary,
    pack_records,
    sample_stamps,
)
from consumers.epochs.ledger import (
    Ahead,
    EpochKey,
    Judged,
    bare_in_batch,
    publish_in_batch,
    staged_before,
)
from consumers.tables.applier import Applier, DeadLetterNote, Step, run_steps

_MAX_QUERY_ID = 200  # as the manifest bounds it
_MAX_INT64 = (1 << 63) - 1
# Plans one epoch's records of a batch for their table, at staging: the plan packed
# (`consumers.epochs.chunks.pack_plan`), the rows it writes, and what it was made for
# (`consumers.epochs.chunks.plan_fingerprint`); None when it cannot.
EpochPlanner = Callable[[list[Record]], tuple[bytes, int, str] | None]


Headers = list[tuple[str, bytes | None]]
PROVENANCE_HEADERS = (PROVENANCE_QUERY, PROVENANCE_EPOCH, PROVENANCE_PARTITION)
_BRIDGE_HEADERS = (*PROVENANCE_HEADERS, PROVENANCE_WHOLE)


class Provenance(NamedTuple):
    query: str
    epoch: int
    spark_partition: int


def provenance_of(headers: Headers) -> Provenance | str | None:
    """The Spark query, epoch and partition in a record's headers; None when it carries none of
    them (a record of another producer, which its route applies as the per-partition mode does)
    or its sink publishes no manifest (no `bridge.epochs: whole` header: a sink with
    `epochs=per-partition`, or of a release before whole epochs: applied per partition too,
    never waited for); or why they do not name an epoch (some of them only, or values out of
    range)."""
    found: dict[str, bytes | None] = {}
    for name, value in headers:
        if name in _BRIDGE_HEADERS:
            found.setdefault(name, value)
    whole = found.pop(PROVENANCE_WHOLE, None) == WHOLE_EPOCHS
    if not found or not whole:
        return None
    if len(found) < 3:
        absent = sorted(set(PROVENANCE_HEADERS) - set(found))
        return (
            f"no {', '.join(absent)} header beside the sink's other provenance headers: the "
            "route publishes whole epochs, and the record claims an epoch it does not name"
        )
    try:
        query = (found[PROVENANCE_QUERY] or b"").decode()
        epoch = int(found[PROVENANCE_EPOCH] or b"")
        part = int(found[PROVENANCE_PARTITION] or b"")
    except ValueError:  # UnicodeDecodeError is one
        return "the sink's provenance headers are not a query id and two integers"
    if not 0 < len(query) <= _MAX_QUERY_ID or not 0 <= epoch <= _MAX_INT64 or not 0 <= part < 2**31:
        return "the sink's provenance headers are out of range"
    return Provenance(query, epoch, part)


def other_headers(headers: Headers) -> Headers:
    """The headers besides the provenance (which a chunk keeps as its query and epoch and each
    run's Spark partition): none, for most records."""
    return [(n, v) for n, v in headers if n not in _BRIDGE_HEADERS]


def epochs_after(records: Sequence[Record], key: PartitionKey, offset: int) -> set[EpochKey]:
    """The epochs named by the provenance of `records` in partition `key` after `offset`."""
    later = [
        record
        for record in records
        if (record.topic(), record.partition()) == key and offset_of(record) > offset
    ]
    found = (provenance_of(headers) for headers, _ in runs(later))
    return {(o.query, o.epoch) for o in found if isinstance(o, Provenance)}


def runs(records: Sequence[Record]) -> Iterator[tuple[Headers, list[Record]]]:
    """The records in runs that carry the same headers, as a task's records come: the headers
    are read once a run, and compared in C."""
    for headers, run in groupby(records, Message.headers):
        yield cast(Headers, headers or []), list(run)


@dataclass
class Staged:
    """What a statement-by-statement staging wrote."""

    staged: int = 0
    dead_letters: list[DeadLetterNote] = field(default_factory=list)
    # Records without the sink's provenance: not of an epoch, written as any batch's are.
    bare: list[Record] = field(default_factory=list)


@dataclass
class BareOrder:
    """Where a batch's records of no epoch go against the epochs staged before them."""

    behind: dict[PartitionKey, int] = field(default_factory=dict)  # they wait, from there
    before: dict[PartitionKey, frozenset[EpochKey]] = field(default_factory=dict)  # for these
    ahead: dict[PartitionKey, Ahead] = field(default_factory=dict)  # they go ahead of these


class EpochStager:
    def __init__(
        self,
        *,
        ledger: LedgerNames,
        group_id: str,
        manifest_topic: str,
        whole_topic: Callable[[str], bool],
        applier: Applier,
    ) -> None:
        self._ledger = ledger
        self._group = group_id
        self.manifest_topic = manifest_topic
        self._whole_topic = whole_topic
        self._applier = applier  # for the dead letters, written as every route writes them

    def stages(self, topic: str) -> bool:
        """Whether `topic`'s records go to the ledger rather than a table."""
        return topic == self.manifest_topic or self._whole_topic(topic)

    def plan(
        self, topic: str, records: Sequence[Record], plan_epoch: EpochPlanner | None = None
    ) -> list[Step] | None:
        """The statements that stage `records`, each epoch's with its plan by `plan_epoch`
        when there is one; None when a record is a dead letter."""
        if topic == self.manifest_topic:
            try:
                return self._manifest_steps([parse(r.value()) for r in records])
            except ManifestError:
                return None
        found = [(provenance_of(headers), headers, run) for headers, run in runs(records)]
        if not all(isinstance(origin, Provenance) for origin, _, _ in found):
            return None  # a record of no epoch: `apply` tells which
        return self._staging_steps(topic, found, plan_epoch)  # type: ignore[arg-type]

    def apply(self, conn: psycopg.Connection[Any], topic: str, records: Sequence[Record]) -> Staged:
        """Stage `records` in the caller's transaction; a record that claims an epoch it does
        not name is dead-lettered with why, and one without the sink's provenance is left to
        the caller (`Staged.bare`), to be written to its table as any batch's is."""
        done = Staged()

        def dead(record: Record, error: str) -> None:
            done.dead_letters.append(self._applier.dead_letter(conn, record, error))

        if topic == self.manifest_topic:
            for record in records:
                try:
                    run_steps(conn, self._manifest_steps([parse(record.value())]))
                except ManifestError as exc:
                    dead(record, f"not an epoch manifest record: {exc}")
            return done
        kept: list[tuple[Provenance, Headers, list[Record]]] = []
        for headers, run in runs(records):
            origin = provenance_of(headers)
            if origin is None:
                done.bare += run
            elif isinstance(origin, str):
                for record in run:
                    dead(record, origin)
            else:
                kept.append((origin, headers, run))
        if kept:
            run_steps(conn, self._staging_steps(topic, kept, None))  # planned when published
        done.staged = sum(len(run) for _, _, run in kept)
        return done

    def _staging_steps(
        self,
        topic: str,
        found: list[tuple[Provenance, Headers, list[Record]]],
        plan_epoch: EpochPlanner | None,
    ) -> list[Step]:
        """A chunk per epoch of the records, and the counts they add: C loops over each run of
        a task's records (every record of a batch passes here)."""
        group = self._group
        epochs: dict[tuple[str, int], list[Run]] = {}
        counts: Counter[tuple[str, int, int, int]] = Counter()
        firsts: dict[tuple[str, int, int, int], int] = {}  # a run's records are in offset order
        for (query, epoch, part), headers, run in found:
            epochs.setdefault((query, epoch), []).append(Run(run, part, other_headers(headers)))
            for kafka, n in Counter(map(Message.partition, run)).items():
                counts[query, epoch, part, cast(int, kafka)] += n
            # Each partition's first offset in the run: later ones overwritten, in C loops.
            back = run[::-1]
            starts = zip(map(Message.partition, back), map(Message.offset, back), strict=True)
            for kafka, first in dict(starts).items():
                firsts.setdefault((query, epoch, part, cast(int, kafka)), cast(int, first))
        chunks: list[Any] = []  # Chunk tuples: rows of the COPY
        for (query, epoch), of_epoch in epochs.items():
            records = [record for run in of_epoch for record in run.records]
            planned = plan_epoch(records) if plan_epoch is not None else None
            plan, rows, made_for = planned if planned is not None else (None, None, None)
            chunks.append(
                Chunk(group, query, epoch, topic, len(records), rows, pack_records(of_epoch),
                      plan, sample_stamps(records), made_for)
            )  # fmt: skip
        columns = sql.SQL(", ").join(map(sql.Identifier, CHUNK_COLUMNS))
        copy = Step(
            sql.SQL("COPY {} ({}) FROM STDIN (FORMAT binary)").format(self._ledger.chunks, columns),
            chunks,
            copy_binary(chunks),
        )
        rows_of = (
            (group, query, epoch, part, topic, kafka, n, firsts[query, epoch, part, kafka])
            for (query, epoch, part, kafka), n in sorted(counts.items())
        )
        values = sql.SQL(", ").join(
            sql.SQL("({})").format(sql.SQL(", ").join(map(sql.Literal, row))) for row in rows_of
        )
        # Staged in offset order, a row's first offset is its first batch's; a row staged
        # before migration 0005 keeps its NULL (where it begins is not known).
        count = Step(
            sql.SQL(
                "INSERT INTO {} AS s (group_id, query, epoch, spark_partition, topic, partition, "
                "records, first_offset) VALUES {} ON CONFLICT (group_id, query, epoch, "
                "spark_partition, topic, partition) DO UPDATE SET records = s.records + "
                "EXCLUDED.records, first_offset = CASE WHEN s.first_offset IS NOT NULL THEN "
                "least(s.first_offset, EXCLUDED.first_offset) END"
            ).format(self._ledger.staged, values)
        )
        return [copy, count]

    def publish_steps(
        self, epochs: Sequence[EpochKey], judged: Mapping[EpochKey, Judged]
    ) -> list[Step]:
        """The statements that settle `epochs` as published by the batch that writes their
        records, in order, or refuse it (`consumers.epochs.ledger.publish_in_batch`)."""
        return [
            Step(statement)
            for epoch in epochs
            for statement in publish_in_batch(self._ledger, self._group, epoch, judged[epoch])
        ]

    def bare_steps(
        self, firsts: dict[PartitionKey, int], ahead: Mapping[PartitionKey, Ahead]
    ) -> list[Step]:
        """The statement that refuses a batch writing records of no epoch after records staged
        in their partitions, other than those it writes them `ahead` of
        (`consumers.epochs.ledger.bare_in_batch`); none without such records."""
        if not firsts:
            return []
        return [Step(bare_in_batch(self._ledger, self._group, firsts, ahead))]

    def behind_staged(
        self,
        conn: psycopg.Connection[Any],
        bare: Sequence[Record],
        records: Sequence[Record],
        planned: Mapping[PartitionKey, Ahead] | None = None,
    ) -> BareOrder:
        """Where `bare` (records of no epoch among `records`, `Staged.bare`) begin in the
        partitions in which records of an epoch are staged before them: those wait for its
        publication. Unless every such epoch has records after them, in `records` or by the
        assembly's plan for the batch (`planned`: it knew them from the parts' offset ranges,
        past the batch's end): those go ahead of it (`Ahead`), as the assembly has them go."""
        spans: dict[PartitionKey, tuple[int, int, int]] = {}
        for record in bare:
            key = cast(PartitionKey, (record.topic(), record.partition()))
            first, _, n = spans.get(key, (offset_of(record), 0, 0))
            spans[key] = (first, offset_of(record), n + 1)
        firsts = {key: first for key, (first, _, _) in spans.items()}
        found = BareOrder()
        for key, before in staged_before(conn, self._ledger, self._group, firsts).items():
            first, last, n = spans[key]
            # The plan's `Ahead` spans the batch's records of no epoch there, these among them.
            known = planned[key].epochs if planned and key in planned else frozenset()
            if before <= epochs_after(records, key, last) | known:
                found.ahead[key] = Ahead(first, last, frozenset(before), n)
            else:
                found.behind[key] = first
                found.before[key] = frozenset(before)
        return found

    def _manifest_steps(self, documents: list[Part | Epoch]) -> list[Step]:
        """The ledger's rows of the manifest's records, in at most five statements however many
        records (a statement or two a record read a catching-up manifest at 5,700 records a
        second). Other queries, and other groups', share the manifest topic: an epoch is kept
        only once a part of it names a topic this group holds back; the record of an epoch the
        group does not keep clears its parts. The parts go in before the epoch records: a part
        precedes its epoch's record in the log (a replayed task writing none), so this is the
        log's order. Of one part, or one epoch's record, the first seen is kept, as across
        batches."""
        parts: dict[tuple[str, int, int], Part] = {}
        kept: dict[EpochKey, None] = {}
        records: dict[EpochKey, Epoch] = {}
        topics: set[tuple[str, str]] = set()  # (query, topic): the group's whole topics named
        for document in documents:
            if isinstance(document, Part):
                parts.setdefault((document.query, document.epoch, document.partition), document)
                ours = {t for t, n in document.records.items() if n and self._whole_topic(t)}
                if ours:
                    kept.setdefault((document.query, document.epoch))
                    topics.update((document.query, t) for t in ours)
            else:
                records.setdefault((document.query, document.epoch), document)
        group = sql.Literal(self._group)
        # A part of an epoch at or below its query's watermark is a replay's (the epoch is
        # settled, its row perhaps pruned): it would open the epoch again, for ever.
        unsettled = sql.SQL(
            "NOT EXISTS (SELECT FROM {} AS w WHERE w.group_id = {} AND w.query = d.query "
            "AND w.settled_through >= d.epoch)"
        ).format(self._ledger.watermarks, group)
        steps = []
        if parts:
            written = [{"query": q, "epoch": e, "spark_partition": n, "records": dict(d.records)}
                       for (q, e, n), d in parts.items()]  # fmt: skip
            steps.append(Step(sql.SQL(
                "INSERT INTO {} (group_id, query, epoch, spark_partition, records) "
                "SELECT {}, d.query, d.epoch, d.spark_partition, d.records FROM "
                "jsonb_to_recordset({}::jsonb) AS d(query text, epoch bigint, "
                "spark_partition integer, records jsonb) WHERE {} ON CONFLICT DO NOTHING"
            ).format(self._ledger.parts, group, _rows(written), unsettled)))  # fmt: skip
        if kept:
            steps.append(Step(sql.SQL(
                "INSERT INTO {} (group_id, query, epoch) SELECT {}, d.query, d.epoch FROM "
                "jsonb_to_recordset({}::jsonb) AS d(query text, epoch bigint) WHERE {} "
                "ON CONFLICT DO NOTHING"
            ).format(self._ledger.epochs, group, _rows(_keys(kept)), unsettled)))  # fmt: skip
        if topics:
            # Which queries share a topic, for the members' ownership: a row a (query, topic),
            # its time moved at most hourly (a row lock otherwise), pruned once unseen for the
            # manifest's retention (`ledger.prune_settled`).
            pairs = [{"query": q, "topic": t} for q, t in sorted(topics)]
            steps.append(Step(sql.SQL(
                "INSERT INTO {} AS n (group_id, query, topic) SELECT {}, d.query, d.topic FROM "
                "jsonb_to_recordset({}::jsonb) AS d(query text, topic text) "
                "ON CONFLICT (group_id, query, topic) DO UPDATE SET seen_at = now() "
                "WHERE n.seen_at < now() - interval '1 hour'"
            ).format(self._ledger.topics, group, _rows(pairs))))  # fmt: skip
        if records:
            # The same epoch record twice (a replayed commit hook) changes nothing.
            named = [{"query": q, "epoch": e, "parts": list(d.parts)}
                     for (q, e), d in records.items()]  # fmt: skip
            steps.append(Step(sql.SQL(
                "UPDATE {} AS e SET parts = coalesce(e.parts, d.parts), "
                "manifest_at = coalesce(e.manifest_at, now()) FROM jsonb_to_recordset({}::jsonb) "
                "AS d(query text, epoch bigint, parts integer[]) WHERE e.group_id = {} "
                "AND e.query = d.query AND e.epoch = d.epoch"
            ).format(self._ledger.epochs, _rows(named), group)))  # fmt: skip
            steps.append(Step(sql.SQL(
                "DELETE FROM {} AS p USING jsonb_to_recordset({}::jsonb) AS d(query text, "
                "epoch bigint) WHERE p.group_id = {} AND p.query = d.query AND p.epoch = d.epoch "
                "AND NOT EXISTS (SELECT FROM {} AS e WHERE e.group_id = {} AND e.query = d.query "
                "AND e.epoch = d.epoch)"
            ).format(self._ledger.parts, _rows(_keys(records)), group, self._ledger.epochs,
                     group)))  # fmt: skip
        return steps


def _keys(epochs: Mapping[EpochKey, object]) -> list[dict[str, Any]]:
    return [{"query": query, "epoch": epoch} for query, epoch in epochs]


def _rows(rows: list[dict[str, Any]]) -> sql.Literal:
    """Rows for `jsonb_to_recordset`, as one literal: one statement for a batch's records."""
    return sql.Literal(json.dumps(rows, separators=(",", ":")))
