"""Certificate issuing for a cluster: a development CA and the certificates of its members.

Used by ``membership certs init`` (:mod:`membership.cli.certs`), by
``membership demo`` and :class:`membership.testing.localcluster.LocalCluster`, and
by the tests (which need certificates that are expired, of another
cluster, or signed by another CA). Keys are ECDSA P-256 (small, fast to
make and to verify; gRPC's TLS supports them); signatures SHA-256.

Identities are SAN URIs (:mod:`membership.shared.tls` reads them back):
``spiffe://<cluster>/<role>/<name>``, role one of ``arbiter``, ``node``,
``admin``, ``observer``; a node name ending in ``*`` is a prefix pattern.
Only arbiter certificates carry DNS and IP SANs and the serverAuth
extended key usage: a certificate of any other role can authenticate a
client, never a server.

:func:`write_certificates` writes a CA and members' certificates as files
(``<name>.pem`` and ``<name>-key.pem``, keys 0600), the layout ``certs init``
makes; :class:`ClusterCertificates` is such a folder, issued on demand.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from membership.shared.tls import TLSFiles

__all__ = [
    "ROLES",
    "CertificateAuthority",
    "ClusterCertificates",
    "Issued",
    "Member",
    "identity_uri",
    "new_key",
    "write_certificates",
]

# The roles a certificate's URI may name (docs/security.md says what each may do).
ROLES = ("arbiter", "node", "admin", "observer")

# Default validity, days: a development CA for ten years, a member for one.
CA_DAYS = 3650
LEAF_DAYS = 365


def identity_uri(cluster: str, role: str, name: str) -> str:
    """``spiffe://<cluster>/<role>/<name>``.

    Raises:
        ValueError: for an unknown role.
    """
    if role not in ROLES:
        raise ValueError(f"role {role!r} is none of {', '.join(ROLES)}")
    return f"spiffe://{cluster}/{role}/{name}"


def new_key() -> ec.EllipticCurvePrivateKey:
    """A new ECDSA P-256 private key."""
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, both PEM.

    Attributes:
        cert_pem: the certificate (PEM).
        key_pem: its private key (PKCS#8 PEM, unencrypted).
        serial: the certificate's serial number.
    """

    cert_pem: bytes
    key_pem: bytes
    serial: int


class CertificateAuthority:
    """A CA: its certificate and key, and :meth:`issue` for member certificates.

    Args:
        cert: the CA certificate.
        key: the CA private key.
    """

    def __init__(self, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self.cert = cert
        self.key = key

    @classmethod
    def create(
        cls,
        cluster: str,
        *,
        days: float = CA_DAYS,
        not_before: datetime.datetime | None = None,
    ) -> CertificateAuthority:
        """A new self-signed CA for ``cluster`` (the name goes in its subject only).

        Args:
            cluster: the cluster name.
            days: validity from ``not_before``, days.
            not_before: start of validity (default: now minus 5 minutes, for
                clocks a little behind).
        """
        key = new_key()
        start = not_before or _now() - datetime.timedelta(minutes=5)
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "grpc-membership"),
                x509.NameAttribute(NameOID.COMMON_NAME, f"{cluster} cluster CA"),
            ]
        )
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        return cls(cert, key)

    @classmethod
    def load(cls, cert_pem: bytes, key_pem: bytes) -> CertificateAuthority:
        """The CA of PEM files written by :meth:`cert_pem` and :meth:`key_pem`.

        Raises:
            ValueError: not PEM, or not an EC key.
        """
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError("the CA key is not an EC key")
        return cls(cert, key)

    def cert_pem(self) -> bytes:
        """The CA certificate, PEM (the ``ca.pem`` every member trusts)."""
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        """The CA private key, PEM (keep it secret; needed only to issue more)."""
        return _key_pem(self.key)

    def issue(
        self,
        uris: Sequence[str],
        *,
        hosts: Sequence[str] = (),
        server: bool = False,
        days: float = LEAF_DAYS,
        not_before: datetime.datetime | None = None,
        common_name: str | None = None,
    ) -> Issued:
        """A member certificate signed by this CA.

        Args:
            uris: the identity URIs (:func:`identity_uri`), at least one.
            hosts: DNS names and IP addresses for the SAN (servers only).
            server: add serverAuth to the extended key usage (arbiters
                only); every certificate has clientAuth.
            days: validity from ``not_before``, days (negative or tiny
                values make certificates that are already expired, for tests).
            not_before: start of validity (default: now minus 5 minutes).
            common_name: the subject CN (default: the first URI's last part).

        Raises:
            ValueError: no URI given, or hosts on a client certificate.
        """
        if not uris:
            raise ValueError("a certificate needs at least one identity URI")
        if hosts and not server:
            raise ValueError("only a server (arbiter) certificate carries host names")
        key = new_key()
        start = not_before or _now() - datetime.timedelta(minutes=5)
        end = start + datetime.timedelta(days=days)
        if end <= start:  # an "expired" certificate still needs a valid window
            start, end = end - datetime.timedelta(days=1), end
        names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(u) for u in uris]
        for h in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                names.append(x509.DNSName(h))
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
        if server:
            usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
        cn = common_name or uris[0].rsplit("/", 1)[-1]
        serial = x509.random_serial_number()
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn[:64])]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(serial)
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=True,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), False
            )
            .sign(self.key, hashes.SHA256())
        )
        return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key), serial)

    def issue_arbiter(
        self,
        cluster: str,
        replica_id: str,
        hosts: Sequence[str] = (),
        *,
        days: float = LEAF_DAYS,
        not_before: datetime.datetime | None = None,
    ) -> Issued:
        """An arbiter certificate: ``arbiter/<id>``, serverAuth, SANs ``hosts`` and the id.

        ``hosts`` defaults to localhost, 127.0.0.1 and ::1; the replica id is
        always added as a DNS name (docker-compose reaches a replica by it).
        """
        names = list(hosts or ("localhost", "127.0.0.1", "::1"))
        if replica_id not in names:
            names.append(replica_id)
        return self.issue(
            [identity_uri(cluster, "arbiter", replica_id)],
            hosts=names,
            server=True,
            days=days,
            not_before=not_before,
        )


@dataclass(frozen=True)
class Member:
    """One certificate to write: ``<name>.pem`` naming ``uris``.

    Attributes:
        name: file name stem (and subject CN).
        role: arbiter, node, admin or observer.
        uris: the identity URIs.
        hosts: DNS/IP SANs (arbiters only).
    """

    name: str
    role: str
    uris: tuple[str, ...]
    hosts: tuple[str, ...] = ()


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
    finally:
        os.close(fd)


def write_certificates(
    folder: Path,
    members: list[Member],
    *,
    cluster: str,
    ca: CertificateAuthority | None = None,
    days: float = LEAF_DAYS,
    force: bool = False,
) -> list[Path]:
    """Writes the CA (when ``ca`` is None, a new one) and every member's files.

    Args:
        folder: the output folder (created, mode 0700, if missing).
        members: from :func:`plan`.
        cluster: the cluster name (the CA's subject).
        ca: an existing CA to sign with (``certs issue``); None makes a new
            one and writes ``ca.pem`` and ``ca-key.pem``.
        days: validity of the member certificates, days.
        force: overwrite existing files.

    Returns:
        The paths written.

    Raises:
        FileExistsError: a file exists and ``force`` is not set (nothing was written).
    """
    targets: list[Path] = []
    if ca is None:
        targets += [folder / "ca.pem", folder / "ca-key.pem"]
    for m in members:
        targets += [folder / f"{m.name}.pem", folder / f"{m.name}-key.pem"]
    existing = [p for p in targets if p.exists()]
    if existing and not force:
        raise FileExistsError(
            f"{', '.join(str(p) for p in existing[:3])}{' ...' if len(existing) > 3 else ''} "
            "already exist: give --force to overwrite them"
        )
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    written: list[Path] = []
    if ca is None:
        ca = CertificateAuthority.create(cluster, days=max(CA_DAYS, days))
        _write(folder / "ca.pem", ca.cert_pem(), 0o644)
        _write(folder / "ca-key.pem", ca.key_pem(), 0o600)
        written += [folder / "ca.pem", folder / "ca-key.pem"]
    for m in members:
        if m.role == "arbiter":
            issued = ca.issue(list(m.uris), hosts=m.hosts, server=True, days=days)
        else:
            issued = ca.issue(list(m.uris), days=days, common_name=m.name)
        _write(folder / f"{m.name}.pem", issued.cert_pem, 0o644)
        _write(folder / f"{m.name}-key.pem", issued.key_pem, 0o600)
        written += [folder / f"{m.name}.pem", folder / f"{m.name}-key.pem"]
    return written


class ClusterCertificates:
    """A folder of certificates as ``certs init`` writes it, issued on demand
    (:class:`membership.testing.localcluster.LocalCluster`, tests, benchmarks).

    Args:
        folder: where ``ca.pem``, ``ca-key.pem`` and ``<name>.pem`` /
            ``<name>-key.pem`` are (created on first use).
        cluster: the trust domain of the certificates issued.
    """

    def __init__(self, folder: Path, cluster: str = "default") -> None:
        self.folder = folder
        self.cluster = cluster
        self._ca: CertificateAuthority | None = None

    def ca(self) -> CertificateAuthority:
        """The CA of the folder (a new one written there when it has none)."""
        if self._ca is None:
            ca_file, key_file = self.folder / "ca.pem", self.folder / "ca-key.pem"
            if not ca_file.exists():
                write_certificates(self.folder, [], cluster=self.cluster)
            self._ca = CertificateAuthority.load(ca_file.read_bytes(), key_file.read_bytes())
        return self._ca

    def files(self, name: str, role: str = "node", *, uris: Sequence[str] = ()) -> TLSFiles:
        """The files of ``name``, issued when its certificate does not exist yet.

        Args:
            name: file name stem: the arbiter or node id, or any name.
            role: arbiter (hosts localhost, 127.0.0.1, ::1 and the name),
                node, admin or observer.
            uris: the identity URIs (default: the one of ``role``/``name``).
        """
        files = TLSFiles.in_dir(self.folder, name)
        if not files.cert.exists():
            hosts = ("localhost", "127.0.0.1", "::1", name) if role == "arbiter" else ()
            uris = tuple(uris) or (identity_uri(self.cluster, role, name),)
            member = Member(name, role, uris, hosts)
            write_certificates(self.folder, [member], cluster=self.cluster, ca=self.ca())
        return files
