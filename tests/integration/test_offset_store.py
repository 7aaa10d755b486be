"""The offsets table's fence, against real PostgreSQL."""

from __future__ import annotations

from dataclasses import replace

import psycopg
import pytest

from consumers.database.offsets import OffsetStore
from consumers.database.state import StateTables
from tests.harness import Endpoints

# In `make check`'s quick loop too.
pytestmark = pytest.mark.quick


def test_one_statement_advances_every_held_partition_and_names_the_ones_not_held(
    stack: Endpoints, names: dict[str, str], state: StateTables
) -> None:
    mine = OffsetStore(schema=state.schema, group_id=names["group"], owner="a")
    theirs = OffsetStore(schema=state.schema, group_id=names["group"], owner="b")
    t = names["topic"]
    with psycopg.connect(stack.dsn, autocommit=True) as conn:
        claimed = mine.claim(conn, {(t, p): 10 for p in range(4)}, lock_wait_ms=1000)
        leases = {lease.partition: lease for lease in claimed}
        theirs.claim(conn, {(t, 1): 0}, lock_wait_ms=1000)  # takes partition 1: a new epoch
        stale = replace(leases[3], next_offset=9)
        with conn.transaction(force_rollback=True):
            fenced = mine.advance(
                conn, [(leases[0], 15), (leases[1], 15), (leases[2], 12), (stale, 12)]
            )
            assert fenced == [(t, 1), (t, 3)]  # taken over; an offset it did not expect
            assert mine.stored(conn, [(t, p) for p in range(4)]) == {
                (t, 0): 15,
                (t, 1): 10,
                (t, 2): 12,
                (t, 3): 10,
            }
        assert mine.advance(conn, [(leases[0], 11)]) == []
        assert mine.stored(conn, [(t, 0)]) == {(t, 0): 11}
