"""The schema registry client's settings as users write them, checked before anything starts.

A user brings the registry settings of a Kafka Connect converter or of a Confluent client, and
confluent-kafka's `SchemaRegistryClient` takes a narrower set: it refuses Connect's
`basic.auth.credentials.source` ("Unrecognized properties"), and its numeric settings only as
numbers. Here each such setting becomes what the client takes, and the rest is checked by
building the real client once, so that a bad setting is refused at start with its key rather
than by the first batch that needs a schema.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from confluent_kafka.schema_registry import SchemaRegistryClient

CREDENTIALS_SOURCE = "basic.auth.credentials.source"
USER_INFO = "basic.auth.user.info"
# The client's settings that it takes only as numbers; YAML and Connect give them as text.
_NUMBERS = {
    "cache.capacity": int,
    "cache.latest.ttl.sec": int,
    "max.retries": int,
    "retries.wait.ms": int,
    "retries.max.wait.ms": int,
    "timeout": float,
}
# The client's settings that name a file it reads when it is built.
_FILES = ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location")


def client_properties(url: str, properties: Mapping[str, Any]) -> dict[str, Any]:
    """`properties` as confluent-kafka's registry client takes them, beside `url`; ValueError
    naming the key when one is wrong. Connect's `basic.auth.credentials.source` is read here:
    `USER_INFO` is what `basic.auth.user.info` means to the client already, `URL` what a URL
    with user:password means; any other source has no meaning to the client."""
    found: dict[str, Any] = dict(properties)
    source = found.pop(CREDENTIALS_SOURCE, None)
    if source is not None:
        source = source.strip().upper()
        has_url_user = urlsplit(url).username is not None
        if source == "USER_INFO" and USER_INFO not in found:
            raise ValueError(f"{CREDENTIALS_SOURCE}: USER_INFO needs {USER_INFO} (user:password)")
        if source == "URL" and not has_url_user:
            raise ValueError(f"{CREDENTIALS_SOURCE}: URL needs user:password in the URL")
        if source not in ("USER_INFO", "URL"):
            raise ValueError(
                f"{CREDENTIALS_SOURCE}: {source} is not USER_INFO or URL (the registry's "
                f"client takes user:password in {USER_INFO} or in the URL)"
            )
    for key, kind in _NUMBERS.items():
        if key in found and isinstance(found[key], str):
            try:
                found[key] = kind(found[key])
            except ValueError:
                raise ValueError(f"{key}: {found[key]!r} is not a number") from None
    try:
        # Building the client reads every setting (and the TLS files named) and sends nothing.
        with SchemaRegistryClient({"url": url, **found}):
            pass
    except (TypeError, ValueError) as exc:
        raise ValueError(str(exc)) from None
    except OSError as exc:  # ssl.SSLError included: a file named that is not what it says
        named = [k for k in _FILES if k in found]
        raise ValueError(f"{', '.join(named) or 'a file'}: cannot be read: {exc}") from None
    return found
