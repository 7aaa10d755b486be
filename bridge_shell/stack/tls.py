"""A private certificate authority for the secured local stack, and the certificates it signs.

Everything is PEM: Kafka reads PEM key stores and trust stores (`ssl.keystore.type=PEM`), so no
`keytool` and no keystore password is needed; PostgreSQL, librdkafka and libpq read PEM natively.
The CA's key never leaves `tls/`; each server key is written readable by its owner only.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID_FOR = datetime.timedelta(days=825)  # the longest TLS clients accept for a leaf
_HOSTS = ("localhost",)
_ADDRESSES = ("127.0.0.1", "::1")


@dataclass(frozen=True)
class Certificate:
    """A certificate and its private key, as PEM files."""

    cert: Path
    key: Path

    def keystore(self) -> Path:
        """The key, then the certificate, in one file: what Kafka's PEM key store reads."""
        return self.cert.with_suffix(".keystore.pem")


class CertificateAuthority:
    """The stack's own CA under `directory`: made once, then reused, so that clients trusting
    `ca.pem` keep trusting a restarted stack."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ca = Certificate(cert=directory / "ca.pem", key=directory / "ca.key")

    def ensure(self) -> None:
        if self.ca.cert.exists() and self.ca.key.exists():
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o755)  # the server users must reach their certificates
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bridge local stack CA")])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALID_FOR)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        _write_private(self.ca.key, _key_pem(key))
        self.ca.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, *, hosts: tuple[str, ...] = ()) -> Certificate:
        """A certificate for `name` (its common name, which Kafka maps to the principal
        `User:<name>`), valid for the loopback addresses and `hosts` as server and as client;
        made once."""
        issued = Certificate(
            cert=self.directory / f"{name}.pem", key=self.directory / f"{name}.key"
        )
        if issued.cert.exists() and issued.key.exists() and issued.keystore().exists():
            return issued
        self.ensure()
        ca_key = serialization.load_pem_private_key(self.ca.key.read_bytes(), password=None)
        ca_cert = x509.load_pem_x509_certificate(self.ca.cert.read_bytes())
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)  # noqa: S101 - ours, made above
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        alternative_names: list[x509.GeneralName] = [
            x509.DNSName(h) for h in dict.fromkeys((*_HOSTS, *hosts))
        ]
        alternative_names += [x509.IPAddress(ipaddress.ip_address(a)) for a in _ADDRESSES]
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALID_FOR)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(alternative_names), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        key_pem = _key_pem(key)
        _write_private(issued.key, key_pem)
        issued.cert.write_bytes(cert_pem)
        _write_private(issued.keystore(), key_pem + cert_pem)
        return issued


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    # PKCS#8 without encryption: what Kafka's PEM key store takes when no key password is set.
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write_private(path: Path, content: bytes) -> None:
    """Write `content` readable by its owner only, from the first byte on."""
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as out:
        out.write(content)
