"""The secured compose stack's credentials (`docker-compose.secure.yml`), made by the same code
as the secured local stack's: one CA, the broker's and PostgreSQL's certificates, a random
password per principal, and the files each server reads at its first start.

Under the directory (the `secure` volume, mounted at /secure in every service):
- `tls/`: `ca.pem` (every client trusts it), `bridge-broker.keystore.pem`, `postgres.pem/.key`
- `secrets/`: `kafka-<user>.password`, `<role>.pgpass`, the broker's own password properties
- `kafka/`: `server.properties` (the compose node's, with `${file:...}` for its password),
  `scram-arguments` (salted credentials for the storage format), `cluster-id`
- `postgres/`: `roles.sql` (the consumer's role, by its SCRAM verifier), `superuser.password`

Ownership: the apache/kafka image and bridge's own both run as uid 1000; the postgres image
as `postgres` (uid and gid 999), which must read its key and init files, and may read them
only if they are root's and group-readable, or its own.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from bridge_shell.stack.kafka import KafkaPorts, new_cluster_id, node_settings
from bridge_shell.stack.postgres import consumer_role_statements, scram_sha_256_verifier
from bridge_shell.stack.secure import KAFKA_BROKER, POSTGRES_ADMIN, POSTGRES_CONSUMER, StackSecurity

KAFKA_PORTS = KafkaPorts(broker=9092, controller=9093)
POSTGRES_PORT = 5432
KAFKA_LOG_DIRS = Path("/var/lib/kafka/data")


@dataclass(frozen=True)
class Ownership:
    """Who owns the files: `owner` (uid, gid) all of them, but PostgreSQL's, which are root's
    with group `postgres_gid`. None: leave them to whoever runs the command."""

    owner: tuple[int, int] | None = None
    postgres_gid: int | None = None


def write_compose_credentials(
    directory: Path,
    *,
    kafka_host: str = "kafka",
    postgres_host: str = "postgres",
    ownership: Ownership | None = None,
) -> StackSecurity:
    """Everything above, made once: a second run keeps the CA, the passwords and the cluster
    id, so that a restarted compose stack keeps trusting and accepting its clients."""
    security = StackSecurity(directory, hosts=(kafka_host, postgres_host))
    security.ensure()
    security.certificate(KAFKA_BROKER)
    postgres_cert = security.certificate("postgres")
    security.postgres_dsn(POSTGRES_CONSUMER, POSTGRES_PORT, host=postgres_host)  # its passfile

    kafka_dir = directory / "kafka"
    kafka_dir.mkdir(mode=0o700, exist_ok=True)
    cluster_id = kafka_dir / "cluster-id"
    if not cluster_id.exists():
        cluster_id.write_text(new_cluster_id() + "\n")
    settings = node_settings(
        node_id=1,
        cluster_size=1,
        listen_host="",  # every interface of the container
        advertised_host=kafka_host,
        ports=KAFKA_PORTS,
        voters=f"1@{kafka_host}:{KAFKA_PORTS.controller}",
        log_dirs=KAFKA_LOG_DIRS,
        security=security,
    )
    _write(kafka_dir / "server.properties", "".join(f"{k}={v}\n" for k, v in settings.items()))
    scram = kafka_dir / "scram-arguments"
    if not scram.exists():  # the storage is formatted once, with the first
        _write(scram, "\n".join(security.scram_format_arguments()) + "\n")

    postgres_dir = directory / "postgres"
    postgres_dir.mkdir(mode=0o750, exist_ok=True)
    verifier = scram_sha_256_verifier(security.password(f"postgres-{POSTGRES_CONSUMER}"))
    roles = ";\n".join(s.as_string() for s in consumer_role_statements(verifier)) + ";\n"
    _write(postgres_dir / "roles.sql", roles)
    _write(postgres_dir / "superuser.password", security.password(f"postgres-{POSTGRES_ADMIN}"))
    _own(directory, ownership or Ownership(), postgres_files=[postgres_dir, *postgres_dir.iterdir(),
                                               postgres_cert.cert, postgres_cert.key])  # fmt: skip
    return security


def _write(path: Path, text: str) -> None:
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(text)


def _own(directory: Path, ownership: Ownership, *, postgres_files: list[Path]) -> None:
    if ownership.owner is not None:
        uid, gid = ownership.owner
        for path in (directory, *directory.rglob("*")):
            shutil.chown(path, uid, gid)
    if ownership.postgres_gid is not None:
        for path in postgres_files:
            shutil.chown(path, 0, ownership.postgres_gid)
            path.chmod(0o750 if path.is_dir() else 0o640)
