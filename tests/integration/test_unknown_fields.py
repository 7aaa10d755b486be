"""A record is never a row it does not fill, on the real stack: Debezium change events, records
of only unknown fields and records with one field too many, on an upsert route keyed by the
record's key, as a plain producer writes them."""

from __future__ import annotations

import pytest

from bridge.kafka_admin import create_topic
from tests.consumer_helpers import drained, produce, running, sample, settings_for, sql
from tests.harness import Endpoints

IGNORED = "bridge_consumer_ignored_fields_total"


def _records() -> list[tuple[bytes, dict[str, object]]]:
    """5 good records, 5 Debezium envelopes, 5 of only unknown fields, 5 with one extra field,
    interleaved so that each kind stands in the middle of a batch, not only at its ends."""
    found: list[tuple[bytes, dict[str, object]]] = []
    for i in range(5):
        found += [
            (str(100 + i).encode(), {"name": f"good-{i}", "amount": i}),
            (str(200 + i).encode(), {"before": None, "after": {"name": "x", "amount": 1},
                                     "source": {"db": "shop"}, "op": "c", "ts_ms": 1}),
            (str(300 + i).encode(), {"coupon": "X", "channel": "web"}),
            (str(400 + i).encode(), {"name": f"extra-{i}", "amount": i, "coupon": "Y"}),
        ]  # fmt: skip
    return found


@pytest.mark.parametrize("policy", ["refuse", "ignore"])
def test_envelopes_and_unknown_fields_never_become_rows_of_nulls(
    stack: Endpoints, names: dict[str, str], policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    create_topic(stack.bootstrap_servers, names["topic"], partitions=1)
    table = f"public.{names['table']}"
    sql(stack, f"CREATE TABLE {table} (id text PRIMARY KEY, name text, amount int)")
    stack.let_consumer_write(table, upsert=True, schema=names["schema"])
    produce(stack, names["topic"], list(_records()))
    settings = settings_for(stack, names, mode="upsert", key_columns=["id"],
                            key_source="record_key", unknown_fields=policy)  # fmt: skip
    with running(settings) as service:
        drained(stack, names, 1)
        ignored = sample(service, IGNORED, topic=names["topic"])
    landed = sql(stack, f"SELECT id, name, amount FROM {table} ORDER BY id")
    errors = dict(sql(stack, f'SELECT "offset", error FROM {names["schema"]}.dead_letters'))
    good = [(str(100 + i), f"good-{i}", i) for i in range(5)]
    extra = [(str(400 + i), f"extra-{i}", i) for i in range(5)]
    # Never a row of NULLs: neither an envelope nor a record of unknown fields is a row.
    assert all(name is not None for _, name, _ in landed), landed
    envelopes = [errors[4 * i + 1] for i in range(5)]
    assert all("Debezium change event" in e and "after, before, op, source, ts_ms" in e
               for e in envelopes), envelopes  # fmt: skip
    assert all("fills none of" in errors[4 * i + 2] for i in range(5))
    if policy == "refuse":
        assert landed == good
        assert all("field(s) coupon are not columns of" in errors[4 * i + 3] for i in range(5))
        assert len(errors) == 15 and ignored == 0
    else:
        assert landed == good + extra  # without the field its table lacks
        assert len(errors) == 10 and ignored == 5  # every such record counted
        lines = [
            r.getMessage() for r in caplog.records if "unknown_fields: ignore" in r.getMessage()
        ]
        # Logged at once, naming the field (then at most once a minute: one line here).
        assert len(lines) == 1 and "record(s) carried field(s) coupon that are not" in lines[0]
