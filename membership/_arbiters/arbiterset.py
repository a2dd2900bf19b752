"""Which arbiters a client talks to: following the configuration the acks carry.

Sans-I/O: :class:`ArbiterFollower` takes what acks and events say and
answers with a :class:`Plan`; the node agent (membership/_node/agent.py) and the
watcher (membership/_watch/subscription.py) open and close links by it.

Rules:

1. Acks, QuorumStatus, Progress and GetView carry the arbiter configuration
   in force at the answering replica and its ``config_index``. The follower
   keeps the highest index seen and ignores older ones (a replica that lags
   never takes the client back to an older group).
2. Arbiters are named by the address the client reaches them at (its links'
   keys). An arbiter whose id answered at an address the client already
   uses keeps that address (``localhost:7001`` given, ``127.0.0.1:7001``
   configured); a new one is reached at its configured address.
3. A plan opens links to the configuration's members the client has no
   link to (voters and learners: a learner must hear the node before it is
   promoted), closes the links of arbiters that left the configuration, and
   names the voters whose leases count (membership/_node/session.py rule 9).
4. An empty arbiter list (a replica older than this protocol) changes
   nothing, and neither does the group's first configuration (index 0): it
   is the one the client was given (every arbiter listed), and until an
   arbiter at a given address answered, its id is not known, so its
   configured address could not be matched with the given one (rule 2).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["ArbiterFollower", "Plan"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """What a new configuration asks of the client (rule 3).

    Attributes:
        index: the configuration's ``config_index``.
        open: addresses to open a link to (new members).
        close: addresses whose links to close (arbiters that left).
        voters: addresses of the voters (their leases count).
        learners: addresses of the learners.
    """

    index: int
    open: tuple[str, ...]
    close: tuple[str, ...]
    voters: tuple[str, ...]
    learners: tuple[str, ...]


class ArbiterFollower:
    """Follows the highest configuration seen (rules 1 to 4).

    Args:
        addresses: the arbiters the client was given (its first links).
    """

    def __init__(self, addresses: Sequence[str]) -> None:
        self.links: list[str] = list(addresses)
        self.index = 0  # rule 4: the first configuration is the one given
        # Arbiter id -> the address the client reached it at (rule 2).
        self._seen: dict[str, str] = {}

    def heard(self, address: str, arbiter_id: str) -> None:
        """Records that the arbiter at ``address`` says it is ``arbiter_id``."""
        if arbiter_id:
            self._seen[arbiter_id] = address

    def offer(self, arbiters: Iterable[tuple[str, str, bool]], index: int) -> Plan | None:
        """Takes a configuration from an ack or event; a Plan when it is newer (rule 1).

        Args:
            arbiters: ``(id, address, voter)`` for every member.
            index: its ``config_index``.
        """
        members = list(arbiters)
        if not members or index <= self.index or not any(v for _, _, v in members):
            return None
        self.index = index
        keyed = [(self._seen.get(rid, address), voter) for rid, address, voter in members]
        wanted = [k for k, _ in keyed]
        plan = Plan(
            index=index,
            open=tuple(k for k in wanted if k not in self.links),
            close=tuple(k for k in self.links if k not in wanted),
            voters=tuple(k for k, v in keyed if v),
            learners=tuple(k for k, v in keyed if not v),
        )
        self.links = wanted
        return plan
