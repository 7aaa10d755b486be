"""The policy of whole routes in a group (`consumers.epochs.whole_routes`): when a member's
publisher looks at the ledger, when it starts reading its share of the units of queries, and
what it subscribes to (`ConsumerSettings.subscription`); with a ledger and an ownership of the
test's own, and the loop's time passed in. And what a service that stops with a batch in flight
counts as applied."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from bridge.settings import load_settings
from consumers.database.offsets import PartitionKey
from consumers.epochs.units import Owned
from consumers.epochs.whole_routes import WholeRoutes
from consumers.service import ConsumerService, _Member


class Owners:
    def __init__(self, owned: Owned) -> None:
        self.owned = owned
        self.waited_s: float | None = None
        self.closed = False

    def start(self, *, wait_s: float) -> None:
        self.waited_s = wait_s

    def close(self) -> None:
        self.closed = True

    def reasons(self) -> list[str]:
        return ["whole routes' owners not known: the test's reason"]


class Ledger:
    """Whether the group has had an epoch, as the database says it (None: it cannot say)."""

    def __init__(self, knows: bool | None = False) -> None:
        self.knows = knows
        self.asked = 0

    def __call__(self) -> bool | None:
        self.asked += 1
        return self.knows


MINE = Owned(topics=frozenset({"orders"}), named=frozenset({"orders", "payments"}))


def policy(
    ledger: Ledger, *, named: bool = False, one: bool = True
) -> tuple[WholeRoutes, list[Owners]]:
    made: list[Owners] = []

    def elect() -> Owners:
        made.append(Owners(MINE))
        return made[-1]

    whole = WholeRoutes(
        whole_epochs=True, named_whole=named, one_member=one, knows_epochs=ledger, elect=elect,
        ask_again_s=1.0, first_election_s=5.0,
    )  # fmt: skip
    return whole, made


A, B = ("orders", 0), ("orders", 1)


def claims(*keys: PartitionKey) -> frozenset[PartitionKey]:
    return frozenset(keys)


def test_a_group_whose_topics_no_sink_writes_neither_looks_nor_elects_and_reads_them_all() -> None:
    ledger = Ledger(knows=False)
    whole, made = policy(ledger)
    whole.start()
    assert not whole.looks and made == [] and whole.owned() is None  # it reads them all
    assert not whole.claims_meet_epochs(claims(A), idle=True, now=0.0)  # asked: it knows none
    for turn in range(1, 10):  # the same claims, batches of no epoch: never asked again
        assert not whole.claims_meet_epochs(claims(A), idle=True, now=float(turn))
        whole.after_batch(claims_met_epochs=False, epochs_seen=False)
        whole.after_look(publisher_knows_epochs=False)
    assert ledger.asked == 2 and not whole.looks and made == []  # at start, and for the claim


def test_a_named_whole_route_looks_and_elects_at_start_waiting_for_the_first_try() -> None:
    ledger = Ledger(knows=False)
    whole, made = policy(ledger, named=True)
    whole.start()
    assert whole.looks and len(made) == 1 and made[0].waited_s == 5.0
    assert ledger.asked == 0  # named: nothing to ask
    assert whole.owned() is MINE


def test_a_member_subscribes_to_its_units_topics_and_those_no_unit_names() -> None:
    settings = load_settings(
        kafka={"bootstrap_servers": "127.0.0.1:9"},
        postgres={"dsn": "postgresql://bridge@127.0.0.1:9/bridge"},
        consumer={"group_id": "g", "epochs_topic": "manifest", "routes": [
            {"topic": "orders", "table": "public.orders"},
            {"topic": "payments", "table": "public.payments"},
            {"topic": "connect-users", "table": "public.users"},
            {"topic": "audit", "table": "public.audit", "epochs": "per-partition"},
            {"topic_pattern": "ledger-.*", "table": "public.ledger"},
            {"topic_pattern": "cdc-.*", "table": "public.cdc"},
        ]},
    ).consumer_to_run()  # fmt: skip
    everything = ["orders", "payments", "connect-users", "audit", "^(ledger-.*)$", "^(cdc-.*)$",
                  "manifest"]  # fmt: skip
    assert settings.subscription() == everything  # the group's ownership not known yet
    listed = ["ledger-eu", "ledger-us", "ledger-new", "cdc-a", "orders", "payments"]
    mine = Owned(topics=frozenset({"orders", "ledger-eu"}),
                 named=frozenset({"orders", "payments", "ledger-eu", "ledger-us"}))  # fmt: skip
    assert settings.subscription(mine.reads, mine.named, listed) == [
        "orders", "connect-users", "audit", "ledger-eu", "ledger-new", "^(cdc-.*)$", "manifest"
    ]  # fmt: skip
    theirs = Owned(topics=frozenset({"payments", "ledger-us"}), named=mine.named)
    assert settings.subscription(theirs.reads, theirs.named, listed) == [
        "payments", "connect-users", "audit", "ledger-new", "ledger-us", "^(cdc-.*)$", "manifest"
    ]  # fmt: skip


def test_with_every_member_reading_them_there_is_no_election() -> None:
    whole, made = policy(Ledger(knows=True), named=True, one=False)
    whole.start()
    whole.after_look(publisher_knows_epochs=True)
    assert whole.looks and made == [] and whole.owned() is None and whole.reasons() == []


def test_a_batch_with_an_epoch_starts_the_looks_and_the_ledger_knowing_one_the_election() -> None:
    whole, made = policy(Ledger(knows=False))
    whole.start()
    whole.after_batch(claims_met_epochs=False, epochs_seen=True)
    assert whole.looks and made == []  # the ledger has not said so yet
    whole.after_look(publisher_knows_epochs=True)
    whole.after_look(publisher_knows_epochs=True)
    assert len(made) == 1  # once
    assert whole.reasons() == made[0].reasons()
    whole.close()
    assert made[0].closed


def test_claims_are_asked_about_between_batches_and_again_only_when_new() -> None:
    ledger = Ledger(knows=False)
    whole, _ = policy(ledger)
    whole.start()
    asked = ledger.asked
    assert not whole.claims_meet_epochs(claims(A), idle=False, now=0.0)  # a batch in flight
    assert ledger.asked == asked
    assert not whole.claims_meet_epochs(claims(A), idle=True, now=0.1)
    assert ledger.asked == asked + 1
    assert not whole.claims_meet_epochs(claims(), idle=True, now=0.2)  # A revoked
    assert not whole.claims_meet_epochs(claims(A), idle=True, now=0.3)  # and claimed again
    assert ledger.asked == asked + 2
    ledger.knows = True  # another member's query wrote an epoch; this member claims B
    assert whole.claims_meet_epochs(claims(A, B), idle=True, now=0.4)
    whole.after_batch(claims_met_epochs=True, epochs_seen=False)
    assert whole.looks
    assert not whole.claims_meet_epochs(claims(A, B, ("orders", 2)), idle=True, now=0.5)
    assert ledger.asked == asked + 3  # once it looks, claims are not asked about


def test_claims_the_database_cannot_answer_for_are_asked_again_a_bound_later() -> None:
    ledger = Ledger(knows=None)
    whole, _ = policy(ledger)
    whole.start()
    asked = ledger.asked
    assert not whole.claims_meet_epochs(claims(A), idle=True, now=10.0)
    assert not whole.claims_meet_epochs(claims(A), idle=True, now=10.9)  # not before the bound
    assert ledger.asked == asked + 1
    ledger.knows = True
    assert whole.claims_meet_epochs(claims(A), idle=True, now=11.0)
    assert ledger.asked == asked + 2


class Batches:
    """A batch in flight when the service stops: settling it applies its records."""

    def __init__(self) -> None:
        self.applied_total = 40

    def settle(self) -> None:
        self.applied_total += 10


def test_a_service_stopping_with_a_batch_in_flight_counts_what_settling_it_applied() -> None:
    settings = load_settings(
        kafka={"bootstrap_servers": "127.0.0.1:9"},
        postgres={"dsn": "postgresql://bridge@127.0.0.1:9/bridge"},
        consumer={"group_id": "g", "routes": [{"topic": "t", "table": "public.t"}]},
    )  # fmt: skip
    service = ConsumerService(settings)  # nothing connects until it starts
    whole, _ = policy(Ledger())
    consumer = SimpleNamespace(close=lambda: None)
    service._member = _Member(  # a member as `start` leaves it, with a batch in flight
        consumer=cast(Any, consumer), batches=cast(Any, Batches()), leases=cast(Any, None),
        publisher=None, sizes=None, whole=whole,
    )  # fmt: skip
    assert service.applied_total == 40
    service.close()
    assert service.applied_total == 50
