"""When a member reads the whole routes, and when it asks the ledger about them: the policy of
whole epochs in a group, apart from the loop that wires it (`consumers.service`).

- **Looks.** The publisher looks at the ledger from the group's first epoch on: at start when a
  route names `epochs: whole` or the ledger knows an epoch of the group; later when a batch
  brings records of an epoch, or when partitions are claimed and the ledger then knows an epoch
  (a member that dies leaves its staged epochs to the one taking its partitions, which may never
  see an epoch's record itself, yet publishes them). A group whose topics no bridge sink writes
  (whole epochs by default only) never pays the looks, nor waits for them while the database is
  out of reach.
- **Ownership** (`epochs_members: one`). Each unit of the group's queries (those that write a
  common topic) is read by one member, the units spread over the members
  (`consumers.membership.unit_owners`): started at start when a route names `epochs: whole`,
  else once the ledger knows an epoch, so that a group whose topics no sink writes keeps
  sharing its partitions (and opens no session for it).
- **Subscription.** While no ownership is known, a member reads every whole route; then the
  topics of its units and those no unit names (`owned`), which the loop subscribes to again
  when they change.

Each step takes the loop's monotonic time as an argument, and the database and the ownership as
callables, so the policy is tested with neither Kafka nor PostgreSQL (tests/unit).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from consumers.database.offsets import PartitionKey
from consumers.epochs.units import Owned

log = logging.getLogger("bridge.consumer")

_ASK_AGAIN_S = 1.0  # after claims the database could not answer for: the reconcile interval
FIRST_ELECTION_S = 5.0  # a member's first try for the whole routes, before it subscribes


class Owners(Protocol):
    """Who reads each unit (`consumers.membership.unit_owners.UnitOwners`)."""

    @property
    def owned(self) -> Owned: ...

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
        elect: Callable[[], Owners],  # the member's share of the units, not yet started
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
        self.owners: Owners | None = None
        self.looks = True  # decided by `start`
        self._claims_asked: frozenset[PartitionKey] = frozenset()
        self._claims_ask_at = 0.0  # when the database could not say, asked again then

    def start(self) -> None:
        """As the member joins: whether its publisher looks from the start, and, with one
        member reading the whole routes, its first try for them (waited for, so that a member
        elected at start subscribes once, to everything)."""
        self.looks = self._named_whole or bool(self._whole_epochs and self._knows_epochs())
        if self._one_member and (self._named_whole or self.looks):
            self._start_owners()

    def owned(self) -> Owned | None:
        """What the member reads of the whole routes; None while the group's ownership is not
        known (every member reads every whole route)."""
        return None if self.owners is None else self.owners.owned

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
        if self.owners is None and self._one_member and publisher_knows_epochs:
            log.info("the group's ledger knows an epoch: its queries spread over its members")
            self._start_owners()

    def reasons(self) -> list[str]:
        return [] if self.owners is None else self.owners.reasons()

    def close(self) -> None:
        """After the member left its group: the other members take its units."""
        if self.owners is not None:
            self.owners.close()

    def _start_owners(self) -> None:
        self.owners = self._elect()
        self.owners.start(wait_s=self._first_election_s)
