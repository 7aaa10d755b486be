"""Routes by topic pattern: what a pattern must be to be checked at start-up, whether two routes
could read one topic, the table a topic's records go to, and what librdkafka subscribes to.

The overlap of two patterns is decided on their languages (interegular builds each pattern's
automaton), restricted to the names Kafka allows for a topic, so that a refusal names a topic
both routes would read, and no pair is refused for a name no topic can have."""

from __future__ import annotations

import re
from functools import cache
from typing import Final

import interegular
from interegular.fsm import FSM, Alphabet

# The names Kafka accepts for a topic (Topic.LEGAL_CHARS; at most 249 of them).
LEGAL_TOPIC: Final = "[a-zA-Z0-9._-]+"
# Kafka's own topics (__consumer_offsets, __transaction_state, ...): no pattern may match them.
INTERNAL_TOPICS: Final = "__.*"
# In a route's `table`: the name of the topic whose records go there, made a name (`table_of`).
TOPIC_PLACEHOLDER: Final = "${topic}"
# PostgreSQL keeps this many bytes of a name (NAMEDATALEN - 1).
_NAME_BYTES: Final = 63
# librdkafka (2.16) refuses a subscription with any (?...) construct: plain groups only.
_GROUPS = re.compile(r"\(\?")
# Escapes both read alike: classes, word boundaries, control characters, and punctuation.
_ESCAPES = re.compile(r"\\(?![dDsSwWbBfnrtv0xu]|[^A-Za-z0-9])")


def check_pattern(pattern: str) -> str:
    """`pattern` if Python, librdkafka and the overlap check all read it the same; else a
    ValueError that says what they would not."""
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"{pattern!r} is not a regular expression: {exc}") from None
    if _GROUPS.search(pattern) or _ESCAPES.search(pattern):
        raise ValueError(
            f"{pattern!r} uses a construct librdkafka's regex engine does not read as Python "
            r"does: use plain groups, classes, \d \w \s and quantifiers, no (?...)"
        )
    try:
        _automaton(pattern)
    except Exception as exc:  # noqa: BLE001 - interegular raises its own kinds for what it cannot read
        raise ValueError(
            f"{pattern!r} cannot be checked against the other routes ({exc}): "
            "use plain groups, classes and quantifiers"
        ) from None
    # librdkafka's regex subscription has no Java client's exclude.internal.topics: a pattern
    # must itself keep clear of Kafka's own topics, whose names begin with __.
    internal = common_topic(pattern, INTERNAL_TOPICS)
    if internal is not None:
        raise ValueError(
            f"{pattern!r} matches {internal!r}, a name of Kafka's internal topics (they begin "
            "with __): begin it so that it cannot, as [a-z].* does"
        )
    return pattern


def matches(pattern: str, topic: str) -> bool:
    """Whether `pattern` routes `topic`: it matches the whole name."""
    return re.fullmatch(pattern, topic) is not None


def common_topic(first: str, second: str) -> str | None:
    """A topic name both patterns match, or None when no topic name can match both."""
    both = _automaton(first) & _automaton(second)
    legal = both & _automaton(LEGAL_TOPIC)
    if legal.empty():
        return None
    for example in legal.strings():
        return "".join(str(symbol) for symbol in example)
    return None  # pragma: no cover - a non-empty automaton has a string


def subscription(pattern: str) -> str:
    """What librdkafka subscribes to for `pattern`: a leading ^ makes it a regex there, and
    the anchors make it match whole names, as `matches` does (a plain group: librdkafka takes
    no (?:...))."""
    return f"^({pattern})$"


# A part of a route's `table`: a plain name, or a name in double quotes, any characters, a
# quote inside written twice (SQL's quoted identifier), kept exactly as written.
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
_QUOTED_NAME = re.compile(r'"((?:[^"]|"")+)"')


class TablePart(str):
    """One part of a table's name, as PostgreSQL knows it (unquoted); `quoted` when written in
    double quotes."""

    quoted: bool

    def __new__(cls, name: str, *, quoted: bool) -> TablePart:
        part = super().__new__(cls, name)
        part.quoted = quoted
        return part

    def written(self) -> str:
        """The part as a route writes it."""
        return '"' + self.replace('"', '""') + '"' if self.quoted else str(self)


def split_table(value: str) -> tuple[TablePart | None, TablePart]:
    """A route's `table`, `table` or `schema.table`, each part a plain name or a quoted one
    (`public."shop-orders"`, as Kafka Connect's JDBC sink names the table of a topic with a `-`),
    as (schema or None, table); a ValueError that says why otherwise."""
    parts: list[TablePart] = []
    at, whole = 0, False
    while len(parts) < 2:
        quoted = _QUOTED_NAME.match(value, at)
        plain = None if quoted else _PLAIN_NAME.match(value, at)
        if quoted:
            parts.append(TablePart(quoted.group(1).replace('""', '"'), quoted=True))
            at = quoted.end()
        elif plain:
            parts.append(TablePart(plain.group(0), quoted=False))
            at = plain.end()
        else:
            break  # a part missing: refused below
        if at == len(value):
            whole = True
            break
        if value[at] != ".":
            break
        at += 1
    if not whole or any(len(p.encode()) > _NAME_BYTES for p in parts):
        raise ValueError(
            f"{value!r} is not `table` or `schema.table` (plain names, or names in double "
            f"quotes, each at most {_NAME_BYTES} bytes)"
        )
    return (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])


def table_of(template: str, topic: str) -> str:
    """The table a topic's records go to: `template` with `${topic}` replaced by the topic's
    name: as it is in a quoted part (`public."${topic}"`, as Kafka Connect names tables), else
    lowercased, each character that is not a letter, digit or underscore made `_`; each part cut
    to the 63 bytes PostgreSQL keeps of a name."""
    plain = re.sub(r"[^a-z0-9_]", "_", topic.lower())
    names = [
        TablePart(
            part.replace(_MARK, topic if part.quoted else plain)[:_NAME_BYTES], quoted=part.quoted
        ).written()
        for part in split_table(template.replace(TOPIC_PLACEHOLDER, _MARK))
        if part is not None
    ]
    return ".".join(names)


_MARK: Final = "bridgeTopicPlaceholder"  # `${topic}` while a template is parsed as a name


# One alphabet for every automaton (any character is a symbol of its own or "anything else"),
# so that two patterns' automata can be intersected.
_ALPHABET: Final[Alphabet] = Alphabet.from_groups(  # type: ignore[no-untyped-call]  # untyped there
    *({chr(c)} for c in range(32, 127)), {interegular.fsm.anything_else}
)


@cache
def _automaton(pattern: str) -> FSM:
    return interegular.parse_pattern(pattern).to_fsm(_ALPHABET)
