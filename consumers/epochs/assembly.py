"""Whole epochs in memory first: a member holding every partition an epoch wrote to publishes it
in the batch that completes it, its records written once, as the per-partition mode writes them.

Staging (`consumers.epochs.staging`) writes an epoch's records twice, to the ledger and,
once the publisher (`consumers.epochs.publisher`) finds the epoch whole, to their tables;
on 2 cores that ran whole epochs at 0.36x the per-partition mode (bench/epochs.py). Yet a member
that holds all of a topic's partitions sees each epoch whole, in a batch or two, and its
manifest with it. For each batch, `assemble`:

1. puts the records held back from the batches before (their offsets not advanced) in front of
   this poll's, partition by partition. A partition fetched again (its records start at or
   before the held ones' last: a rewind) drops them, since the fetch brings them again; so do
   one no longer this member's and one whose lease moved past them (an operator's reset);
2. learns the manifest's records in the batch: each epoch's parts and its epoch record, first
   seen kept, as the ledger keeps them; what this member did not read (committed before it
   joined) is asked of the ledger between batches (`asking`, answered by the publisher's next
   look), at most every `_LOOK_AGAIN_S` an epoch;
3. counts the whole topics' records per epoch (each record's epoch found from the manifest's
   offsets, or else its provenance headers: `consumers.epochs.placement`) and finds the epochs
   the batch **publishes**: the epoch record is known, every part is in hand, record for record
   (`EpochState.lacks`, the judge's rule), every whole topic it wrote to has all its partitions
   here, none of it was staged, and no earlier epoch of its query is in hand unpublished or
   staged. Their records are planned for their tables like any batch's, and
   `ledger.publish_in_batch` settles each epoch in the same transaction, or refuses the batch
   when the ledger disagrees: its judge (`epoch_lacks`), with the batch's records counted, finds
   the epoch lacking, or an earlier epoch is open, records were staged by another member, or it
   knows a part this member never saw. A refused batch is written again statement by statement,
   staging everything, exactly as without this module. Records without the sink's
   provenance (another producer's, on the same route) are of no epoch: they go to their table
   in this batch, as in the per-partition mode, unless a record before them in their
   partition is held back (step 4), when they wait with it;
4. **holds back**, per partition, the records from the first one of an epoch that may yet
   complete here: its topics all held in full, waiting less than `hold_s`, while the held
   records number at most `hold_records`. Their offsets do not advance, so a crash loses
   nothing: they are fetched again. Everything else is **staged**, as before: an epoch spread
   over several members, one waiting too long (a slow task, a manifest late), more than the
   bound holds, a record without provenance (a dead letter, naming why).

Nothing here is a guarantee: the ledger's judge in the batch's transaction is. This module only
forecasts, with the judge's rule in memory (`EpochState.lacks`), which way is likely to pass
it, and costs a rolled-back batch when it is wrong.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import chain
from typing import NamedTuple

from bridge.epoch_manifest import ManifestError, Part, parse
from consumers.database.offsets import PartitionKey
from consumers.decoding.records import Record, offset_of
from consumers.epochs.ledger import Ahead, EpochKey, EpochState, Judged, Manifest
from consumers.epochs.placement import Placed as _Run
from consumers.epochs.placement import Placement

_KNOWN_EPOCHS = 10_000  # manifests remembered; the oldest forgotten first (staged, then)
_LOOK_AGAIN_S = 0.5  # the ledger asked again about an epoch whose manifest is not all known
_STAGED_GRACE_S = 1.0  # a batch's commit, after it staged, before the ledger shows it


@dataclass(frozen=True)
class PendingEpochs:
    """What one batch holds pending of whole epochs until its outcome: the epochs it publishes
    itself and those it stages. Made by `assemble`, settled with the batch (`settled`) when it
    commits, and dropped with it when it does not (`drop`): nothing is recorded as staged, or
    forgotten as published, before the commit."""

    publishing: tuple[EpochKey, ...] = ()
    staging: frozenset[EpochKey] = frozenset()


@dataclass(frozen=True)
class Assembled:
    """What one batch commits, and how."""

    records: dict[PartitionKey, list[Record]]  # every record the batch advances over
    # Whole topics' records it writes to their tables: those of the epochs it publishes, and
    # those without the sink's provenance, in their partitions' order.
    published: dict[str, list[Record]]
    staged: dict[str, list[Record]]  # whole topics' records it stages
    epochs: tuple[EpochKey, ...] = ()  # the epochs it publishes, in order
    # What each published epoch was judged whole with, for the ledger's check.
    judged: dict[EpochKey, Judged] = field(default_factory=dict)
    pending: PendingEpochs = PendingEpochs()  # settled or dropped with the batch
    # Where the records of no epoch it writes begin, per partition, for the ledger's check.
    bare_firsts: dict[PartitionKey, int] = field(default_factory=dict)
    # Partitions it cuts at records of no epoch behind records staged: the member holds them
    # there until the epoch is published (`BatchLifecycle`), and fetches them again then.
    behind: dict[PartitionKey, int] = field(default_factory=dict)
    bare_records: list[Record] = field(default_factory=list)  # of no epoch, for the latency
    # Partitions whose records of no epoch it writes ahead of epochs staged before them, whose
    # records lie on both sides of them (`EpochAssembly._cuts`).
    ahead: dict[PartitionKey, Ahead] = field(default_factory=dict)


class _Cuts(NamedTuple):
    """Where a batch's partitions are cut (`EpochAssembly._cuts`)."""

    at: dict[PartitionKey, int]  # each partition's first run held back
    publishing: set[EpochKey]
    stops: set[PartitionKey]
    ahead: dict[PartitionKey, Ahead]


@dataclass
class _Known:
    """An epoch as the manifest told this member."""

    parts: tuple[int, ...] | None = None
    written: dict[int, dict[str, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class LedgerLook:
    """What one look of the publisher at the ledger found, for the assembly: the staged epochs
    this member published, the epochs the ledger holds open as read at `as_of` (monotonic;
    None when it was not read this time), and the manifests of the epochs the assembly asked
    about (`EpochAssembly.asking`; None when they were not read)."""

    published: tuple[EpochKey, ...] = ()
    still_open: frozenset[EpochKey] | None = None
    as_of: float = 0.0
    manifests: dict[EpochKey, Manifest] | None = None


class EpochAssembly:
    def __init__(
        self,
        *,
        group_id: str,
        manifest_topic: str,
        whole_topic: Callable[[str], bool],
        held_in_full: Callable[[str], bool],
        hold_records: int,
        hold_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._group = group_id
        self._manifest_topic = manifest_topic
        self._whole_topic = whole_topic
        self._held_in_full = held_in_full  # this member holds every partition of the topic
        self._hold_records = hold_records
        self._hold_s = hold_s
        self._clock = clock  # monotonic seconds; a test's own clock moves only when told
        self._looked: dict[EpochKey, float] = {}  # when the ledger was last asked about each
        self._asking: list[EpochKey] = []  # epochs whose manifest the next look reads
        self._answered = False  # a look brought manifests since the last batch
        self._known: dict[EpochKey, _Known] = {}
        self._placement = Placement(whole_topic)  # where the parts read say their records are
        self._held: dict[PartitionKey, list[_Run]] = {}
        self._waiting: dict[EpochKey, float] = {}  # epochs held back, since when
        # Epochs with records staged (here, or by a batch refused and written again), since
        # when their batch committed: later epochs of their query wait for their publication.
        self._staged: dict[EpochKey, float] = {}
        # The batches assembled and not yet settled, in order: what they stage holds later
        # epochs back as if it were staged already (it will be, if they commit).
        self._pending: list[PendingEpochs] = []
        # The partitions each epoch had records in, in the batches assembled here: one staged
        # holds back, in those partitions, the epochs of any query after it (`_publishing`).
        self._partitions: dict[EpochKey, set[PartitionKey]] = {}
        # A batch brought records of an epoch, or a part naming a whole topic: the group has
        # epochs (until then its publisher need not look at the ledger).
        self.saw_epochs = False

    # -- the lifecycle's calls ----------------------------------------------------------------

    def holding(self) -> int:
        return sum(len(run.records) for held in self._held.values() for run in held)

    def due(self) -> bool:
        """Records are held for an epoch that has waited its time: a batch must stage them,
        even with no new record."""
        if self._held and self._answered:
            return True  # the ledger completed a manifest: the held records may publish now
        now = self._clock()
        return bool(self._held) and any(now - t >= self._hold_s for t in self._waiting.values())

    def drop(self) -> None:
        """The positions went back to the stored offsets: what is held is fetched again, and
        the batches not settled are dropped (their records come again too)."""
        self._held.clear()
        self._waiting.clear()
        self._pending.clear()

    def settled(self, pending: PendingEpochs, *, published: bool) -> None:
        """The batch that held `pending` committed: by publishing its epochs, or, refused as a
        whole and written again, by staging them; and what it staged is staged."""
        self._pending = [p for p in self._pending if p is not pending]
        now = self._clock()
        for epoch in pending.publishing:
            if published:
                self._known.pop(epoch, None)
            else:
                self._staged.setdefault(epoch, now)
        for epoch in pending.staging:
            self._staged.setdefault(epoch, now)

    def asking(self) -> list[EpochKey]:
        """The epochs whose manifest the ledger is to be asked about, between batches: a batch
        found their records and not all of their manifest (step 2), and, every
        `_LOOK_AGAIN_S`, the held ones whose manifest is still not whole: an answer that came
        before the member staging the manifest had it all is asked again without waiting for
        a batch (the manifest's partition may be another member's)."""
        now = self._clock()
        again = [
            epoch
            for epoch in self._waiting
            if epoch not in self._asking
            and not self._manifest_known(epoch)
            and now - self._looked.get(epoch, -_LOOK_AGAIN_S) >= _LOOK_AGAIN_S
        ]
        for epoch in again:
            self._looked[epoch] = now
        self._asking = sorted({*self._asking, *again})
        return list(self._asking)

    def looked(self, look: LedgerLook) -> None:
        """What the publisher's last look at the ledger found."""
        for key in look.published:
            self.published(key)
        if look.still_open is not None:
            self.still_open(set(look.still_open), as_of=look.as_of)
        if look.manifests is not None:
            self._answered, self._asking = bool(look.manifests), []
            for epoch, (parts, written) in look.manifests.items():
                known = self._known.get(epoch) or self._remember(epoch)
                known.parts = known.parts or parts
                for part, records in written.items():
                    known.written.setdefault(part, records)

    def staged_before(self, found: Mapping[PartitionKey, Iterable[EpochKey]]) -> None:
        """The ledger holds these epochs staged before records of no epoch in these partitions
        (a batch written statement by statement found them): staged by a member before this
        one, perhaps. Known as staged here, they hold their later records back no more, and
        the records of no epoch may go ahead of them."""
        now = self._clock()
        for key, epochs in found.items():
            for epoch in epochs:
                self._staged.setdefault(epoch, now)
                self._partitions.setdefault(epoch, set()).add(key)

    def published(self, key: EpochKey) -> None:
        """The publisher published a staged epoch."""
        self._known.pop(key, None)
        self._staged.pop(key, None)

    def still_open(self, keys: set[EpochKey], *, as_of: float) -> None:
        """The epochs the ledger holds open (or with records staged), read at `as_of`
        (monotonic): one staged here and settled since by someone else (another member's
        publication, an operator's discard) no longer holds its query's later epochs back.
        One staged by a batch that had not committed by then is kept, for a second."""
        self._staged = {
            epoch: since
            for epoch, since in self._staged.items()
            if epoch in keys or since > as_of - _STAGED_GRACE_S
        }

    # -- a batch ------------------------------------------------------------------------------

    def assemble(
        self,
        ours: dict[PartitionKey, list[Record]],
        *,
        stored: Callable[[PartitionKey], int | None],
    ) -> Assembled:
        """Steps 1 to 4 for the records a poll brought (`ours`, this member's, by partition);
        `stored`: where a partition's lease says its next batch starts, None once it is not
        this member's to apply."""
        self._answered = False
        records, found = self._with_held(ours, stored)  # step 1
        for (topic, _), of_key in ours.items():  # step 2
            if topic == self._manifest_topic:
                self._learn(of_key)
        now = self._clock()
        for key, of_key in ours.items():  # step 3; the held records' headers were read
            topic = key[0]
            if topic == self._manifest_topic or not self._whole_topic(topic):
                continue
            found.setdefault(key, []).extend(self._placement.runs(key, of_key))
        in_hand: dict[EpochKey, Counter[tuple[int, str]]] = {}
        seen_in: dict[EpochKey, set[PartitionKey]] = {}
        for key, of_epochs in found.items():
            for found_run in of_epochs:
                if found_run.epoch is not None:
                    self.saw_epochs = True
                    counts = in_hand.setdefault(found_run.epoch, Counter())
                    counts[found_run.spark_partition, key[0]] += len(found_run.records)
                    seen_in.setdefault(found_run.epoch, set()).add(key)
        if not found:
            return Assembled(records, {}, {})
        self._consult(in_hand, now)
        # From the batches before this one only: what this one brings of a staged epoch is
        # after them, not before, and `_cuts` orders the batch's own runs.
        behind_staged = self._behind_staged(in_hand)
        for epoch, keys in seen_in.items():
            self._partitions.setdefault(epoch, set()).update(keys)
        publishing = self._publishing(in_hand, behind_staged)
        for epoch in in_hand:
            self._waiting.setdefault(epoch, now)
        staged_here = self._staged_or_pending()
        may_wait = {
            epoch
            for epoch in in_hand
            if epoch not in publishing
            and epoch not in staged_here
            and now - self._waiting[epoch] < self._hold_s
            and all(self._held_in_full(topic) for _, topic in in_hand[epoch])
            and all(self._held_in_full(t) for t in self._topics(epoch))
        }
        cut = self._cuts(found, publishing, may_wait, behind_staged)  # step 4
        held = sum(_after(found[key], at) for key, at in cut.at.items() if key not in cut.stops)
        if held > self._hold_records:  # too many: none held
            cut = self._cuts(found, publishing, set(), behind_staged)
        return self._split(records, found, cut, in_hand)

    # -- steps --------------------------------------------------------------------------------

    def _with_held(
        self, ours: dict[PartitionKey, list[Record]], stored: Callable[[PartitionKey], int | None]
    ) -> tuple[dict[PartitionKey, list[Record]], dict[PartitionKey, list[_Run]]]:
        """Every record of the batch by partition, and the runs of those held before."""
        records = dict(ours)
        found = {}
        for key, held in self._held.items():
            next_offset = stored(key)
            if next_offset is None or offset_of(held[0].records[0]) < next_offset:
                continue  # revoked, or its offset reset past them: not ours to apply
            fresh = records.get(key, [])
            if fresh and offset_of(fresh[0]) <= offset_of(held[-1].records[-1]):
                continue  # fetched again from the stored offset: the fetch brings them
            records[key] = list(chain.from_iterable(run.records for run in held)) + fresh
            found[key] = list(held)
        self._held = {}
        return records, found

    def _learn(self, records: list[Record]) -> None:
        for record in records:
            try:
                document = parse(record.value())
            except ManifestError:
                continue  # the stager dead-letters it, naming why
            key = (document.query, document.epoch)
            if isinstance(document, Part):
                if any(n and self._whole_topic(t) for t, n in document.records.items()):
                    self.saw_epochs = True
                known = self._known.get(key) or self._remember(key)
                known.written.setdefault(document.partition, dict(document.records))
                self._placement.learn(document)
            else:
                known = self._known.get(key) or self._remember(key)
                known.parts = known.parts or tuple(sorted(document.parts))

    def _remember(self, key: EpochKey) -> _Known:
        known = self._known[key] = _Known()
        if len(self._known) > _KNOWN_EPOCHS:
            del self._known[next(iter(self._known))]
        return known

    def _consult(self, in_hand: dict[EpochKey, Counter[tuple[int, str]]], now: float) -> None:
        """The epochs in hand whose manifest this member has not seen whole, for the ledger to
        be asked about between batches (`asking`): their first records may have been committed
        before this member (re)joined. At most every `_LOOK_AGAIN_S` an epoch. Meanwhile their
        records are held, as for a manifest still to come."""
        wanted = [
            epoch
            for epoch in in_hand
            if not self._manifest_known(epoch)
            and now - self._looked.get(epoch, -_LOOK_AGAIN_S) >= _LOOK_AGAIN_S
        ]
        self._looked = {e: t for e, t in self._looked.items() if e in in_hand}
        for epoch in wanted:
            self._looked[epoch] = now
        self._asking = sorted({e for e in self._asking if e in in_hand} | set(wanted))

    def _staged_or_pending(self) -> set[EpochKey]:
        """Epochs staged, or staged by a batch that has not settled yet."""
        return set(self._staged).union(*(p.staging for p in self._pending))

    def _manifest_known(self, epoch: EpochKey) -> bool:
        known = self._known.get(epoch)
        return (
            known is not None
            and known.parts is not None
            and all(part in known.written for part in known.parts)
        )

    def _topics(self, epoch: EpochKey) -> set[str]:
        known = self._known.get(epoch)
        if known is None:
            return set()
        return {
            t for w in known.written.values() for t, n in w.items() if n and self._whole_topic(t)
        }

    def _behind_staged(
        self, in_hand: dict[EpochKey, Counter[tuple[int, str]]]
    ) -> dict[PartitionKey, set[EpochKey]]:
        """The partitions in which an epoch staged here has records, and those epochs: theirs
        come first there, and the publisher applies them first (`ledger.comes_first`)."""
        staged_here = self._staged_or_pending()
        self._partitions = {
            e: keys for e, keys in self._partitions.items() if e in in_hand or e in staged_here
        }
        behind: dict[PartitionKey, set[EpochKey]] = {}
        for epoch, keys in self._partitions.items():
            if epoch in staged_here:
                for key in keys:
                    behind.setdefault(key, set()).add(epoch)
        return behind

    def _publishing(
        self,
        in_hand: dict[EpochKey, Counter[tuple[int, str]]],
        behind_staged: dict[PartitionKey, set[EpochKey]],
    ) -> set[EpochKey]:
        """The epochs this batch can publish: whole in hand, in order within their query, and
        in none of the partitions of an epoch staged here (of any query)."""
        publishing: set[EpochKey] = set()
        blocked: set[str] = set()
        staged_here = self._staged_or_pending()
        for epoch in sorted(in_hand):
            query, number = epoch
            staged = [n for q, n in staged_here if q == query]
            if (
                query in blocked
                or any(n <= number for n in staged)
                or not self._whole(epoch, in_hand[epoch])
                or not self._partitions.get(epoch, set()).isdisjoint(behind_staged)
            ):
                blocked.add(query)
                continue
            publishing.add(epoch)
        return publishing

    def _whole(self, epoch: EpochKey, counts: Counter[tuple[int, str]]) -> bool:
        known = self._known.get(epoch)
        if known is None or known.parts is None:
            return False
        state = EpochState(self._group, *epoch, parts=known.parts, written=known.written,
                           staged=dict(counts))  # fmt: skip
        if state.lacks(self._whole_topic):
            return False
        return all(self._held_in_full(topic) for topic in self._topics(epoch))

    def _cuts(
        self,
        found: dict[PartitionKey, list[_Run]],
        publishing: set[EpochKey],
        may_wait: set[EpochKey],
        behind_staged: dict[PartitionKey, set[EpochKey]],
    ) -> _Cuts:
        """Per partition, the index of its first run held back (all after it are too), the
        epochs still published (one with a run held back is not, nor are its query's later
        ones, and the cuts are found again), and the partitions cut at records of no epoch
        behind records staged (`stops`): written now, they would be overwritten by the earlier
        ones at the epoch's publication, so they wait for it, from their partition's hold.
        Unless each such epoch has records after them in their partition too (in hand, or
        named by its parts): then the epoch cannot be whole before they are passed, and they
        go `ahead` of it, as if written before its tasks (an epoch is visible when it commits).
        """
        publishing, may_wait = set(publishing), set(may_wait)
        while True:
            cuts: dict[PartitionKey, int] = {}
            stops: set[PartitionKey] = set()
            ahead: dict[PartitionKey, Ahead] = {}
            for key, of_key in found.items():
                waits = (i for i, run in enumerate(of_key) if run.epoch in may_wait)
                cut = next(waits, len(of_key))
                before = set(behind_staged.get(key, ()))  # epochs staged before, unpublished
                for i, run in enumerate(of_key[:cut]):
                    if run.bare and before:
                        last = offset_of(run.records[-1])
                        if not before <= self._after(key, of_key[i + 1 :], last):
                            cut = i
                            stops.add(key)
                            break
                        first = offset_of(run.records[0])
                        was = ahead.get(key)
                        ahead[key] = Ahead(
                            was.first if was else first, last,
                            (was.epochs if was else frozenset()) | before,
                            (was.records if was else 0) + len(run.records),
                        )  # fmt: skip
                    if run.epoch is not None and run.epoch not in publishing:
                        before.add(run.epoch)
                cuts[key] = cut
            split = {
                epoch
                for key, of_key in found.items()
                for epoch, _, _, _ in of_key[cuts[key] :]
                if epoch in publishing
            }
            # A run published after one staged in its partition would overtake it: staged too.
            behind: set[EpochKey] = set()
            for key, of_key in found.items():
                staged_before = False
                for run in of_key[: cuts[key]]:
                    if run.epoch is None:
                        continue  # a dead letter's: never applied
                    if run.epoch not in publishing:
                        staged_before = True
                    elif staged_before:
                        behind.add(run.epoch)
            if not split and not behind:
                return _Cuts(cuts, publishing, stops, ahead)
            for query in {q for q, _ in split}:  # and its later epochs, which wait for it
                first_split = min(n for q, n in split if q == query)
                later = {(q, n) for q, n in publishing if q == query and n >= first_split}
                publishing -= later
                may_wait |= later
            for query in {q for q, _ in behind}:
                first_behind = min(n for q, n in behind if q == query)
                publishing -= {(q, n) for q, n in publishing if q == query and n >= first_behind}

    def _after(self, key: PartitionKey, runs: list[_Run], offset: int) -> set[EpochKey]:
        """The epochs with records in `key` after `offset`: in hand (`runs`), or named by the
        parts read."""
        in_hand = {run.epoch for run in runs if run.epoch is not None}
        return in_hand | self._placement.epochs_after(key, offset)

    def _split(
        self,
        records: dict[PartitionKey, list[Record]],
        found: dict[PartitionKey, list[_Run]],
        cutting: _Cuts,
        in_hand: dict[EpochKey, Counter[tuple[int, str]]],
    ) -> Assembled:
        cuts, publishing, stops = cutting.at, cutting.publishing, cutting.stops
        kept = dict(records)
        published: dict[str, list[Record]] = {}
        staged: dict[str, list[Record]] = {}
        staged_epochs: set[EpochKey] = set()
        waiting: set[EpochKey] = set()
        bare_firsts: dict[PartitionKey, int] = {}
        bare_records: list[Record] = []
        behind: dict[PartitionKey, int] = {}
        for key, of_key in found.items():
            cut = cuts[key]
            topic = key[0]
            for epoch, _, run, bare in of_key[:cut]:
                if bare or epoch in publishing:
                    published.setdefault(topic, []).extend(run)
                    if bare and run:
                        bare_firsts.setdefault(key, offset_of(run[0]))
                        bare_records += run
                else:
                    staged.setdefault(topic, []).extend(run)
                    if epoch is not None:
                        staged_epochs.add(epoch)
            if key in stops:  # fetched again once the partition's hold is over
                behind[key] = offset_of(of_key[cut].records[0])
                before = len(records[key]) - _after(of_key, cut)
                if before:
                    kept[key] = records[key][:before]
                else:
                    del kept[key]
                continue
            held = of_key[cut:]
            waiting |= {run.epoch for run in held if run.epoch is not None}
            if held:
                self._held[key] = held
                before = len(records[key]) - sum(len(run.records) for run in held)
                if before:
                    kept[key] = records[key][:before]
                else:
                    del kept[key]
        self._waiting = {e: t for e, t in self._waiting.items() if e in waiting}
        epochs = tuple(sorted(e for e in publishing if e not in staged_epochs))
        pending = PendingEpochs(epochs, frozenset(staged_epochs))
        if pending.publishing or pending.staging:
            self._pending.append(pending)
        firsts: dict[EpochKey, dict[tuple[str, int], int]] = {}
        for key, of_key in found.items():
            for placed in of_key[: cuts[key]]:
                if placed.epoch in publishing and placed.records:
                    first = offset_of(placed.records[0])
                    firsts.setdefault(placed.epoch, {}).setdefault(key, first)
        judged = {}
        for epoch in epochs:
            known = self._known[epoch]
            counted: dict[int, dict[str, int]] = {}
            for (part, topic), n in sorted(in_hand[epoch].items()):
                counted.setdefault(part, {})[topic] = n
            judged[epoch] = Judged(
                parts=tuple(sorted(set(known.parts or ()) | set(known.written))),
                held_back=tuple(sorted(
                    {t for w in known.written.values() for t in w if self._whole_topic(t)}
                )),
                counted=counted,
                firsts=firsts.get(epoch, {}),
            )  # fmt: skip
        return Assembled(
            kept, published, staged, epochs, judged, pending, bare_firsts, behind, bare_records,
            cutting.ahead,
        )  # fmt: skip


def _after(of_key: list[_Run], cut: int) -> int:
    return sum(len(run.records) for run in of_key[cut:])
