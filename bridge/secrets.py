"""Which client settings are secrets, how they are kept out of sight, and where they come from.

One rule for every place a Kafka client property passes (the settings, the producer job, the
sink's options, the schema registry's client): a key that names a password, a secret, a token,
a private key, a JAAS configuration or a registry's `user.info` (user:password) holds a secret.
Its value never shows in a `repr`, a log line or an error.

A value may name a file instead of holding the secret, as Kafka's own FileConfigProvider
lets a client configuration do: `${file:/run/secrets/kafka-password}` is replaced by the file's
content (its trailing newline dropped) when the settings load, so that the secret stays out of
the configuration file, the environment and the command line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

_SECRET_KEY = re.compile(
    r"(password|secret|token|jaas|user\.info|\.key$|\.pem$|key\.pem|private)", re.IGNORECASE
)
_FILE_REFERENCE = re.compile(r"^\$\{file:(?P<path>[^}]+)\}$")
MASK = "**********"


def is_secret(key: str) -> bool:
    """Whether the client property `key` holds a secret (sasl.password, ssl.key.password,
    sasl.oauthbearer.client.secret, ssl.key.pem, sasl.jaas.config, ...)."""
    return bool(_SECRET_KEY.search(key))


def masked(properties: Mapping[str, object]) -> dict[str, object]:
    """`properties` fit to show: every secret's value replaced by the mask."""
    return {key: MASK if is_secret(key) else value for key, value in properties.items()}


def resolve_file_reference(value: str) -> str:
    """`value`, or the content of the file it names as `${file:PATH}`; OSError when the file
    cannot be read (the caller names the setting)."""
    match = _FILE_REFERENCE.match(value.strip())
    if match is None:
        return value
    return Path(match.group("path")).read_text(encoding="utf-8").rstrip("\r\n")
