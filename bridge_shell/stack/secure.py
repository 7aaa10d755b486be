"""The secured local stack's principals, credentials and client settings.

Kafka: SASL_SSL with SCRAM-SHA-512 for clients and between brokers; the controller listener is
TLS with client certificates (SCRAM credentials live in the metadata log, which the controllers
must read before they could check one). PostgreSQL: TLS only, `scram-sha-256`, no `trust`.

Every password is random, made once, and kept in `secrets/` (0600), never on a command line:
the broker's storage is formatted with the SCRAM credentials already salted and hashed, clients
read `${file:...}` references (librdkafka settings) and a `passfile` (libpq). Each role gets an
env file of its own next to `stack.env`, which the commands of that role read.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import quote, urlencode

from bridge import acls
from bridge.acls import Role
from bridge.names import ENV_KAFKA_PROPERTIES, ENV_POSTGRES_DSN, POSTGRES_DATABASE, POSTGRES_USER
from bridge_shell.stack.tls import Certificate, CertificateAuthority

SCRAM_MECHANISM: Final = "SCRAM-SHA-512"
_SCRAM_ITERATIONS: Final = 8192

# Kafka principals (SCRAM user names). The broker's own is also the common name of its
# certificate, so that it is the same principal on the controller listener.
KAFKA_BROKER: Final = "bridge-broker"
KAFKA_ADMIN: Final = "bridge-admin"
KAFKA_USERS: Final[dict[str, str]] = {
    "producer": "bridge-producer",
    "consumer": "bridge-consumer",
    "tools": "bridge-tools",
}
KAFKA_SUPER_USERS: Final = (KAFKA_BROKER, KAFKA_ADMIN)

# PostgreSQL roles: the superuser the stack and the demo set up with, and the one role the
# consumer and the operator tools log in as.
POSTGRES_ADMIN: Final = POSTGRES_USER
POSTGRES_CONSUMER: Final = "bridge_consumer"
_POSTGRES_ROLE_OF: Final[dict[str, str]] = {
    "consumer": POSTGRES_CONSUMER,
    "tools": POSTGRES_CONSUMER,
    "admin": POSTGRES_ADMIN,
}


@dataclass(frozen=True)
class StackSecurity:
    """The files of a secured stack under `home` (the stack's data directory). `hosts`: the
    names the servers are reached by besides the loopback ones (compose's service names)."""

    home: Path
    hosts: tuple[str, ...] = ()

    @property
    def ca(self) -> CertificateAuthority:
        return CertificateAuthority(self.home / "tls")

    @property
    def secrets_dir(self) -> Path:
        return self.home / "secrets"

    def ensure(self) -> None:
        """The CA, the servers' certificates and every password: made once, kept after."""
        self.ca.ensure()
        self.secrets_dir.mkdir(mode=0o700, exist_ok=True)
        for user in (*KAFKA_SUPER_USERS, *KAFKA_USERS.values()):
            self.password(f"kafka-{user}")
        for role in (POSTGRES_ADMIN, POSTGRES_CONSUMER):
            self.password(f"postgres-{role}")

    def certificate(self, name: str) -> Certificate:
        return self.ca.issue(name, hosts=self.hosts)

    def password_file(self, name: str) -> Path:
        return self.secrets_dir / f"{name}.password"

    def password(self, name: str) -> str:
        path = self.password_file(name)
        if not path.exists():
            self.secrets_dir.mkdir(mode=0o700, exist_ok=True)
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as out:
                out.write(secrets.token_urlsafe(24) + "\n")
        return path.read_text().strip()

    # -- Kafka ----------------------------------------------------------------------------------

    def scram_format_arguments(self) -> list[str]:
        """`--add-scram` arguments for the storage format: each user's credential already
        salted and hashed (RFC 5802's SaltedPassword), so no password is on the command line."""
        arguments = []
        for user in (*KAFKA_SUPER_USERS, *KAFKA_USERS.values()):
            salt = secrets.token_bytes(24)
            salted = hashlib.pbkdf2_hmac(
                "sha512", self.password(f"kafka-{user}").encode(), salt, _SCRAM_ITERATIONS
            )
            arguments += [
                "--add-scram",
                f"{SCRAM_MECHANISM}=[name={user},"
                f'salt="{base64.b64encode(salt).decode()}",'
                f'saltedpassword="{base64.b64encode(salted).decode()}",'
                f"iterations={_SCRAM_ITERATIONS}]",
            ]
        return arguments

    def broker_settings(self, *, listener: str) -> dict[str, str]:
        """The security part of a node's server.properties; `listener` is the client one."""
        broker = self.certificate(KAFKA_BROKER)
        name = listener.lower()
        return {
            # The node's own password stays in the secrets directory: Kafka's FileConfigProvider
            # puts it into the JAAS line when the node reads its configuration.
            "config.providers": "file",
            "config.providers.file.class": (
                "org.apache.kafka.common.config.provider.FileConfigProvider"
            ),
            "sasl.enabled.mechanisms": SCRAM_MECHANISM,
            "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
            f"listener.name.{name}.{SCRAM_MECHANISM.lower()}.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required "
                f'username="{KAFKA_BROKER}" '
                f'password="${{file:{self._broker_secrets()}:password}}";'
            ),
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(broker.keystore()),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca.ca.cert),
            "listener.name.controller.ssl.client.auth": "required",
            # The controller listener's principal is its certificate's common name.
            "ssl.principal.mapping.rules": "RULE:^CN=([^,]+)$/$1/,DEFAULT",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": ";".join(f"User:{user}" for user in KAFKA_SUPER_USERS),
        }

    def _broker_secrets(self) -> Path:
        """The node's password as a properties file, the shape FileConfigProvider reads."""
        path = self.secrets_dir / f"kafka-{KAFKA_BROKER}.properties"
        if not path.exists():
            password = self.password(f"kafka-{KAFKA_BROKER}")
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as out:
                out.write(f"password={password}\n")  # token_urlsafe: nothing to escape
        return path

    def admin_config(self, bootstrap_servers: str) -> dict[str, str]:
        """A client configuration of the admin principal (every right), password resolved."""
        properties = self.kafka_properties(KAFKA_ADMIN)
        properties["sasl.password"] = self.password(f"kafka-{KAFKA_ADMIN}")
        return {"bootstrap.servers": bootstrap_servers, **properties}

    def grant_roles(self, bootstrap_servers: str, *, timeout: float) -> None:
        """Each role's ACLs (bridge/acls.py) to its principal, as the admin."""
        admin = self.admin_config(bootstrap_servers)
        for role in acls.ROLES:
            acls.apply(admin, KAFKA_USERS[role], acls.grants(role), timeout=timeout)

    def kafka_properties(self, user: str) -> dict[str, str]:
        """librdkafka settings for `user`; the password as a reference to its file."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": SCRAM_MECHANISM,
            "sasl.username": user,
            "sasl.password": "${file:" + str(self.password_file(f"kafka-{user}")) + "}",
            "ssl.ca.location": str(self.ca.ca.cert),
        }

    # -- PostgreSQL -----------------------------------------------------------------------------

    def postgres_dsn(self, role: str, port: int, *, host: str = "127.0.0.1") -> str:
        """A DSN that verifies the server's certificate and reads the password from a passfile."""
        passfile = self.secrets_dir / f"{role}.pgpass"
        if not passfile.exists():
            descriptor = os.open(passfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as out:
                out.write(f"*:*:*:{role}:{self.password(f'postgres-{role}')}\n")
        query = urlencode(
            {
                "sslmode": "verify-full",
                "sslrootcert": str(self.ca.ca.cert),
                "passfile": str(passfile),
            }
        )
        return f"postgresql://{quote(role)}@{host}:{port}/{POSTGRES_DATABASE}?{query}"

    def role_env(self, role: Role | str, *, postgres_port: int) -> str:
        """The env file of one role: its Kafka principal's settings and its PostgreSQL DSN."""
        lines = []
        user = KAFKA_ADMIN if role == "admin" else KAFKA_USERS[role]
        properties = json.dumps(self.kafka_properties(user), separators=(",", ":"))
        lines.append(f"{ENV_KAFKA_PROPERTIES}='{properties}'")
        postgres_role = _POSTGRES_ROLE_OF.get(role)
        if postgres_role is not None:
            lines.append(f"{ENV_POSTGRES_DSN}={self.postgres_dsn(postgres_role, postgres_port)}")
        return "\n".join(lines) + "\n"
