"""Mutual TLS: certificate files, gRPC credentials, and identities read from certificates.

One CA per cluster signs every certificate; each certificate names its
holder's rights as SAN URIs (docs/security.md):

- ``spiffe://<cluster>/arbiter/<id>``: replica ``<id>`` (Raft traffic as
  ``<id>`` only); may read;
- ``spiffe://<cluster>/node/<id>``: may Heartbeat and Leave as node
  ``<id>``; ``node/<prefix>*`` as any node id starting with ``<prefix>``;
  may read;
- ``spiffe://<cluster>/admin/<name>``: may administer; may read;
- ``spiffe://<cluster>/observer/<name>``: may read only.

"Read" is Subscribe and GetView. ``<cluster>`` (the SPIFFE trust domain)
must be the replica's ``--cluster`` name; URIs of another cluster grant
nothing. A certificate with several URIs has the union of their rights.

What lives here (the client package; the server's policy is
:class:`arbiter.server.authz.MutualTLS`, built on :class:`Identity`):

- :class:`TLSFiles` and :func:`load`: the three PEM files, checked (missing
  or unreadable file, not PEM, a key that is not the certificate's, a
  certificate not signed by the CA or outside its validity), with one-line
  errors;
- :func:`resolve`: flags, then environment variables (``MEMBERSHIP_TLS_CA``,
  ``MEMBERSHIP_TLS_CERT``, ``MEMBERSHIP_TLS_KEY``, ``MEMBERSHIP_INSECURE``)
  to TLS files or an explicit plaintext choice: neither is an error (secure
  by default);
- :func:`channel_credentials` for clients (nodes, watchers, replicas to
  their peers) and :class:`ServerCredentials` for a replica's port, which
  re-reads its files on :meth:`ServerCredentials.reload` (SIGHUP) for new
  handshakes only: established connections and streams are untouched;
- :func:`peer_identity`: the :class:`Identity` of the caller of a gRPC call,
  parsed once per certificate (cached by its bytes) from the PEM that gRPC
  puts in the call's auth context (``x509_pem_cert``).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

from membership.errors import InvalidArgument

__all__ = [
    "ENV_CA",
    "ENV_CERT",
    "ENV_INSECURE",
    "ENV_KEY",
    "Grant",
    "Identity",
    "LoadedTLS",
    "ServerCredentials",
    "TLSFiles",
    "add_tls_flags",
    "channel_credentials",
    "config_fields",
    "describe",
    "load",
    "parse_identity",
    "peer_identity",
    "resolve",
    "resolve_args",
    "settings",
]

ENV_CA = "MEMBERSHIP_TLS_CA"
ENV_CERT = "MEMBERSHIP_TLS_CERT"
ENV_KEY = "MEMBERSHIP_TLS_KEY"
ENV_INSECURE = "MEMBERSHIP_INSECURE"

HOW_TO_GET = (
    "give --tls-ca, --tls-cert and --tls-key (or MEMBERSHIP_TLS_CA, MEMBERSHIP_TLS_CERT, "
    "MEMBERSHIP_TLS_KEY; `membership certs init DIR --arbiters a1,a2,a3 --nodes n1` makes a "
    "development CA and certificates), or --insecure (MEMBERSHIP_INSECURE=1) for plaintext"
)

_URI = re.compile(r"^spiffe://([^/]+)/(arbiter|node|admin|observer)/([^/]+)$")
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}\*?$")


# --- identities ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Grant:
    """One identity URI of a certificate: ``spiffe://<cluster>/<role>/<name>``.

    Attributes:
        cluster: the trust domain.
        role: ``arbiter``, ``node``, ``admin`` or ``observer``.
        name: the id; for a node, a trailing ``*`` makes it a prefix pattern.
    """

    cluster: str
    role: str
    name: str

    def covers_node(self, node_id: str) -> bool:
        """Whether this is a node grant for ``node_id`` (exactly, or by its prefix)."""
        if self.role != "node":
            return False
        if self.name.endswith("*"):
            return node_id.startswith(self.name[:-1])
        return node_id == self.name

    def __str__(self) -> str:
        return f"spiffe://{self.cluster}/{self.role}/{self.name}"


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a certificate names (its SAN URIs of the spiffe scheme, parsed).

    Attributes:
        grants: every identity URI, parsed (those of other schemes or shapes are ignored).
        serial: the certificate's serial number.
        subject: the certificate's subject, for messages.
        not_after: end of validity (UTC).
    """

    grants: tuple[Grant, ...]
    serial: int = 0
    subject: str = ""
    not_after: datetime.datetime | None = None

    def of(self, cluster: str) -> tuple[Grant, ...]:
        """The grants of cluster ``cluster`` (the others give no right there)."""
        return tuple(g for g in self.grants if g.cluster == cluster)

    def may_read(self, cluster: str) -> bool:
        """Any role of the cluster may Subscribe and GetView."""
        return bool(self.of(cluster))

    def may_node(self, cluster: str, node_id: str) -> bool:
        """May Heartbeat and Leave as ``node_id``."""
        return any(g.covers_node(node_id) for g in self.of(cluster))

    def may_replica(self, cluster: str, replica_id: str) -> bool:
        """May send Raft traffic as replica ``replica_id``."""
        return any(g.role == "arbiter" and g.name == replica_id for g in self.of(cluster))

    def may_admin(self, cluster: str) -> bool:
        """May administer the cluster (remove another node)."""
        return any(g.role == "admin" for g in self.of(cluster))

    def names(self) -> str:
        """The URIs, comma-separated (``(no identity URI)`` when there is none)."""
        return (
            ", ".join(str(g) for g in self.grants) or f"(no identity URI; subject {self.subject})"
        )

    def rights(self, cluster: str) -> str:
        """What this identity may do in ``cluster``, in words (for refusals)."""
        grants = self.of(cluster)
        if not grants:
            others = sorted({g.cluster for g in self.grants})
            where = f"it is of cluster {', '.join(others)}" if others else "it names no identity"
            return f"do nothing in cluster {cluster} ({where})"
        parts = []
        replicas = [g.name for g in grants if g.role == "arbiter"]
        nodes = [g.name for g in grants if g.role == "node"]
        if replicas:
            parts.append("replica traffic as " + ", ".join(replicas))
        if nodes:
            parts.append("heartbeat and leave as node " + ", ".join(nodes))
        if any(g.role == "admin" for g in grants):
            parts.append("administer")
        parts.append("read the view")
        return "; ".join(parts)


def parse_identity(cert: x509.Certificate) -> Identity:
    """The :class:`Identity` a certificate names (its spiffe SAN URIs)."""
    grants: list[Grant] = []
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    for uri in uris:
        m = _URI.match(uri)
        if m is not None and _NAME.match(m.group(3)):
            if m.group(3).endswith("*") and m.group(2) != "node":
                continue  # only node grants may be patterns
            grants.append(Grant(m.group(1), m.group(2), m.group(3)))
    return Identity(
        grants=tuple(grants),
        serial=cert.serial_number,
        subject=cert.subject.rfc4514_string(),
        not_after=cert.not_valid_after_utc,
    )


# Parsed identities by certificate PEM: a stream's identity is parsed on its
# first message only, and one certificate serves many streams.
_CACHE_LIMIT = 4096
_cache: collections.OrderedDict[bytes, Identity] = collections.OrderedDict()


def identity_of_pem(pem: bytes) -> Identity:
    """The identity of a PEM certificate, parsed once per certificate (LRU of 4096).

    Raises:
        ValueError: not a PEM certificate.
    """
    found = _cache.get(pem)
    if found is not None:
        _cache.move_to_end(pem)
        return found
    identity = parse_identity(x509.load_pem_x509_certificate(pem))
    _cache[pem] = identity
    if len(_cache) > _CACHE_LIMIT:
        _cache.popitem(last=False)
    return identity


def peer_identity(context: Any) -> Identity | None:
    """The identity of the caller of a gRPC call (``grpc.aio.ServicerContext``).

    Returns:
        None when the call came without a verified client certificate
        (plaintext, or TLS without client authentication).
    """
    pems = context.auth_context().get("x509_pem_cert")
    if not pems:
        return None
    try:
        return identity_of_pem(pems[0])
    except ValueError:
        return None


# --- files --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TLSFiles:
    """The three PEM files of a member: the cluster CA, its certificate, its key."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def in_dir(cls, folder: Path | str, name: str) -> TLSFiles:
        """The files ``membership certs init`` writes for ``name`` in ``folder``:
        ``ca.pem``, ``<name>.pem`` and ``<name>-key.pem``."""
        d = Path(folder)
        return cls(d / "ca.pem", d / f"{name}.pem", d / f"{name}-key.pem")

    def flags(self) -> list[str]:
        """The command-line flags that name these files."""
        return ["--tls-ca", str(self.ca), "--tls-cert", str(self.cert), "--tls-key", str(self.key)]


@dataclass(frozen=True)
class LoadedTLS:
    """The contents of :class:`TLSFiles`, checked by :func:`load`.

    Attributes:
        files: where they were read from.
        ca_pem: the CA certificate(s), PEM.
        cert_pem: the member's certificate, PEM.
        key_pem: its private key, PEM.
        identity: what the certificate names.
        server: the certificate may serve (it has serverAuth, as arbiter certificates do).
    """

    files: TLSFiles
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes
    identity: Identity
    server: bool = False


def _read(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InvalidArgument(f"{what} {path}: no such file") from None
    except IsADirectoryError:
        raise InvalidArgument(f"{what} {path}: is a folder, not a PEM file") from None
    except OSError as e:
        raise InvalidArgument(f"{what} {path}: cannot read it: {e.strerror or e}") from None
    if b"-----BEGIN " not in data:
        raise InvalidArgument(f"{what} {path}: not PEM (no -----BEGIN line)")
    return data


def _public_bytes(key: Any) -> bytes:
    return bytes(
        key.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def _signed_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    if cert.issuer != issuer.subject:
        return False
    key = issuer.public_key()
    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            assert cert.signature_hash_algorithm is not None
            key.verify(
                cert.signature,
                cert.tbs_certificate_bytes,
                ec.ECDSA(cert.signature_hash_algorithm),
            )
        elif isinstance(key, rsa.RSAPublicKey):
            assert cert.signature_hash_algorithm is not None
            key.verify(
                cert.signature,
                cert.tbs_certificate_bytes,
                padding.PKCS1v15(),
                cert.signature_hash_algorithm,
            )
        elif isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(cert.signature, cert.tbs_certificate_bytes)
        else:
            return True  # a key type we cannot check here: the TLS handshake will
    except Exception:
        return False
    return True


def load(files: TLSFiles, *, now: datetime.datetime | None = None) -> LoadedTLS:
    """Reads and checks the three files.

    Checks: each file exists and is PEM; the CA file holds certificates; the
    key is the certificate's; the certificate is signed by a CA of the CA
    file and is within its validity (``now``, default the current time).

    Raises:
        InvalidArgument: one line naming the file and what is wrong.
    """
    ca_pem = _read(files.ca, "--tls-ca")
    cert_pem = _read(files.cert, "--tls-cert")
    key_pem = _read(files.key, "--tls-key")
    try:
        cas = x509.load_pem_x509_certificates(ca_pem)
    except ValueError as e:
        raise InvalidArgument(f"--tls-ca {files.ca}: not a PEM certificate ({e})") from None
    try:
        cert = x509.load_pem_x509_certificates(cert_pem)[0]
    except ValueError as e:
        raise InvalidArgument(f"--tls-cert {files.cert}: not a PEM certificate ({e})") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:
        raise InvalidArgument(
            f"--tls-key {files.key}: the key is encrypted; give it unencrypted (mode 0600)"
        ) from None
    except ValueError as e:
        raise InvalidArgument(f"--tls-key {files.key}: not a PEM private key ({e})") from None
    if _public_bytes(key.public_key()) != _public_bytes(cert.public_key()):
        raise InvalidArgument(
            f"--tls-key {files.key} is not the key of --tls-cert {files.cert} "
            "(give the -key.pem file written with that certificate)"
        )
    if not any(_signed_by(cert, ca) for ca in cas):
        raise InvalidArgument(
            f"--tls-cert {files.cert} ({cert.subject.rfc4514_string()}) is not signed by the CA "
            f"of --tls-ca {files.ca} ({', '.join(c.subject.rfc4514_string() for c in cas)})"
        )
    at = now or datetime.datetime.now(datetime.UTC)
    if not cert.not_valid_before_utc <= at <= cert.not_valid_after_utc:
        raise InvalidArgument(
            f"--tls-cert {files.cert} is valid from {cert.not_valid_before_utc:%Y-%m-%d %H:%M} "
            f"to {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC, not now: issue a new one"
        )
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        server = x509.oid.ExtendedKeyUsageOID.SERVER_AUTH in eku
    except x509.ExtensionNotFound:
        server = True
    return LoadedTLS(
        files=files,
        ca_pem=ca_pem,
        cert_pem=cert_pem,
        key_pem=key_pem,
        identity=parse_identity(cert),
        server=server,
    )


def describe(loaded: LoadedTLS) -> dict[str, str]:
    """The TLS settings for ``--check-config``: the files and the identity found."""
    ident = loaded.identity
    return {
        "tls_ca": str(loaded.files.ca),
        "tls_cert": str(loaded.files.cert),
        "tls_key": str(loaded.files.key),
        "tls_identity": ident.names(),
        "tls_serial": f"{ident.serial:x}",
        "tls_not_after": f"{ident.not_after:%Y-%m-%d %H:%M} UTC" if ident.not_after else "?",
    }


# --- resolving flags and environment ---------------------------------------------------------


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def resolve(
    *,
    ca: str | Path | None = None,
    cert: str | Path | None = None,
    key: str | Path | None = None,
    insecure: bool = False,
    env: Mapping[str, str] | None = None,
    what: str = "",
) -> TLSFiles | None:
    """TLS files or plaintext, from explicit values first, then the environment.

    Explicit values (flags, ClientConfig fields) win over the environment
    (``MEMBERSHIP_TLS_CA``, ``MEMBERSHIP_TLS_CERT``, ``MEMBERSHIP_TLS_KEY``,
    ``MEMBERSHIP_INSECURE=1``). At one level, TLS files and insecure
    together are an error, as is a partial set of files.

    Returns:
        The files, or None for plaintext (insecure asked for explicitly).

    Raises:
        InvalidArgument: neither TLS nor insecure (secure by default), both,
            or only some of the three files.
    """
    prefix = f"{what}: " if what else ""
    given = {"--tls-ca": ca, "--tls-cert": cert, "--tls-key": key}
    environ = os.environ if env is None else env
    source = "flags"
    if not insecure and not any(given.values()):
        given = {
            ENV_CA: environ.get(ENV_CA) or None,
            ENV_CERT: environ.get(ENV_CERT) or None,
            ENV_KEY: environ.get(ENV_KEY) or None,
        }
        insecure = _truthy(environ.get(ENV_INSECURE))
        source = "environment"
    if insecure and any(given.values()):
        raise InvalidArgument(
            f"{prefix}both TLS files and insecure given (in the {source}): choose one"
        )
    if insecure:
        return None
    if not any(given.values()):
        raise InvalidArgument(f"{prefix}no TLS settings: {HOW_TO_GET}")
    missing = [name for name, value in given.items() if not value]
    if missing:
        raise InvalidArgument(
            f"{prefix}{', '.join(missing)} missing: mutual TLS needs the CA, a certificate "
            "and its key"
        )
    ca_v, cert_v, key_v = given.values()
    return TLSFiles(Path(str(ca_v)), Path(str(cert_v)), Path(str(key_v)))


def add_tls_flags(p: argparse.ArgumentParser) -> None:
    """Adds ``--tls-ca --tls-cert --tls-key --insecure`` to a sub-command's parser."""
    g = p.add_argument_group(
        "security (mutual TLS by default; flags win over MEMBERSHIP_TLS_CA, MEMBERSHIP_TLS_CERT, "
        "MEMBERSHIP_TLS_KEY and MEMBERSHIP_INSECURE=1)"
    )
    g.add_argument("--tls-ca", metavar="FILE", default=None, help="the cluster CA, PEM")
    g.add_argument("--tls-cert", metavar="FILE", default=None, help="this member's certificate")
    g.add_argument("--tls-key", metavar="FILE", default=None, help="its private key, PEM")
    g.add_argument(
        "--insecure",
        action="store_true",
        default=False,
        help="plaintext: no TLS, no identities, anyone who reaches a port may do anything",
    )


def config_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`membership.config.ClientConfig` fields of the flags added by
    :func:`add_tls_flags` (``tls_ca``, ``tls_cert``, ``tls_key``, ``insecure``)."""
    return {
        "tls_ca": args.tls_ca,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
        "insecure": args.insecure,
    }


def settings(loaded: LoadedTLS | None) -> dict[str, str]:
    """``--check-config`` lines of a command's TLS: :func:`describe`, or that it is off."""
    if loaded is None:
        return {"tls": "off (--insecure: plaintext, no identities)"}
    return describe(loaded)


def resolve_args(args: argparse.Namespace, what: str = "") -> TLSFiles | None:
    """:func:`resolve` of the flags added by :func:`add_tls_flags`."""
    return resolve(
        ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key, insecure=args.insecure, what=what
    )


# --- credentials --------------------------------------------------------------------------


def channel_credentials(loaded: LoadedTLS) -> grpc.ChannelCredentials:
    """Client credentials: trust the cluster CA, present this member's certificate."""
    return grpc.ssl_channel_credentials(
        root_certificates=loaded.ca_pem,
        private_key=loaded.key_pem,
        certificate_chain=loaded.cert_pem,
    )


def _server_config(loaded: LoadedTLS) -> Any:
    return grpc.ssl_server_certificate_configuration(
        [(loaded.key_pem, loaded.cert_pem)], root_certificates=loaded.ca_pem
    )


class ServerCredentials:
    """A replica's server credentials: mutual TLS (a client certificate is
    required), re-read from the files on :meth:`reload`.

    gRPC asks :meth:`_fetch` for the configuration at each new handshake
    (``grpc.dynamic_ssl_server_credentials``); a reload hands it the new
    files once, so new connections get them and existing ones (and their
    streams) are not touched.

    Args:
        loaded: the files as first loaded (:func:`load`).
    """

    def __init__(self, loaded: LoadedTLS) -> None:
        self.current = loaded
        self._pending: Any = None
        self.credentials = grpc.dynamic_ssl_server_credentials(
            _server_config(loaded), self._fetch, require_client_authentication=True
        )

    def _fetch(self) -> Any:
        pending, self._pending = self._pending, None
        return pending

    def reload(self, check: Callable[[LoadedTLS], None] | None = None) -> LoadedTLS:
        """Re-reads the files; new handshakes use them once this returns.

        Args:
            check: called with the new contents before they are used; it may
                raise InvalidArgument to refuse them.

        Returns:
            The new contents.

        Raises:
            InvalidArgument: a file is missing or bad (the old ones stay in use).
        """
        loaded = load(self.current.files)
        if check is not None:
            check(loaded)
        self._pending = _server_config(loaded)
        self.current = loaded
        return loaded
