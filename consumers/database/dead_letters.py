"""The dead-letter table's one write: a record, its coordinates and why, in the caller's
transaction. The applier's poison records and an operator's discarded epoch both go through
it, so a letter written again means the same thing whoever writes it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import psycopg
from confluent_kafka import Message
from psycopg import sql

_TIMESTAMP_NOT_AVAILABLE = 0  # confluent_kafka.TIMESTAMP_NOT_AVAILABLE

# The conflict clause: a range applied again clears its dead letters first (a replay), so a
# record's earlier letter is only ever replaced by a later failure of the same record, never
# lost: one more attempt, with the new key, value, headers and error.
_WRITE = (
    'INSERT INTO {} AS d (group_id, topic, partition, "offset", key, value, headers, error, '
    "kafka_timestamp_ms) VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s) "
    'ON CONFLICT (group_id, topic, partition, "offset") DO UPDATE SET key = EXCLUDED.key, '
    "value = EXCLUDED.value, headers = EXCLUDED.headers, error = EXCLUDED.error, "
    "failed_at = EXCLUDED.failed_at, attempts = d.attempts + 1"
)


def write_dead_letters(
    conn: psycopg.Connection[Any],
    table: sql.Identifier,
    group: str,
    letters: Sequence[tuple[Message, str]],
) -> None:
    """Each (record, error) of `letters` into the dead-letter `table` of `group`."""
    rows = [
        (group, r.topic(), r.partition(), r.offset(), r.key(), r.value(), headers_json(r),
         error, timestamp_ms(r))
        for r, error in letters
    ]  # fmt: skip
    with conn.cursor() as cursor:
        cursor.executemany(sql.SQL(_WRITE).format(table), rows)


def timestamp_ms(record: Message) -> int | None:
    # As `consumers.decoding.records.timestamp_ms`: the database and decoding layers are
    # independent, and two lines are cheaper than a module under both.
    kind, timestamp = record.timestamp()
    return timestamp if kind != _TIMESTAMP_NOT_AVAILABLE else None


def headers_json(record: Message) -> str:
    """The record's headers as a JSON array of [name, text] pairs, for the dead-letter table.
    Bytes that are not UTF-8, and NUL, which jsonb refuses even escaped, are written as visible
    escapes (`\\xff`, `\\x00`): a header never keeps a poison record out of the dead letters."""
    headers = record.headers() or []
    return json.dumps(
        [
            [_visible(str(k)), None if v is None else _visible(v)]
            for k, v in (headers.items() if isinstance(headers, dict) else headers)
        ]
    )


def _visible(value: str | bytes) -> str:
    text = value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value
    return text.replace("\x00", "\\x00")
