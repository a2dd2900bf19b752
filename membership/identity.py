"""Which cluster each arbiter belongs to: one client talks to one cluster, checked.

Every replica states its cluster identity in acks, events and views:
``name@digest``, the cluster name and a digest of its arbiter set (see
``protos/membership/v1/membership.proto``). A client records what each
address it was given says; the first identity heard is the one every other
arbiter must share. A second one means the client was given replicas of two
clusters: it refuses them, naming them, before it sends anything that
would register it with the wrong one. Requests carry the expected identity,
so a replica of another cluster refuses them too, even before the client
heard it (the server side of the same rule).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from membership.errors import ClusterMismatch

__all__ = ["ClusterCheck", "cluster_name"]


def cluster_name(identity: str) -> str:
    """The cluster name part of an identity (``"prod@1a2b..."`` -> ``"prod"``)."""
    return identity.rpartition("@")[0] or identity


class ClusterCheck:
    """The cluster identity each arbiter reported, and the one they must share.

    Args:
        name: the cluster name the caller expects (None: any, as long as every
            arbiter reports the same identity).
    """

    def __init__(self, name: str | None = None) -> None:
        self.name = name
        self.expected: str | None = None
        self.seen: dict[str, str] = {}

    def record(self, address: str, identity: str) -> None:
        """Records that the arbiter at ``address`` reported ``identity``, and checks it.

        An empty identity (a replica that does not state one) is ignored.

        Raises:
            ClusterMismatch: ``identity`` differs from the one already
                expected, or its name is not the one asked for; the message
                names the arbiters on each side.
        """
        self.note(address, identity)
        self.verify()

    def note(self, address: str, identity: str) -> None:
        """Records what ``address`` reported without checking it yet (see :meth:`verify`):
        a round of answers is gathered first, so the error names every arbiter."""
        if not identity:
            return
        self.seen[address] = identity
        if self.expected is None:
            self.expected = identity

    def verify(self) -> None:
        """Checks every identity recorded so far.

        Raises:
            ClusterMismatch: two identities, or a name other than the one asked for.
        """
        if self.name is not None:
            for address, identity in self.seen.items():
                if cluster_name(identity) != self.name:
                    raise ClusterMismatch(
                        f"arbiter {address} is in cluster {cluster_name(identity)!r} "
                        f"({identity}), not {self.name!r}: check the arbiter addresses or "
                        "the cluster name",
                        dict(self.seen),
                    )
        if len(set(self.seen.values())) > 1:
            raise ClusterMismatch(self._describe(), dict(self.seen))

    def _describe(self) -> str:
        groups: dict[str, list[str]] = {}
        for addr, ident in self.seen.items():
            groups.setdefault(ident, []).append(addr)
        parts = [f"{', '.join(addrs)} in cluster {ident}" for ident, addrs in groups.items()]
        return (
            "the arbiters given belong to different clusters: "
            + "; ".join(parts)
            + ". List the replicas of one cluster"
        )
