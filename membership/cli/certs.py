"""``membership certs init`` and ``membership certs issue``: a development CA and certificates.

``certs init DIR --arbiters a1,a2,a3 --nodes n1,n2 [--cluster NAME] [--hosts ...]``
writes, for a new cluster CA (:mod:`membership.testing.pki`):

- ``DIR/ca.pem``: the CA certificate every member trusts (``--tls-ca``);
- ``DIR/ca-key.pem``: the CA's private key (mode 0600), kept so that
  ``certs issue`` can add or re-issue certificates later; move it off the
  machines that run the cluster once you are done issuing;
- ``DIR/<id>.pem`` and ``DIR/<id>-key.pem`` (mode 0600) for every arbiter,
  node, admin (``--admins``, default ``admin``) and observer (``--observers``).

Names (docs/security.md):

- ``--arbiters a1`` -> ``spiffe://<cluster>/arbiter/a1`` with serverAuth and
  the DNS/IP names of ``--hosts`` (default localhost, 127.0.0.1, ::1; an item
  ``a1=HOST`` adds a host to a1's certificate only) plus the id itself;
- ``--nodes n1`` -> ``spiffe://<cluster>/node/n1``, file ``n1.pem``;
- ``--nodes NAME=PATTERN[+PATTERN...]``: one certificate, file ``NAME.pem``,
  for several node ids or prefix patterns (``agent7=host7-*`` may speak for
  every node id starting with ``host7-``, for a host agent that runs many);
  a bare pattern (``host7-*``) is refused: it needs a file name;
- ``--admins admin`` -> ``spiffe://<cluster>/admin/admin``;
- ``--observers w`` -> ``spiffe://<cluster>/observer/w``.

``certs issue DIR ...`` takes the same role flags and signs with the CA
already in DIR (``ca.pem``, ``ca-key.pem``): to add members, or to re-issue
a certificate (``--force``) for rotation (then SIGHUP the replica).

Neither overwrites an existing file without ``--force`` (exit 1, naming
it); ``--keep-existing`` keeps the CA and the certificates already there and
writes only the missing ones (docker-compose.yml's one-shot ``certs``
service, at every start). Bad flags exit 2 (membership/cli.py rules).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from membership.shared.errors import InvalidArgument
from membership.shared.validation import validate_cluster_name, validate_node_id
from membership.testing.pki import (
    LEAF_DAYS,
    CertificateAuthority,
    Member,
    identity_uri,
    write_certificates,
)

__all__ = ["plan", "register"]


def _ids(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def _node_pattern(value: str) -> str:
    prefix = value[:-1] if value.endswith("*") else value
    try:
        validate_node_id(prefix)
    except InvalidArgument as e:
        raise InvalidArgument(f"--nodes {value!r}: {e}") from None
    return value


def plan(
    *,
    cluster: str,
    arbiters: list[str],
    nodes: list[str],
    admins: list[str],
    observers: list[str],
    hosts: list[str],
) -> list[Member]:
    """The certificates to write for these flags (module docstring).

    Raises:
        InvalidArgument: a bad id or pattern, a name given twice, a host for
            an arbiter not listed.
    """
    validate_cluster_name(cluster)
    if "/" in cluster:
        raise InvalidArgument(
            f"--cluster {cluster!r}: a cluster name with '/' cannot be a certificate's "
            "trust domain; use letters, digits, '.', '_' and '-'"
        )
    common = [h for h in hosts if "=" not in h]
    own: dict[str, list[str]] = {}
    for h in hosts:
        if "=" in h:
            rid, _, host = h.partition("=")
            if rid not in arbiters:
                raise InvalidArgument(f"--hosts {h!r}: {rid} is not in --arbiters")
            own.setdefault(rid, []).append(host)
    members: list[Member] = []
    for rid in arbiters:
        validate_node_id(rid)
        names = [*(common or ["localhost", "127.0.0.1", "::1"]), *own.get(rid, [])]
        if rid not in names:
            names.append(rid)
        members.append(
            Member(rid, "arbiter", (identity_uri(cluster, "arbiter", rid),), tuple(names))
        )
    for spec in nodes:
        name, sep, patterns = spec.partition("=")
        if not sep:
            if spec.endswith("*"):
                raise InvalidArgument(
                    f"--nodes {spec!r} is a pattern: name its certificate, NAME={spec}"
                )
            patterns = spec
        validate_node_id(name)
        uris = tuple(
            identity_uri(cluster, "node", _node_pattern(p)) for p in patterns.split("+") if p
        )
        if not uris:
            raise InvalidArgument(f"--nodes {spec!r}: no node id or pattern after '='")
        members.append(Member(name, "node", uris))
    for role, names in (("admin", admins), ("observer", observers)):
        for name in names:
            validate_node_id(name)
            members.append(Member(name, role, (identity_uri(cluster, role, name),)))
    seen: set[str] = {"ca"}
    for m in members:
        if m.name in seen:
            raise InvalidArgument(
                f"{m.name!r} is given twice (or is 'ca'): every certificate needs its own file name"
            )
        seen.add(m.name)
    return members


def _days(value: str) -> float:
    try:
        f = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not 0 < f <= 36500:
        raise argparse.ArgumentTypeError(f"{value!r} must be in (0, 36500] days")
    return f


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Adds ``certs init`` and ``certs issue`` to the ``membership`` parser."""
    p = sub.add_parser(
        "certs",
        help="make a development CA and certificates for mutual TLS",
        description="Make a development CA and certificates for mutual TLS (docs/security.md).",
    )
    actions = p.add_subparsers(dest="certs_command", required=True, metavar="ACTION")
    for action, text in (
        ("init", "a new CA and certificates: DIR/ca.pem, DIR/<id>.pem, DIR/<id>-key.pem"),
        ("issue", "more (or re-issued) certificates signed by the CA already in DIR"),
    ):
        a = actions.add_parser(action, help=text, description=text + ".")
        a.add_argument("dir", type=Path, metavar="DIR", help="output folder")
        a.add_argument(
            "--arbiters",
            required=action == "init",
            default=None,
            metavar="IDS",
            help="replica ids, comma-separated: a1,a2,a3",
        )
        a.add_argument(
            "--nodes",
            default=None,
            metavar="SPECS",
            help="node ids, comma-separated; NAME=PATTERN[+PATTERN] for one certificate "
            "covering several ids or prefixes (agent7=host7-*)",
        )
        a.add_argument(
            "--admins",
            default="admin" if action == "init" else None,
            metavar="NAMES",
            help="admin certificates (default for init: admin)",
        )
        a.add_argument("--observers", default=None, metavar="NAMES", help="read-only certificates")
        a.add_argument(
            "--cluster",
            default="default",
            help="cluster name, the replicas' --cluster (default: default)",
        )
        a.add_argument(
            "--hosts",
            action="append",
            default=[],
            metavar="HOSTS",
            help="DNS names and IP addresses of the arbiters' certificates, comma-separated, "
            "repeatable; A1=HOST for one arbiter only (default localhost,127.0.0.1,::1; "
            "each arbiter's id is always added)",
        )
        a.add_argument(
            "--days",
            type=_days,
            default=LEAF_DAYS,
            help=f"validity of the certificates, days (default {LEAF_DAYS})",
        )
        how = a.add_mutually_exclusive_group()
        how.add_argument("--force", action="store_true", help="overwrite existing files")
        how.add_argument(
            "--keep-existing",
            action="store_true",
            help="keep the CA and every certificate already in DIR; write only the missing "
            "ones, signed by that CA (exits 0 when nothing is missing: for a one-shot "
            "container that runs at every start)",
        )
        a.set_defaults(func=run)


def run(args: argparse.Namespace, interrupt: object) -> int:
    """The command: plans (exit 2 on bad flags), writes (exit 1 on existing files)."""
    from membership.shared.exits import EXIT_OK, CliError

    hosts = [h.strip() for item in args.hosts for h in item.split(",") if h.strip()]
    members = plan(
        cluster=args.cluster,
        arbiters=_ids(args.arbiters),
        nodes=_ids(args.nodes),
        admins=_ids(args.admins),
        observers=_ids(args.observers),
        hosts=hosts,
    )
    folder: Path = args.dir
    if folder.exists() and not folder.is_dir():
        raise InvalidArgument(f"{folder} exists and is not a folder")
    ca = None
    kept = []
    if args.keep_existing and (folder / "ca.pem").exists():
        kept = [m for m in members if (folder / f"{m.name}.pem").exists()]
        members = [m for m in members if m not in kept]
    if args.certs_command == "issue" or (args.keep_existing and (folder / "ca.pem").exists()):
        if not members and not kept:
            raise InvalidArgument(
                "nothing to issue: give --arbiters, --nodes, --admins or --observers"
            )
        try:
            ca = CertificateAuthority.load(
                (folder / "ca.pem").read_bytes(), (folder / "ca-key.pem").read_bytes()
            )
        except (OSError, ValueError) as e:
            raise CliError(
                f"no usable CA in {folder} (ca.pem and ca-key.pem, from certs init): {e}"
            ) from None
    try:
        written = write_certificates(
            folder, members, cluster=args.cluster, ca=ca, days=args.days, force=args.force
        )
    except FileExistsError as e:
        raise CliError(str(e)) from None
    except OSError as e:
        raise CliError(f"cannot write to {folder}: {e.strerror or e}") from None
    for m in kept:
        print(f"kept {folder / m.name}.pem")
    for path in written:
        print(path)
    for m in members:
        print(
            f"  {m.name}: {', '.join(m.uris)}"
            + (f" (hosts {','.join(m.hosts)})" if m.hosts else "")
        )
    return EXIT_OK
