"""Addresses of a replica: ``--peers`` parsed, ``--listen`` checked against it, bound before gRPC.

Split from :mod:`arbiter.server.app` (which re-exports these names): they
are used before a server exists, by the command line's checks and by the
server's start (the stored configuration's address, arbiter/server/consensus/stored.py).
"""

from __future__ import annotations

import errno
import socket

from membership.shared.errors import InvalidArgument

__all__ = ["WILDCARD_HOSTS", "check_bindable", "check_listen", "parse_peers", "split_host_port"]


def split_host_port(address: str) -> tuple[str, int]:
    """``host:port`` (IPv6 hosts in brackets) to ``(host, port)``, the host without brackets.

    Raises:
        InvalidArgument: when it is not host:port with a port in 1..65535.
    """
    from membership.shared.validation import parse_address

    host, _, port = parse_address(address).rpartition(":")
    return host.removeprefix("[").removesuffix("]"), int(port)


def parse_peers(spec: str) -> dict[str, str]:
    """Parses ``a1=host:port,a2=host:port,...`` into an ordered id -> address map.

    Raises:
        InvalidArgument: for an empty list, a malformed item, a duplicate id,
            or one address given to two replicas (hosts compared without case).
    """
    from membership.shared.validation import parse_address, validate_node_id

    peers: dict[str, str] = {}
    owner: dict[tuple[str, int], str] = {}
    for item in (p.strip() for p in spec.split(",")):
        if not item:
            continue
        rid, sep, addr = item.partition("=")
        if not sep:
            raise InvalidArgument(f"peer {item!r} is not id=host:port")
        try:
            validate_node_id(rid)
        except InvalidArgument as e:
            raise InvalidArgument(f"peer id: {e}") from None
        if rid in peers:
            raise InvalidArgument(f"peer id {rid!r} appears twice")
        peers[rid] = parse_address(addr)
        host, port = split_host_port(peers[rid])
        key = (host.lower(), port)
        if key in owner:
            raise InvalidArgument(
                f"--peers gives one address, {peers[rid]}, to {owner[key]} and {rid}: "
                "every replica needs its own"
            )
        owner[key] = rid
    if not peers:
        raise InvalidArgument("no peers given")
    return peers


# Listen hosts meaning "every address of this machine".
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})


def _addresses_of(host: str, port: int) -> set[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return {str(info[4][0]) for info in infos}


def check_listen(replica_id: str, listen: str, peers: dict[str, str]) -> None:
    """Checks that ``--listen`` is this replica's own ``--peers`` address.

    The others reach this replica at its ``--peers`` address only, so a replica
    listening elsewhere is never heard and the group never elects a leader.
    Accepted: the same port, and

    - the same host (without case), or
    - a wildcard listen host (``0.0.0.0``, ``::``, ``[::]``): it listens on
      every address of the machine, and the peer name is not resolved, since
      other machines may resolve it differently (docker-compose.yml listens on
      ``0.0.0.0:7000`` with ``a1=a1:7000``), or
    - two hosts that resolve here to a common address (``localhost`` and
      ``127.0.0.1``).

    Blocks while host names resolve (run it in a thread where that matters).

    Raises:
        InvalidArgument: naming both addresses and how to fix it (a host that
            does not resolve here cannot be checked and is refused too).
    """
    own = peers[replica_id]
    lhost, lport = split_host_port(listen)
    phost, pport = split_host_port(own)
    fix = (
        f"--listen {listen} is not {replica_id}'s own address in --peers ({own}), where the "
        "other replicas look for it; give the same host and port in both, or listen on "
        f"0.0.0.0:{pport}"
    )
    if lport != pport:
        raise InvalidArgument(f"{fix} (the ports differ)")
    if lhost in WILDCARD_HOSTS or lhost.lower() == phost.lower():
        return
    try:
        common = _addresses_of(lhost, lport) & _addresses_of(phost, pport)
    except OSError as e:
        raise InvalidArgument(f"{fix} (cannot resolve a host here: {e})") from None
    if not common:
        raise InvalidArgument(f"{fix} (the hosts resolve to different addresses)")


def check_bindable(listen: str) -> None:
    """Binds ``listen`` with the standard library and lets go, before gRPC tries.

    gRPC logs its own line when a bind fails and reports every failure alike;
    this names the cause. A process may still take the port between this
    check and gRPC's bind; gRPC's error covers that.

    Raises:
        OSError: ``cannot listen on ADDRESS: unknown host``, ``address in use``,
            ``not an address of this machine``, or the system's reason.
        InvalidArgument: a malformed address.
    """
    host, port = split_host_port(listen)
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as e:
        raise OSError(f"cannot listen on {listen}: unknown host {host!r} ({e.strerror})") from None
    reasons = {
        errno.EADDRINUSE: "address in use (another process listens on it)",
        errno.EADDRNOTAVAIL: f"{host} is not an address of this machine",
        errno.EACCES: "permission denied (ports below 1024 need privileges)",
    }
    bound = 0
    failure: OSError | None = None
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does
                sock.bind(sockaddr)
            bound += 1
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                failure = e
                break
            failure = failure or e
    if failure is not None and (bound == 0 or failure.errno == errno.EADDRINUSE):
        why = reasons.get(failure.errno or 0, failure.strerror or str(failure))
        raise OSError(f"cannot listen on {listen}: {why}")
