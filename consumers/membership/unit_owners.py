"""Which member reads each query's whole routes (`epochs_members: one`): the group's Spark queries
spread over its members, one member a unit, by PostgreSQL advisory locks of a session of its
own, taken and kept by a thread.

A **unit** is the queries that write a common topic (`consumers.epochs.units`); a topic no
manifest names is in no unit, and every member reads it.

Each turn (`_EVERY_S`) the thread:
1. holds a **slot**, the lowest free of the group's member locks, taken once per session;
2. reads the units, and the live slots from `pg_locks` (a dead member's session, and its locks,
   end with its socket; one cut off from the database, within its TCP keepalives);
3. assigns the units in the order of their names to the live slots in turn (`assign`), so no
   member owns more than ceil(Q/N) of Q units while another owns none;
4. takes the lock of each unit assigned to it (held by the unit's last owner until that one lets
   go, at its next turn, or dies), and lets go of the units no longer assigned to it;
5. publishes what it owns (`Owned`), which the poll loop reads between batches.

Nothing depends on it for correctness: two members that both read a unit's topics for a moment
(a view of the slots one turn old, a session dropped before its thread notices) share their
partitions, and the ledger stages and judges each epoch as with `epochs_members: all`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from consumers.database.db_session import DatabaseSession
from consumers.database.ledger_tables import LedgerNames
from consumers.epochs.units import Owned, Unit, assign, units_of

log = logging.getLogger("bridge.consumer")


_EVERY_S = 1.0  # how often a member looks at the units and the slots, and checks its session
_SLOTS = 1024  # member locks tried, from the lowest: more members than this share the last
_KEEPALIVES = (  # as the election's: a member cut off loses its locks within about 11 s
    "SET tcp_keepalives_idle = 5",
    "SET tcp_keepalives_interval = 2",
    "SET tcp_keepalives_count = 3",
)
# The live slots: the member locks granted in this database, pg_locks read once (a lock of one
# bigint key shows there as its high and low 32 bits, classid and objid, with objsubid 1).
_LIVE_SLOTS = """
WITH held AS MATERIALIZED (
    SELECT l.classid, l.objid FROM pg_locks AS l
    WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
), slots AS (
    SELECT s.slot, hashtextextended(%(name)s || s.slot, 0) AS key
    FROM generate_series(0, %(slots)s - 1) AS s(slot)
)
SELECT s.slot FROM slots AS s JOIN held AS h
ON h.classid = ((s.key >> 32) & 4294967295)::oid AND h.objid = (s.key & 4294967295)::oid
"""


class UnitOwners:
    """The thread of `Owned`: see the module's docstring."""

    def __init__(
        self,
        *,
        db: DatabaseSession,
        ledger: LedgerNames,
        group_id: str,
        name: str,  # the locks' names: the state schema and the group
        whole_topic: Callable[[str], bool],
        every_s: float = _EVERY_S,
    ) -> None:
        self._db = db
        self._ledger = ledger
        self._group = group_id
        self._members = f"bridge-members:{name}:"
        self._units = f"bridge-unit:{name}:"
        self._whole_topic = whole_topic
        self._every_s = every_s
        self._slot: int | None = None
        self._held: dict[str, Unit] = {}  # the units whose locks this session holds, by name
        self.owned = Owned()
        self._problem: str | None = None
        self._turned = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bridge-unit-owners", daemon=True)

    def start(self, *, wait_s: float) -> None:
        """Start; wait at most `wait_s` for the first turn, so that a member that owns units at
        start subscribes once, to everything it reads."""
        self._thread.start()
        self._turned.wait(wait_s)

    def close(self) -> None:
        """Stop, and let go of every lock with the session (the next owners take them within a
        turn)."""
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._every_s + 5)
        self._db.close()

    def reasons(self) -> list[str]:
        """For `/readyz`: the locks cannot even be tried (the database is not reachable)."""
        problem = self._problem
        return [] if problem is None else [f"whole routes' owners not known: {problem}"]

    def _run(self) -> None:
        while not self._done.is_set():
            try:
                self._turn()
            except psycopg.Error as exc:
                self._lost(str(exc).strip() or type(exc).__name__)
            else:
                if self._problem is not None:
                    log.info("the whole routes' owners are known again")
                self._problem = None
            self._turned.set()
            self._done.wait(self._every_s)

    def _turn(self) -> None:
        conn = self._db.open_connection()
        if conn is None:
            conn = self._db.connect()
            for statement in _KEEPALIVES:
                conn.execute(statement)
        if self._slot is None:
            self._slot = self._take_slot(conn)
        named = [
            (str(query), str(topic))
            for query, topic in conn.execute(
                sql.SQL("SELECT query, topic FROM {} WHERE group_id = %s").format(
                    self._ledger.topics
                ),
                (self._group,),
            )
            if self._whole_topic(str(topic))
        ]
        units = units_of(named)
        live = [int(row[0]) for row in conn.execute(
            _LIVE_SLOTS, {"slots": _SLOTS, "name": self._members}
        )]  # fmt: skip
        mine = {unit.name: unit for unit in assign(units, live).get(self._slot, [])}
        for unit_name in [n for n in self._held if n not in mine]:
            conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))",
                         (self._units + unit_name,))  # fmt: skip
            del self._held[unit_name]
            log.info("this member no longer reads unit %s", unit_name)
        for unit_name, unit in mine.items():
            if unit_name in self._held:
                self._held[unit_name] = unit  # its topics as they are now
            elif self._try(conn, self._units + unit_name):  # else its last owner still holds it
                self._held[unit_name] = unit
                log.info(
                    "this member reads unit %s now",
                    unit_name,
                    extra={"topics": sorted(unit.topics), "queries": sorted(unit.queries)},
                )
        self.owned = Owned(
            topics=frozenset(t for unit in self._held.values() for t in unit.topics),
            named=frozenset(t for unit in units for t in unit.topics),
            queries={q: unit.name in self._held for unit in units for q in unit.queries},
        )

    def _take_slot(self, conn: psycopg.Connection[Any]) -> int:
        for slot in range(_SLOTS):
            if self._try(conn, f"{self._members}{slot}"):
                return slot
        return _SLOTS - 1  # more members than slots: the last ones share it, and its units

    @staticmethod
    def _try(conn: psycopg.Connection[Any], name: str) -> bool:
        row = conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (name,))
        found = row.fetchone()
        return bool(found and found[0])

    def _lost(self, why: str) -> None:
        """The session, and every lock of it, is gone: nothing is owned until a turn takes
        them again. Said once per outage, not per turn: `/readyz` names it meanwhile."""
        self._db.close()
        if self._problem is None:
            log.warning(
                "the whole routes' owners cannot be known: the database cannot be asked (%s); "
                "trying every %.0fs", why, self._every_s,
            )  # fmt: skip
        self._problem = why
        if self._held:
            log.warning("this member no longer reads units %s: its database session (which "
                        "held their locks) was lost: %s", sorted(self._held), why)  # fmt: skip
        self._slot, self._held = None, {}
        self.owned = Owned(named=self.owned.named)  # still another member's, as last known
