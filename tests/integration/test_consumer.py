"""The consumer service against real Kafka and PostgreSQL: what lands, and how."""

from __future__ import annotations

import secrets
import time
from typing import Any

import pytest

from bridge.kafka_admin import create_topic
from tests.consumer_helpers import drained, eventually, produce, running, settings_for, sql
from tests.harness import Endpoints

# In `make check`'s quick loop too.
pytestmark = pytest.mark.quick


def test_committed_records_land_once_and_aborted_never(
    stack: Endpoints, names: dict[str, str]
) -> None:
    create_topic(stack.bootstrap_servers, names["topic"], partitions=3)
    sql(stack, f"CREATE TABLE public.{names['table']} (id int PRIMARY KEY, body text)")
    produce(stack, names["topic"], [(None, {"id": i, "body": f"b{i}"}) for i in range(300)])
    produce(stack, names["topic"], [(None, {"id": 10_000 + i}) for i in range(50)], abort=True)
    produce(stack, names["topic"], [(None, {"id": i, "body": "late"}) for i in range(300, 400)])

    with running(settings_for(stack, names)):
        eventually(lambda: sql(stack, f"SELECT count(*) FROM {names['table']}")[0][0] >= 400)
        drained(stack, names, partitions=3)  # anything more: a duplicate or an aborted row

    assert sql(stack, f"SELECT count(*), min(id), max(id) FROM {names['table']}") == [(400, 0, 399)]
    offsets = sql(
        stack,
        f"SELECT partition, next_offset, owner_epoch FROM {names['schema']}.offsets "
        f"WHERE group_id = '{names['group']}' AND topic = '{names['topic']}' ORDER BY partition",
    )
    assert [row[0] for row in offsets] == [0, 1, 2]
    # next_offset is last offset + 1: past the data and the transaction markers, never a count.
    assert sum(row[1] for row in offsets) >= 400
    assert sql(stack, f"SELECT count(*) FROM {names['schema']}.dead_letters") == [(0,)]


def test_restart_resumes_from_database_offsets(stack: Endpoints, names: dict[str, str]) -> None:
    create_topic(stack.bootstrap_servers, names["topic"], partitions=2)
    sql(
        stack, f"CREATE TABLE public.{names['table']} (id int, body text)"
    )  # no key: duplicates would show
    settings = settings_for(stack, names)
    produce(stack, names["topic"], [(None, {"id": i}) for i in range(100)])
    with running(settings):
        eventually(lambda: sql(stack, f"SELECT count(*) FROM {names['table']}")[0][0] >= 100)
    produce(stack, names["topic"], [(None, {"id": i}) for i in range(100, 150)])
    with running(settings):
        eventually(lambda: sql(stack, f"SELECT count(*) FROM {names['table']}")[0][0] >= 150)
        drained(stack, names, partitions=2)
    assert sql(stack, f"SELECT count(*), count(DISTINCT id) FROM {names['table']}") == [(150, 150)]


def test_poison_records_go_to_dead_letters_and_the_rest_flows(
    stack: Endpoints, names: dict[str, str]
) -> None:
    create_topic(stack.bootstrap_servers, names["topic"])
    sql(stack, f"CREATE TABLE public.{names['table']} "
               "(id int PRIMARY KEY, qty int NOT NULL CHECK (qty > 0), note text)")  # fmt: skip
    sql(stack, f"CREATE INDEX ON public.{names['table']} (note)")
    records: list[tuple[Any, Any]] = [
        (None, {"id": 1, "qty": 1}),
        (None, b"not json"),  # offset 1
        (None, {"id": 2}),  # offset 2: qty is required
        (None, {"id": 3, "qty": -5}),  # offset 3: CHECK
        (None, {"id": 4, "qty": "many"}),  # offset 4: not an integer
        (None, {"id": 1, "qty": 9}),  # offset 5: unique violation in insert mode
        (None, [1, 2]),  # offset 6: JSON, not an object
        (None, {"id": 5, "qty": 5}),
        (None, {"id": 6, "qty": 1, "note": "a\u0000b"}),  # offset 8: NUL, which text cannot hold
        (None, {"id": 7, "qty": 1, "note": secrets.token_hex(10_000)}),  # 9: too big to index
        (None, {"id": 8, "qty": 8}),
    ]
    # NUL and bytes that are not UTF-8 in a header, which jsonb cannot hold as they are.
    produce(stack, names["topic"], records, headers=[("trace", b"t-1"), ("bin", b"\x00\xff")])
    with running(settings_for(stack, names)):
        # Every record is through once the last one is: it may land a batch after the poison.
        eventually(
            lambda: sql(stack, f"SELECT count(*) FROM {names['table']} WHERE id = 8")[0][0] == 1
        )
        time.sleep(0.5)  # time for anything wrongly applied twice to show
    assert sql(stack, f"SELECT id, qty FROM {names['table']} ORDER BY id") == [
        (1, 1),
        (5, 5),
        (8, 8),
    ]
    dead = sql(
        stack,
        f'SELECT topic, partition, "offset", value, error, headers FROM {names["schema"]}.'
        'dead_letters ORDER BY "offset"',
    )
    assert [(t, p, o) for t, p, o, *_ in dead] == [
        (names["topic"], 0, o) for o in (1, 2, 3, 4, 5, 6, 8, 9)
    ]
    assert bytes(dead[0][3]) == b"not json"
    errors = [row[4] for row in dead]
    assert "not JSON" in errors[0]
    assert "qty" in errors[1]
    assert errors[2].startswith("23514")  # check_violation
    assert errors[3].startswith("22P02")  # invalid_text_representation
    assert errors[4].startswith("23505")  # unique_violation
    assert "not a JSON object" in errors[5]
    assert "cannot contain NUL" in errors[6]
    assert errors[7].startswith("54000")  # program_limit_exceeded: index row size
    # Headers come along whether the record failed decoding or PostgreSQL refused it.
    assert all(row[5] == [["trace", "t-1"], ["bin", "\\x00\\xff"]] for row in dead)


def test_values_land_exactly_as_json_and_absent_columns_take_their_defaults(
    stack: Endpoints, names: dict[str, str]
) -> None:
    create_topic(stack.bootstrap_servers, names["topic"])
    columns = ("id int NOT NULL, amount numeric, big numeric, ratio double precision, "
               "meta jsonb, tags text, flag boolean, note text DEFAULT 'none', "
               "seq bigint GENERATED BY DEFAULT AS IDENTITY")  # fmt: skip
    sql(stack, f"CREATE TABLE public.{names['table']} ({columns})")
    records: list[tuple[Any, Any]] = [
        (None, b'{"id": 1, "amount": 12345678901234.567890, "big": 1234567890123456789012345,'
               b' "ratio": 0.1, "meta": {"a": [1, 2.50, null]}, "tags": ["x", 1], "flag": true,'
               b' "note": "given", "ignored": 1}'),
        (None, b'{"id": 2, "note": null, "meta": null}'),  # null is NULL, not the default
        (None, b'{"id": 3}'),  # absent: the default, though other records carry the column
        (None, b'{"id": 4, "ratio": 1e400}'),  # offset 3: beyond a double
        (None, b'{"id": 5, "note": "after"}'),
    ]  # fmt: skip
    produce(stack, names["topic"], records)
    with running(settings_for(stack, names)):
        eventually(lambda: sql(stack, f"SELECT count(*) FROM {names['table']}")[0][0] == 4)
    rows = sql(
        stack,
        "SELECT id, amount::text, big::text, ratio, meta::text, tags, flag, note, seq IS NOT NULL"
        f" FROM {names['table']} ORDER BY id",
    )
    assert rows == [
        (1, "12345678901234.567890", "1234567890123456789012345", 0.1,
         '{"a": [1, 2.50, null]}', '["x",1]', True, "given", True),
        (2, None, None, None, None, None, None, None, True),
        (3, None, None, None, None, None, None, "none", True),
        (5, None, None, None, None, None, None, "after", True),
    ]  # fmt: skip
    dead = sql(stack, f'SELECT "offset", error FROM {names["schema"]}.dead_letters')
    assert [(offset, error[:5]) for offset, error in dead] == [(3, "22003")]  # out of range


@pytest.mark.parametrize("mode", ["insert", "upsert"])
def test_columns_the_table_generates_are_filled_by_it_and_a_record_setting_one_is_dead(
    stack: Endpoints, names: dict[str, str], mode: str
) -> None:
    create_topic(stack.bootstrap_servers, names["topic"])
    sql(stack, f"CREATE TABLE public.{names['table']} "
               "(id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, amount numeric, "
               "twice numeric GENERATED ALWAYS AS (amount * 2) STORED)")  # fmt: skip
    route: dict[str, Any] = {"mode": mode, "key_columns": ["id"]} if mode == "upsert" else {}
    records: list[tuple[Any, Any]] = [
        (None, {"id": 100, "amount": 1}),  # a given identity is written, as COPY does
        (None, {"id": 101, "amount": 2, "twice": 5}),  # offset 1: the table computes twice
        (None, {"id": 102, "amount": 3, "twice": None}),  # offset 2: null is a value too
        (None, {"id": 100, "amount": 4}),  # upsert: replaces the first; insert: the key is taken
    ]
    if mode == "insert":
        records.append((None, {"amount": 5}))  # the identity fills it
    produce(stack, names["topic"], records)
    last = records[-1][1]["amount"]
    with running(settings_for(stack, names, **route)):
        # Every record is through once the last one is (one partition, in order).
        eventually(
            lambda: (
                sql(stack, f"SELECT count(*) FROM {names['table']} WHERE amount = {last}") == [(1,)]
            )
        )
        time.sleep(0.5)  # time for anything wrongly applied twice to show
    rows = sql(stack, f"SELECT id, amount, twice FROM {names['table']} ORDER BY amount")
    if mode == "upsert":
        assert rows == [(100, 4, 8)]
    else:
        assert rows[0] == (100, 1, 2)
        assert rows[1][1:] == (5, 10) and rows[1][0] != 100  # the identity's own value
    dead = sql(stack, f'SELECT "offset", error FROM {names["schema"]}.dead_letters ORDER BY 1')
    assert [offset for offset, _ in dead[:2]] == [1, 2]
    assert all("column twice is generated by the table" in error for _, error in dead[:2])
    if mode == "insert":
        assert dead[2][0] == 3 and dead[2][1].startswith("23505")


def test_upsert_last_record_wins_and_tombstone_deletes(
    stack: Endpoints, names: dict[str, str]
) -> None:
    create_topic(stack.bootstrap_servers, names["topic"])
    sql(stack, f"CREATE TABLE public.{names['table']} (id int PRIMARY KEY, v text)")
    produce(
        stack,
        names["topic"],
        [
            ({"id": 1}, {"id": 1, "v": "first"}),
            ({"id": 2}, {"id": 2, "v": "doomed"}),
            ({"id": 1}, {"id": 1, "v": "last"}),
            ({"id": 3}, {"id": 3, "v": "kept"}),
            ({"id": 2}, None),
            ({"id": 3}, None),
            ({"id": 3}, {"id": 3, "v": "back"}),
            # One key for PostgreSQL, two for JSON: still the last record wins.
            ({"id": 4}, {"id": 4, "v": "number"}),
            ({"id": "4"}, {"id": "4", "v": "text"}),
        ],
    )
    with running(settings_for(stack, names, mode="upsert", key_columns=["id"])):
        eventually(
            lambda: sql(stack, f"SELECT count(*) FROM {names['table']} WHERE v = 'back'")[0][0] == 1
        )
    assert sql(stack, f"SELECT id, v FROM {names['table']} ORDER BY id") == [
        (1, "last"),
        (3, "back"),
        (4, "text"),
    ]


def test_upserts_into_tables_of_one_name_in_two_schemas_keep_apart_across_batches(
    stack: Endpoints, names: dict[str, str]
) -> None:
    """Each upsert target stages its rows in a table of its own, kept for the session: two
    tables named alike (different columns) never share it, and rows carrying different columns
    in one batch, or a later batch, never meet the rows of another."""
    other_topic, other_schema = f"{names['topic']}-b", f"{names['schema']}_b"
    for topic in (names["topic"], other_topic):
        create_topic(stack.bootstrap_servers, topic)
    sql(stack, f"CREATE TABLE public.{names['table']} (id int PRIMARY KEY, v text, n int)")
    sql(stack, f"CREATE SCHEMA {other_schema}")
    sql(stack, f"CREATE TABLE {other_schema}.{names['table']} (k text PRIMARY KEY, w int)")
    settings = settings_for(
        stack,
        names,
        consumer={
            "routes": [
                {"topic": names["topic"], "table": f"public.{names['table']}",
                 "mode": "upsert", "key_columns": ["id"]},
                {"topic": other_topic, "table": f"{other_schema}.{names['table']}",
                 "mode": "upsert", "key_columns": ["k"]},
            ]
        },
    )  # fmt: skip
    # Alternating column sets: several runs of rows, hence several stagings, in one batch.
    first = [(None, {"id": i, "v": f"v{i}"} if i % 2 else {"id": i, "n": i}) for i in range(20)]
    produce(stack, names["topic"], first)
    produce(stack, other_topic, [(None, {"k": f"k{i}", "w": i}) for i in range(10)])
    with running(settings):
        eventually(lambda: sql(stack, f"SELECT count(*) FROM {names['table']}")[0][0] == 20)
        produce(stack, names["topic"], [(None, {"id": i, "v": "again"}) for i in range(0, 20, 2)])
        produce(stack, other_topic, [(None, {"k": "k0", "w": 100})])
        eventually(
            lambda: (
                sql(stack, f"SELECT count(*) FROM {names['table']} WHERE v = 'again'")[0][0] == 10
            )
        )
        eventually(
            lambda: (
                sql(stack, f"SELECT w FROM {other_schema}.{names['table']} WHERE k = 'k0'")
                == [(100,)]
            )
        )
    rows = sql(stack, f"SELECT id, v, n FROM public.{names['table']} ORDER BY id")
    assert rows == [(i, "again", i) if i % 2 == 0 else (i, f"v{i}", None) for i in range(20)]
    assert sql(stack, f"SELECT count(*), sum(w) FROM {other_schema}.{names['table']}") == [
        (10, 100 + sum(range(1, 10)))
    ]
