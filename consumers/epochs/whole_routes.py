"""When a member reads the whole routes, and when it asks the ledger about them: the policy of
whole epochs in a group, apart from the loop that wires it (`consumers.service`).

- **Looks.** The publisher looks at the ledger from the group's first epoch on: at start when a
  route names `epochs: whole` or the ledger knows an epoch of the group; later when a batch
  brings records of an epoch, or when partitions are claimed and the ledger then knows an epoch
  (a member that dies leaves its staged epochs to the one taking its partitions, which may never
  see an epoch's record itself, yet publishes them). A group whose topics no bridge sink writes
  (whole epochs by default only) never pays the looks, nor waits for them while the database is
  out of reach.
- **Election** (`epochs_members: one`). One member at a time reads the whole routes' topics and
  the manifest (`consumers.membership.epoch_owner`): tried at start when a route names `epochs:
  whole`, else once the ledger knows an epoch, so that a group whose topics no sink writes keeps
  sharing its partitions (and opens no session for an election).
- **Subscription.** A member subscribes to the whole routes' topics while no election is held,
  or while it holds it; the loop subscribes again when that changes (`resubscribe_due`).

Each step takes the loop's monotonic time as an argument, and the database and the election as
callables, so the policy is tested with neither Kafka nor PostgreSQL (tests/unit).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from consumers.database.offsets import PartitionKey

log = logging.getLogger("bridge.consumer")

_ASK_AGAIN_S = 1.0  # after claims the database could not answer for: the reconcile interval
FIRST_ELECTION_S = 5.0  # a member's first try for the whole routes, before it subscribes


class Election(Protocol):
    """Who reads the whole routes (`consumers.membership.epoch_owner.EpochOwnerElection`)."""

    @property
    def holds(self) -> bool: ...

    def start(self, *, wait_s: float) -> None: ...

    def close(self) -> None: ...

    def reasons(self) -> list[str]: ...


class WholeRoutes:
    def __init__(
        self,
        *,
        whole_epochs: bool,  # a route wants whole epochs, named or by default
        named_whole: bool,  # a route names `epochs: whole`
        one_member: bool,  # `epochs_members: one`
        knows_epochs: Callable[[], bool | None],  # the ledger; None: the database cannot say
        elect: Callable[[], Election],  # a new election, not yet started
        ask_again_s: float = _ASK_AGAIN_S,
        first_election_s: float = FIRST_ELECTION_S,
    ) -> None:
        self._whole_epochs = whole_epochs
        self._named_whole = named_whole
        self._one_member = one_member
        self._knows_epochs = knows_epochs
        self._elect = elect
        self._ask_again_s = ask_again_s
        self._first_election_s = first_election_s
        self.election: Election | None = None
        self.looks = True  # decided by `start`
        self._reads_whole = True  # as subscribed (`subscribed`)
        self._claims_asked: frozenset[PartitionKey] = frozenset()
        self._claims_ask_at = 0.0  # when the database could not say, asked again then

    def start(self) -> None:
        """As the member joins: whether its publisher looks from the start, and, with one
        member reading the whole routes, its first try for them (waited for, so that a member
        elected at start subscribes once, to everything)."""
        self.looks = self._named_whole or bool(self._whole_epochs and self._knows_epochs())
        if self._one_member and (self._named_whole or self.looks):
            self._start_election()

    @property
    def reads_whole(self) -> bool:
        """Whether the member is to read the whole routes' topics and the manifest."""
        return self.election is None or self.election.holds

    def subscribed(self, *, whole: bool) -> None:
        """The member subscribed, with the whole routes or without them."""
        self._reads_whole = whole

    def resubscribe_due(self) -> bool:
        """Elected, or no longer: the member subscribes again (the group rebalances)."""
        return self.election is not None and self.election.holds != self._reads_whole

    @property
    def owner(self) -> bool | None:
        """For the metric: whether this member holds the election and reads the whole routes
        (subscribed to them); None with no election."""
        return None if self.election is None else self.election.holds and self._reads_whole

    def claims_meet_epochs(
        self, claimed: frozenset[PartitionKey], *, idle: bool, now: float
    ) -> bool:
        """Before a batch goes, while the publisher does not look yet: whether partitions were
        claimed since the last ask and the group has had epochs. Asked only with no batch in
        flight (`idle`: a claim settles the one in flight first, and the ask uses its
        connection), and at most every `ask_again_s` while the database cannot say."""
        if self.looks:
            return False
        if claimed <= self._claims_asked:
            self._claims_asked = claimed  # a partition revoked and claimed again is new again
            return False
        if not idle or now < self._claims_ask_at:
            return False
        knows = self._knows_epochs()
        if knows is None:
            self._claims_ask_at = now + self._ask_again_s
        else:
            self._claims_asked = claimed
        return bool(knows)

    def after_batch(self, *, claims_met_epochs: bool, epochs_seen: bool) -> None:
        """After a batch: the publisher looks from the group's first epoch on."""
        if not self.looks and (claims_met_epochs or epochs_seen):
            self.looks = True
            log.info("the group has epochs: its publisher looks at the ledger from now on")

    def after_look(self, *, publisher_knows_epochs: bool) -> None:
        """After the publisher's look: with one member reading the whole routes, the first
        try for them once the ledger knows an epoch."""
        if self.election is None and self._one_member and publisher_knows_epochs:
            log.info("the group's ledger knows an epoch: trying for the whole routes")
            self._start_election()

    def reasons(self) -> list[str]:
        return [] if self.election is None else self.election.reasons()

    def close(self) -> None:
        """After the member left its group: a standby takes the whole routes."""
        if self.election is not None:
            self.election.close()

    def _start_election(self) -> None:
        self.election = self._elect()
        self.election.start(wait_s=self._first_election_s)
