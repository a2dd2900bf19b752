"""The stored configuration wins over ``--peers``: which arbiter set a replica starts from.

Rules:

1. First start (an empty data dir): the arbiter set is ``--peers``; the
   cluster identity is ``name@digest`` of it (:func:`cluster_identity`),
   recorded in the data dir with that set (storage rule 5a). Every replica of
   a new group must be given the same ``--peers``: replicas given different
   lists get different identities and refuse each other's Raft traffic.
2. Every later start: the identity and the first set are read from the data
   dir, and the configuration in force is the latest one in the log and
   snapshot (Raft membership changes, :mod:`arbiter.server.consensus.arbiterset`).
   ``--peers`` is not used; when it differs from the configuration in force a
   WARNING names both and says the stored one is used. (An operator who added
   a replica need not edit every replica's ``--peers``; a stale list can
   never shrink or split the group.)
3. Refused loudly (exit 1, saying what to do), where ``--peers`` and the
   data dir conflict in a way that could split the group or leave this
   replica unheard: ``--listen`` not at this replica's own address in the
   configuration in force (the others would never reach it; checked by the
   server with :func:`arbiter.server.app.check_listen`). A data dir of
   another replica or cluster is refused by storage rule 5.
4. A replica that joins (``--join``) takes the identity from the group
   (:mod:`arbiter.server.ops.joining`) and records it at its first start; a
   restart with ``--join`` and a data dir that holds state restarts from the
   stored configuration, like any other.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from arbiter.server.consensus.storage import Storage, cluster_identity

__all__ = ["cluster_identity", "describe", "first_configuration"]

log = logging.getLogger("arbiter")


def describe(arbiters: Mapping[str, str]) -> str:
    """``a1=host:port,a2=...`` sorted by id (for logs and refusals)."""
    return ",".join(f"{k}={arbiters[k]}" for k in sorted(arbiters))


def first_configuration(
    storage: Storage, replica_id: str, peers: Mapping[str, str]
) -> dict[str, str]:
    """The first arbiter set to build the replica from (rules 1 and 2), logged.

    Args:
        storage: the opened data dir (its first set and identity recorded).
        replica_id: this replica's id.
        peers: ``--peers`` as given (empty for ``--join``).

    Returns:
        id -> ``host:port``: ``peers`` at a first start, the recorded set after.
        The configuration in force may have changed since (the log says).
    """
    if storage.first_start:
        log.info(
            "arbiter %s: first start: arbiter set from %s (%s), cluster identity %s recorded "
            "in the data dir",
            replica_id,
            "the group it joins" if storage.joined else "--peers",
            describe(peers),
            storage.identity,
        )
        return dict(peers)
    stored = storage.arbiters
    if stored and "" in stored.values():  # a data dir that recorded ids only (old)
        stored = {rid: peers.get(rid, "") for rid in stored}
    log.info(
        "arbiter %s: restart: the stored configuration %s (first set %s, "
        "cluster identity %s; changes since are in the log)",
        replica_id,
        # a replica that joined a group is restarted with --join: no --peers to speak of
        "is used" if storage.joined else "wins over --peers",
        describe(stored) if stored else "none: joined a running group",
        storage.identity,
    )
    return stored


def warn_if_peers_differ(
    replica_id: str, peers: Mapping[str, str], in_force: Mapping[str, str], index: int
) -> None:
    """Rule 2: a WARNING when ``--peers`` is not the configuration in force."""
    if peers and dict(peers) != dict(in_force):
        log.warning(
            "arbiter %s: --peers (%s) differs from the stored configuration in force at log "
            "index %d (%s): the stored one is used (--peers counts at a first start only)",
            replica_id,
            describe(peers),
            index,
            describe(in_force),
        )
