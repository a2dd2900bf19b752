"""Mutual TLS: certificate files, flags and environment variables, gRPC credentials.

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

What lives here (identities and their rights are in :mod:`membership.shared.grants`;
the server's policy is :class:`arbiter.server.net.authz.MutualTLS`):

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
  handshakes only: established connections and streams are untouched.
"""

from __future__ import annotations

import argparse
import datetime
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

from membership.shared.errors import InvalidArgument
from membership.shared.grants import Identity, parse_identity

__all__ = [
    "ENV_CA",
    "ENV_CERT",
    "ENV_INSECURE",
    "ENV_KEY",
    "LoadedTLS",
    "ServerCredentials",
    "TLSFiles",
    "add_tls_flags",
    "channel_credentials",
    "config_fields",
    "describe",
    "env_flag",
    "handshake_hint",
    "load",
    "resolve",
    "resolve_args",
    "settings",
    "settings_of",
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


# --- files --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TLSFiles:
    """The three PEM files of a member: the cluster CA, its certificate, its key.

    ``given`` says how the user named each file (a flag such as ``--tls-key``, an
    environment variable such as ``MEMBERSHIP_TLS_KEY``, or a
    ``ClientConfig`` field such as ``tls_key``), in the order ca, cert, key: the
    errors of :func:`load` name each file as it was given. It takes no part in
    equality.
    """

    ca: Path
    cert: Path
    key: Path
    given: tuple[str, str, str] = field(
        default=("--tls-ca", "--tls-cert", "--tls-key"), compare=False
    )

    def said(self, which: str) -> str:
        """How the user gave one file (``which``: "ca", "cert" or "key"), for an
        error message: ``--tls-key k.pem``, ``MEMBERSHIP_TLS_KEY=k.pem`` or
        ``ClientConfig(tls_key='k.pem')``."""
        name = self.given[("ca", "cert", "key").index(which)]
        path = getattr(self, which)
        if name.startswith("--"):
            return f"{name} {path}"
        if name.startswith("MEMBERSHIP_"):
            return f"{name}={path}"
        return f"ClientConfig({name}={str(path)!r})"

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


def _read(path: Path, said: str) -> bytes:
    """The bytes of one PEM file; ``said`` is how the user gave it (TLSFiles.said)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InvalidArgument(f"{said}: no such file") from None
    except IsADirectoryError:
        raise InvalidArgument(f"{said}: is a folder, not a PEM file") from None
    except OSError as e:
        raise InvalidArgument(f"{said}: cannot read it: {e.strerror or e}") from None
    if b"-----BEGIN " not in data:
        raise InvalidArgument(f"{said}: not PEM (no -----BEGIN line)")
    return data


def _public_bytes(key: Any) -> bytes:
    return bytes(
        key.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def _key_id(cert: x509.Certificate, authority: bool = False) -> str:
    """ ", key id AB:CD:..." of a certificate's subject key identifier (its authority key
    identifier with ``authority``), the first 8 bytes; "" when it has none. Two CAs of
    one name (two ``membership certs init`` of one cluster) differ in it."""
    kind = x509.AuthorityKeyIdentifier if authority else x509.SubjectKeyIdentifier
    try:
        ext = cert.extensions.get_extension_for_class(kind).value
    except x509.ExtensionNotFound:
        return ""
    digest = ext.key_identifier if authority else ext.digest  # type: ignore[attr-defined]
    if not digest:
        return ""
    return ", key id " + ":".join(f"{b:02X}" for b in digest[:8])


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
    ca_pem = _read(files.ca, files.said("ca"))
    cert_pem = _read(files.cert, files.said("cert"))
    key_pem = _read(files.key, files.said("key"))
    try:
        cas = x509.load_pem_x509_certificates(ca_pem)
    except ValueError as e:
        raise InvalidArgument(f"{files.said('ca')}: not a PEM certificate ({e})") from None
    try:
        cert = x509.load_pem_x509_certificates(cert_pem)[0]
    except ValueError as e:
        raise InvalidArgument(f"{files.said('cert')}: not a PEM certificate ({e})") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:
        raise InvalidArgument(
            f"{files.said('key')}: the key is encrypted; give it unencrypted (mode 0600)"
        ) from None
    except ValueError as e:
        raise InvalidArgument(f"{files.said('key')}: not a PEM private key ({e})") from None
    if _public_bytes(key.public_key()) != _public_bytes(cert.public_key()):
        raise InvalidArgument(
            f"{files.said('key')} is not the key of {files.said('cert')} "
            "(give the -key.pem file written with that certificate)"
        )
    if not any(_signed_by(cert, ca) for ca in cas):
        issuer = f"issued by {cert.issuer.rfc4514_string()}{_key_id(cert, authority=True)}"
        trusted = ", ".join(f"{c.subject.rfc4514_string()}{_key_id(c)}" for c in cas)
        named = any(cert.issuer == c.subject for c in cas)
        same = " (another CA of the same name)" if named else ""
        raise InvalidArgument(
            f"{files.said('cert')} ({cert.subject.rfc4514_string()}, {issuer}) is not "
            f"signed by the CA of {files.said('ca')} ({trusted}){same}"
        )
    at = now or datetime.datetime.now(datetime.UTC)
    if not cert.not_valid_before_utc <= at <= cert.not_valid_after_utc:
        raise InvalidArgument(
            f"{files.said('cert')} is valid from {cert.not_valid_before_utc:%Y-%m-%d %H:%M} "
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


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")

# How each setting is named to whoever gave it: command-line flags, or the
# fields of membership.ClientConfig (the SDK), and the environment variable.
_FLAG_NAMES = {"ca": "--tls-ca", "cert": "--tls-cert", "key": "--tls-key", "insecure": "--insecure"}
_FIELD_NAMES = {
    "ca": "ClientConfig(tls_ca=)",
    "cert": "ClientConfig(tls_cert=)",
    "key": "ClientConfig(tls_key=)",
    "insecure": "ClientConfig(insecure=True)",
}
_ENV_NAMES = {"ca": ENV_CA, "cert": ENV_CERT, "key": ENV_KEY}
# TLSFiles.given of a ClientConfig field: the bare field name
_GIVEN_AS = {_FIELD_NAMES[k]: f"tls_{k}" for k in ("ca", "cert", "key")}

HOW_TO_GET_SDK = (
    "pass config=ClientConfig(tls_ca='ca.pem', tls_cert='n1.pem', tls_key='n1-key.pem') "
    "(or set MEMBERSHIP_TLS_CA, MEMBERSHIP_TLS_CERT, MEMBERSHIP_TLS_KEY; `membership certs "
    "init DIR --arbiters a1,a2,a3 --nodes n1` makes a development CA and certificates), or "
    "ClientConfig(insecure=True) (MEMBERSHIP_INSECURE=1) for plaintext"
)


def env_flag(env: Mapping[str, str], name: str) -> bool:
    """A boolean environment variable: unset, empty, 0/false/no/off are False and
    1/true/yes/on are True (any case).

    Raises:
        InvalidArgument: any other value (``MEMBERSHIP_INSECURE=banana`` is not
            silently false), naming the variable.
    """
    value = env.get(name)
    v = (value or "").strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise InvalidArgument(
        f"{name}={value!r} is not a boolean: use 1, true, yes or on (or 0, false, no, off, "
        "or leave it unset)"
    )


def resolve(
    *,
    ca: str | Path | None = None,
    cert: str | Path | None = None,
    key: str | Path | None = None,
    insecure: bool = False,
    env: Mapping[str, str] | None = None,
    what: str = "",
    names: str = "flags",
) -> TLSFiles | None:
    """TLS files or plaintext, from explicit values first, then the environment.

    Explicit values (flags, ClientConfig fields) win over the environment
    (``MEMBERSHIP_TLS_CA``, ``MEMBERSHIP_TLS_CERT``, ``MEMBERSHIP_TLS_KEY``,
    ``MEMBERSHIP_INSECURE``), item by item: ``--tls-ca`` given with
    ``MEMBERSHIP_TLS_CERT`` and ``MEMBERSHIP_TLS_KEY`` set uses all three. An
    explicit choice of one mode ignores the other mode's variables: explicit
    insecure ignores the TLS variables, an explicit TLS file ignores
    ``MEMBERSHIP_INSECURE``. TLS files and insecure chosen at one level
    (both explicit, or both in the environment) are an error, as is a
    partial set of files. Every error names the setting as it was given: the
    flag (``names="flags"``), the ClientConfig field (``names="config"``), or
    the environment variable.

    Returns:
        The files, or None for plaintext (insecure asked for explicitly).

    Raises:
        InvalidArgument: neither TLS nor insecure (secure by default), both,
            only some of the three files, or ``MEMBERSHIP_INSECURE`` not a boolean.
    """
    prefix = f"{what}: " if what else ""
    own = _FIELD_NAMES if names == "config" else _FLAG_NAMES
    environ = os.environ if env is None else env
    explicit = {"ca": ca, "cert": cert, "key": key}
    if insecure:
        if any(explicit.values()):
            given = ", ".join(own[k] for k, v in explicit.items() if v)
            raise InvalidArgument(
                f"{prefix}both TLS files ({given}) and {own['insecure']} given: choose one"
            )
        return None  # the TLS variables are the other mode's: ignored
    values: dict[str, Any] = {}
    source: dict[str, str] = {}
    for k, v in explicit.items():
        if v:
            values[k], source[k] = v, own[k]
        elif environ.get(_ENV_NAMES[k]):
            values[k], source[k] = environ[_ENV_NAMES[k]], _ENV_NAMES[k]
    # nothing explicit: the environment decides the mode
    if not any(explicit.values()) and env_flag(environ, ENV_INSECURE):
        if values:
            given = ", ".join(source.values())
            raise InvalidArgument(
                f"{prefix}both TLS files ({given}) and {ENV_INSECURE} given in the "
                "environment: choose one"
            )
        return None
    if not values:
        how = HOW_TO_GET_SDK if names == "config" else HOW_TO_GET
        raise InvalidArgument(f"{prefix}no TLS settings: {how}")
    missing = [k for k in explicit if k not in values]
    if missing:
        # named as the user gave the others: all from the environment, its variables
        from_env = all(source[k] == _ENV_NAMES[k] for k in values)
        first, other = (_ENV_NAMES, own) if from_env else (own, _ENV_NAMES)
        raise InvalidArgument(
            f"{prefix}{', '.join(first[k] for k in missing)} missing (or "
            f"{', '.join(other[k] for k in missing)}): mutual TLS needs the CA, a certificate "
            f"and its key; given: {', '.join(source[k] for k in values)}"
        )
    ca_as, cert_as, key_as = (_GIVEN_AS.get(source[k], source[k]) for k in ("ca", "cert", "key"))
    return TLSFiles(
        Path(str(values["ca"])),
        Path(str(values["cert"])),
        Path(str(values["key"])),
        given=(ca_as, cert_as, key_as),
    )


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
    """The :class:`membership._config.ClientConfig` fields of the flags added by
    :func:`add_tls_flags` (``tls_ca``, ``tls_cert``, ``tls_key``, ``insecure``).

    Raises:
        InvalidArgument: as :func:`resolve` and :func:`load`, its message naming
            the flags and variables the user gave (the client would name its
            ClientConfig fields, which a CLI user never typed).
    """
    files = resolve_args(args)
    if files is not None:
        load(files)  # the files' errors too, in the names the user gave
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


def settings_of(config: Any) -> dict[str, str]:
    """:func:`settings` of a :class:`membership._config.ClientConfig` (files re-read).

    Raises:
        InvalidArgument: as :meth:`membership._config.ClientConfig.transport_security`
            and :func:`load`.
    """
    files = config.transport_security()
    return settings(None if files is None else load(files))


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


def handshake_hint(details: str | None, *, insecure: bool) -> str:
    """What a failed connection's gRPC ``details`` mean for TLS, as a suffix for the
    error line ("" when they say nothing of it; issue 25, item 3).

    gRPC reports a plaintext client on a TLS port as ``Socket closed`` and a server
    certificate from another CA as ``TSI_PROTOCOL_FAILURE ... CERTIFICATE_VERIFY_FAILED``,
    which read as an outage.

    Args:
        details: the ``AioRpcError.details()`` of the failed call.
        insecure: True when this client speaks plaintext (``--insecure``).
    """
    text = details or ""
    if insecure and "Socket closed" in text:
        return (
            " (the arbiters may expect TLS: this client is --insecure; give --tls-ca, "
            "--tls-cert and --tls-key, or MEMBERSHIP_TLS_CA, _CERT and _KEY)"
        )
    if not insecure and ("CERTIFICATE_VERIFY_FAILED" in text or "TSI_PROTOCOL_FAILURE" in text):
        return (
            " (the TLS handshake failed: the arbiter's certificate is not signed by the CA "
            "this client was given; give this cluster's CA, --tls-ca or MEMBERSHIP_TLS_CA)"
        )
    if not insecure and "Socket closed" in text:
        return (
            " (the arbiter closed the connection: it may not trust this client's certificate; "
            "it must be signed by the CA the arbiters were given, whatever this client trusts)"
        )
    return ""


def _hint_of(reason: str) -> str:
    """The trailing " (the ...)" hint of a reason, or ""."""
    at = reason.rfind(" (the ")
    return reason[at:] if at >= 0 and reason.endswith(")") else ""


def join_reasons(reasons: Mapping[str, str], empty: str = "") -> str:
    """``"a1: why; a2: why"`` for an error line, or ``empty`` with no reason. A hint that
    ends every reason alike (" (the ...)", :func:`handshake_hint`) is said once, at the end.

    Args:
        reasons: arbiter address or id -> why it failed.
        empty: the text for no reason at all.
    """
    if not reasons:
        return empty
    hints = {_hint_of(r) for r in reasons.values()}
    hint = hints.pop() if len(hints) == 1 else ""
    if not hint or len(reasons) < 2:
        return "; ".join(f"{a}: {r}" for a, r in reasons.items())
    return "; ".join(f"{a}: {r[: -len(hint)]}" for a, r in reasons.items()) + hint
