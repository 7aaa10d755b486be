"""Which member of a group reads its whole routes (`epochs_members: one`): the one whose session
holds a PostgreSQL advisory lock named after the group, taken and kept by a thread of its own.

A member holding every partition of an epoch's topics publishes it in the batch that completes
it, each record written once (`consumers.epochs.assembly`); members sharing them stage every
epoch in the ledger and publish it later, writing it twice. So one member at a time reads the
whole routes' topics and the manifest, and the others read the group's per-partition routes and
stand by. On 2 cores one member is also faster than two sharing the partitions
(bench/results/consumer-scale-latest.json): a group that needs more splits its routes into
groups, each with an owner of its own.

Why a lock of a session: it lives exactly as long as the owner's connection. An owner that dies
(SIGKILL, out of memory) closes its socket, and the server drops the lock at once; one cut off
from the database loses it when the server's TCP keepalives, set short on this connection, find
it gone (`_KEEPALIVES`: about 11 s). A standby tries every `_EVERY_S`, then subscribes to the
whole topics; the group hands their partitions over when the old owner's Kafka session ends
(`session.timeout.ms`, 6 s by default). docs/consumer.md gives the bound.

Why a thread: the poll loop never waits on the database for it; it reads `holds` between
batches. Nothing depends on the election for correctness: two members that both believe they
hold it (an owner whose connection the server dropped, before its thread notices) share the
partitions for a moment, and the ledger stages and judges each epoch as with `all`.
"""

from __future__ import annotations

import logging
import threading

import psycopg

from consumers.database.db_session import DatabaseSession

log = logging.getLogger("bridge.consumer")

_EVERY_S = 1.0  # how often a standby tries the lock, and the owner checks its session
_KEEPALIVES = (
    "SET tcp_keepalives_idle = 5",
    "SET tcp_keepalives_interval = 2",
    "SET tcp_keepalives_count = 3",
)


class EpochOwnerElection:
    def __init__(self, *, db: DatabaseSession, name: str, every_s: float = _EVERY_S) -> None:
        self._db = db
        self._name = name  # the lock's name: the state schema and the group
        self._every_s = every_s
        self._holds = False
        self._problem: str | None = None
        self._turned = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bridge-epochs-owner", daemon=True)

    @property
    def holds(self) -> bool:
        """Whether this member's session held the lock at the thread's last turn."""
        return self._holds

    def start(self, *, wait_s: float) -> None:
        """Start electing; wait at most `wait_s` for the first try, so that a member that
        becomes the owner at start subscribes once, to everything."""
        self._thread.start()
        self._turned.wait(wait_s)

    def close(self) -> None:
        """Stop, and release the lock with the session (a standby takes it within a turn)."""
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._every_s + 5)
        self._db.close()

    def reasons(self) -> list[str]:
        """For `/readyz`: the lock cannot even be tried (the database is not reachable)."""
        problem = self._problem
        return [] if problem is None else [f"whole epochs' owner not elected: {problem}"]

    def _run(self) -> None:
        while not self._done.is_set():
            try:
                self._turn()
            except psycopg.Error as exc:
                self._lost(str(exc).strip() or type(exc).__name__)
            else:
                self._tried_again()
            self._turned.set()
            self._done.wait(self._every_s)

    def _tried_again(self) -> None:
        if self._problem is not None:
            log.info(
                "the whole routes' owner can be elected again (this member %s the lock)",
                "holds" if self._holds else "stands by without",
            )
        self._problem = None

    def _turn(self) -> None:
        conn = self._db.open_connection()
        if conn is None:
            conn = self._db.connect()
            for statement in _KEEPALIVES:
                conn.execute(statement)
        if self._holds:
            conn.execute("SELECT 1")  # the session, and so the lock, still lives
            return
        row = conn.execute(
            "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (self._name,)
        ).fetchone()
        if row is not None and row[0]:
            self._holds = True
            log.info("this member reads the whole routes' topics now", extra={"lock": self._name})

    def _lost(self, why: str) -> None:
        """Once per outage, not per turn: `/readyz` names it meanwhile."""
        self._db.close()
        if self._problem is None:
            log.warning(
                "the whole routes' owner cannot be elected: the lock cannot be tried (%s); "
                "trying every %.0fs", why, self._every_s,
            )  # fmt: skip
        self._problem = why
        if self._holds:
            self._holds = False
            log.warning(
                "this member no longer reads the whole routes' topics: its database session "
                "(which held the lock) was lost: %s", why,
            )  # fmt: skip
