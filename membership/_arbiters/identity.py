"""Which cluster each arbiter belongs to: one client talks to one cluster, each replica once.

Every replica states its cluster identity in acks, events and views:
``name@digest``, the cluster name and a digest of its arbiter set (see
``protos/membership/v1/membership.proto``), and its own arbiter id. A client
asks every address it was given before its first heartbeat or subscription
(:class:`membership._arbiters.calls.Discovery`) and records the answers here.

Rules:

1. Before the client settles, the answers must agree: two identities, a
   cluster name other than the one asked for, or one arbiter id behind two
   addresses (one replica spelled two ways would count twice towards a
   quorum of leases) is a :class:`~membership.shared.errors.ClusterMismatch` that
   names the addresses on each side. The client refuses to start.
2. The client settles once a strict majority of the addresses it was given
   answered with one identity: a node needs a majority anyway, and an
   identity held by a majority cannot be outvoted by one odd address that
   happens to answer first.
3. After that, an address that turns out to answer for another cluster, or
   for an arbiter already reached at another address (a replica that was
   down at the start and comes up), is *refused*: the client does not use
   it, logs why, and keeps the cluster it has; a running node is never
   stopped by a stranger coming up. A refusal is not for ever: the address
   is asked again now and then (requests name the cluster expected, so a
   stranger registers nothing), and an answer of the right cluster and
   arbiter lifts it. Once a majority of the addresses given are refused,
   the cluster the client knew is gone from them: that is a mismatch again.
4. A replica that does not state an identity (empty) is not held against it.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from membership.shared.errors import ClusterMismatch

__all__ = ["ClusterCheck", "cluster_name"]


def cluster_name(identity: str) -> str:
    """The cluster name part of an identity (``"prod@1a2b..."`` -> ``"prod"``)."""
    return identity.rpartition("@")[0] or identity


class ClusterCheck:
    """The identity and arbiter id each address reported, and what they must share.

    Args:
        name: the cluster name the caller expects (None: any, as long as the
            answers agree).
        listed: how many addresses the client was given (rule 2's majority).

    Attributes:
        expected: the identity every arbiter must have (None until settled).
        seen: address -> the identity it reported.
        ids: address -> the arbiter id it reported.
        refused: address -> why it is no longer used (rule 3).
    """

    def __init__(self, name: str | None = None, listed: int = 1) -> None:
        self.name = name
        self.listed = listed
        self.expected: str | None = None
        self.seen: dict[str, str] = {}
        self.ids: dict[str, str] = {}
        self.refused: dict[str, str] = {}

    @property
    def settled(self) -> bool:
        """True once a majority agreed (rule 2)."""
        return self.expected is not None

    def note(self, address: str, identity: str, arbiter_id: str = "") -> None:
        """Records an answer without judging it (see :meth:`verify`): a round of
        answers is gathered first, so that an error names every address."""
        if identity:
            self.seen[address] = identity
        if arbiter_id:
            self.ids[address] = arbiter_id

    def verify(self) -> None:
        """Checks every answer recorded so far (rule 1).

        Raises:
            ClusterMismatch: two identities, another cluster name than the one
                asked for, or one arbiter id at two addresses.
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
        by_id: dict[str, list[str]] = {}
        for address, arbiter_id in self.ids.items():
            by_id.setdefault(arbiter_id, []).append(address)
        for arbiter_id, addresses in by_id.items():
            if len(addresses) > 1:
                raise ClusterMismatch(
                    f"{' and '.join(addresses)} are one arbiter ({arbiter_id}): list each "
                    "replica once (it would count twice towards a quorum)",
                    dict(self.seen),
                )

    def try_settle(self) -> bool:
        """Checks the answers (rule 1) and settles once a majority agrees (rule 2).

        Returns:
            True when settled.

        Raises:
            ClusterMismatch: as :meth:`verify`.
        """
        self.verify()
        if self.expected is None:
            answered = len(self.seen)
            if answered * 2 > self.listed:
                self.expected = next(iter(self.seen.values()))
            elif answered == 0 and len(self.ids) * 2 > self.listed:
                self.expected = ""  # replicas that state no identity (rule 4)
        return self.expected is not None

    def record(self, address: str, identity: str, arbiter_id: str = "") -> bool:
        """Records a later answer from ``address`` and judges it.

        Before the client settled, this is :meth:`note` then :meth:`verify`.
        After, an answer of another cluster, or of an arbiter already reached
        at another address, refuses the address (rule 3).

        Returns:
            True when the address may be used, False when it is refused.

        Raises:
            ClusterMismatch: before settling, as :meth:`verify`.
        """
        if self.expected is None:
            self.note(address, identity, arbiter_id)
            self.verify()
            return True
        if identity and self.expected and identity != self.expected:
            self.refused[address] = (
                f"{address} is in cluster {identity}, not {self.expected} like the others"
            )
            return False
        twin = next((a for a, i in self.ids.items() if i == arbiter_id and a != address), None)
        if arbiter_id and twin is not None and twin not in self.refused:
            self.refused[address] = f"{address} is arbiter {arbiter_id}, reached at {twin} already"
            return False
        self.refused.pop(address, None)  # the right cluster again: the refusal is lifted
        self.note(address, identity, arbiter_id)
        return True

    def lost(self) -> bool:
        """True once a strict majority of the addresses given are refused (rule 3)."""
        return len(self.refused) * 2 > self.listed

    def refuse(self, address: str, why: str) -> bool:
        """Stops using ``address`` (rule 3), for ``why``; True if it was not refused yet."""
        new = address not in self.refused
        self.refused.setdefault(address, why)
        return new

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
