"""Java's pattern languages that Kafka Connect's transforms take, read as Python's: a
`java.text.SimpleDateFormat` pattern (TimestampConverter's `format`) and a
`java.util.regex.Matcher` replacement (RegexRouter's `replacement`).

Ours, not a library's: no kept Python library reads SimpleDateFormat, and the subset users give
Connect (ISO-like dates and times, literals, offsets) is small enough to read exactly and to
refuse, naming the letter, beyond it. Both are read from configuration, so both are bounded.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

MAX_PATTERN_CHARS = 200

# SimpleDateFormat's letters, by run length, as strftime/strptime codes. `S` (milliseconds)
# and `X`/`Z` (offsets) are written by hand: strftime has no 3-digit fraction, and Java writes
# UTC as `Z` for X but `+0000` for Z.
_CODES: dict[str, dict[int, str]] = {
    "y": {1: "%Y", 2: "%y", 4: "%Y"},
    "M": {1: "%m", 2: "%m", 3: "%b", 4: "%B"},
    "d": {1: "%d", 2: "%d"},
    "H": {1: "%H", 2: "%H"},
    "h": {1: "%I", 2: "%I"},
    "m": {1: "%M", 2: "%M"},
    "s": {1: "%S", 2: "%S"},
    "a": {1: "%p"},
    "E": {1: "%a", 2: "%a", 3: "%a", 4: "%A"},
    "D": {3: "%j"},
}
_MILLIS = "S"
_OFFSETS = {"X", "Z"}


@dataclass(frozen=True)
class DateFormat:
    """A SimpleDateFormat pattern: `parse` reads a text as an instant (UTC where the pattern has
    no offset, as Connect's TimestampConverter reads it), `format` writes an instant in UTC."""

    pattern: str
    _parse: str
    _pieces: tuple[str | Callable[[datetime], str], ...]

    def parse(self, text: str) -> datetime:
        """The instant `text` names; ValueError when it does not match the pattern."""
        try:
            found = datetime.strptime(text, self._parse)  # the zone is set below
        except re.error as exc:  # strptime's own reading of the pattern, which date_format checks
            raise ValueError(f"{self.pattern!r}: {exc}") from None
        return found.replace(tzinfo=UTC) if found.tzinfo is None else found.astimezone(UTC)

    def format(self, instant: datetime) -> str:
        when = instant.astimezone(UTC) if instant.tzinfo is not None else instant
        return "".join(p if isinstance(p, str) else p(when) for p in self._pieces)


def date_format(pattern: str) -> DateFormat:
    """`pattern` read; ValueError naming what is not read (a letter, an unclosed quote)."""
    if not pattern or len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"a date format of 1 to {MAX_PATTERN_CHARS} characters")
    parse: list[str] = []
    pieces: list[str | Callable[[datetime], str]] = []
    seen: set[str] = set()
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "'":
            end = pattern.find("'", i + 1)
            if end < 0:
                raise ValueError(f"{pattern!r}: a quote opened at {i} is not closed")
            literal = pattern[i + 1 : end] or "'"  # '' is a quote
            parse.append(literal.replace("%", "%%"))
            pieces.append(literal)
            i = end + 1
            continue
        run = len(pattern) - i - len(pattern[i:].lstrip(char))
        if not char.isascii() or not char.isalpha():
            parse.append(char.replace("%", "%%") * run)
            pieces.append(char * run)
        elif ("Z" if char in _OFFSETS else char) in seen:
            raise ValueError(f"{pattern!r}: {char!r} twice (each field once)")
        elif char == _MILLIS:
            parse.append("%f")  # strptime reads 1-6 digits of a fraction
            pieces.append(_fraction(run))
        elif char in _OFFSETS:
            parse.append("%z")  # strptime reads Z, +HH:MM and +HHMM
            pieces.append("Z" if char == "X" else "+0000")  # written in UTC
        elif char in _CODES and run in _CODES[char]:
            code = _CODES[char][run]
            parse.append(code)
            pieces.append(_strftime(code))
        else:
            raise ValueError(
                f"{pattern!r}: {char * run!r} is not read here (y, M, d, H, h, m, s, S, a, E, D, "
                "X and Z are, and 'quoted' text)"
            )
        if char.isascii() and char.isalpha():
            seen.add("Z" if char in _OFFSETS else char)
        i += run
    return DateFormat(pattern, "".join(parse), tuple(pieces))


def _strftime(code: str) -> Callable[[datetime], str]:
    return lambda when: when.strftime(code)


def _fraction(digits: int) -> Callable[[datetime], str]:
    """SimpleDateFormat's S: milliseconds, zero-padded to the run's length."""
    return lambda when: str(when.microsecond // 1000).zfill(digits)


_GROUP = re.compile(r"\\(.)|\$(\d+)|\$\{([A-Za-z][A-Za-z0-9]*)\}|\$", re.DOTALL)


def java_replacement(replacement: str) -> str:
    """A Matcher replacement (`$1`, `${name}`, `\\$` for a dollar) as a `re.Match.expand`
    template; ValueError for a lone `$`."""
    if len(replacement) > MAX_PATTERN_CHARS:
        raise ValueError(f"a replacement of at most {MAX_PATTERN_CHARS} characters")

    def one(found: re.Match[str]) -> str:
        escaped, number, name = found.groups()
        if escaped is not None:
            return escaped.replace("\\", "\\\\")
        if number is not None:
            return f"\\g<{number}>"
        if name is not None:
            return f"\\g<{name}>"
        raise ValueError(f"{replacement!r}: a $ that names no group (write \\$ for a dollar)")

    if re.search(r"(?<!\\)(\\\\)*\\$", replacement):
        raise ValueError(f"{replacement!r}: ends in an escape that escapes nothing")
    return _GROUP.sub(one, replacement)


def renamed_topic(topic: str, regex: re.Pattern[str], template: str) -> str:
    """Kafka Connect's RegexRouter: a topic the whole `regex` matches, as `template` makes it;
    any other as it is."""
    found = regex.fullmatch(topic)
    return topic if found is None else found.expand(template)
