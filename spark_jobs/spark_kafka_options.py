"""librdkafka's client settings as options of Spark's own Kafka connector (the Java client).

The producer job's `--source kafka` reads with Spark's connector, which takes `kafka.`-prefixed
Java client properties; bridge's settings are librdkafka's. The security settings differ in
name and in shape (a SASL password becomes a JAAS line; a CA file a PEM trust store), so they
are translated here, and a setting with no Java counterpart is refused rather than dropped: a
source that silently connected without TLS would be worse than one that does not start.
"""

from __future__ import annotations

from collections.abc import Mapping

from bridge.errors import ConfigError

_SAME_NAME = frozenset(
    {
        "security.protocol",
        "sasl.kerberos.service.name",
        "ssl.endpoint.identification.algorithm",
        "client.id",
        "request.timeout.ms",
        "socket.connection.setup.timeout.ms",
        "reconnect.backoff.ms",
        "reconnect.backoff.max.ms",
        "retry.backoff.ms",
        "metadata.max.age.ms",
    }
)
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
# librdkafka's own tuning, which has no meaning for the Java client: left out on purpose.
_LIBRDKAFKA_ONLY = frozenset(
    {
        "log_level",
        "debug",
        "socket.keepalive.enable",
        "statistics.interval.ms",
        "api.version.request",
    }
)


def java_client_options(properties: Mapping[str, object]) -> dict[str, str]:
    """`properties` (librdkafka's names) as Spark Kafka connector options (`kafka.` + Java's
    names). ConfigError naming each setting that cannot be carried over."""
    options: dict[str, str] = {}
    problems: list[tuple[str, str]] = []
    given = {key: str(value) for key, value in properties.items()}
    mechanism = given.pop("sasl.mechanism", None) or given.pop("sasl.mechanisms", None)
    username, password = given.pop("sasl.username", None), given.pop("sasl.password", None)
    if mechanism is not None:
        options["sasl.mechanism"] = mechanism
        module = _LOGIN_MODULES.get(mechanism.upper())
        if username is not None and password is not None and module is not None:
            escaped = password.replace("\\", "\\\\").replace('"', '\\"')
            options["sasl.jaas.config"] = (
                f'{module} required username="{username}" password="{escaped}";'
            )
        elif username is not None or password is not None:
            problems.append(("kafka.properties.sasl.mechanism", f"{mechanism} with a username "
                             "and password has no Java login module here"))  # fmt: skip
    ca = given.pop("ssl.ca.location", None)
    if ca is not None:
        options["ssl.truststore.type"] = "PEM"
        options["ssl.truststore.location"] = ca
    for key, value in given.items():
        if key in _SAME_NAME:
            options[key] = value
        elif key in _LIBRDKAFKA_ONLY:
            continue
        elif key.startswith(("ssl.", "sasl.")):
            problems.append(
                (f"kafka.properties.{key}", "has no counterpart in Spark's Kafka source (the "
                 "Java client): use ssl.ca.location for TLS, and SASL/PLAIN or SCRAM")
            )  # fmt: skip
    if problems:
        raise ConfigError(problems, source="the Kafka source's client settings")
    return {f"kafka.{key}": value for key, value in options.items()}
