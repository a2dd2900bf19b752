"""Restoring the state machine from a Raft snapshot, checked against its configuration.

A replica restarts from its durable snapshot, and a lagging or joining one
from its leader's (Raft §7). Both carry the tally's bytes
(``MembershipState.to_bytes``) and, in the Raft snapshot's metadata, the
arbiter configuration at that index. Rule (the replica's rule 4): the
state machine's configuration must be Raft's; a snapshot written before
configurations were replicated carries none, and then its voters must be
exactly the initial ones, whose addresses it takes. Anything else is a
:class:`RestoreError`, raised before anything is persisted.
"""

from __future__ import annotations

from collections.abc import Sequence

from arbiter.core.raft import ArbiterConfiguration, Snapshot
from arbiter.core.tally import MembershipState, SnapshotDecodeError
from arbiter.errors import ArbiterError

__all__ = ["RestoreError", "restore_state"]


class RestoreError(ArbiterError, ValueError):
    """A snapshot does not fit this replica: undecodable, or another configuration (rule 4)."""


def restore_state(
    snapshot: Snapshot, initial: ArbiterConfiguration | Sequence[str] = ()
) -> MembershipState:
    """The state machine a snapshot holds, checked against the snapshot's configuration.

    Args:
        snapshot: a Raft snapshot whose data is ``MembershipState.to_bytes()``.
        initial: the configuration (or voter ids) the replica was started
            with; used only for a snapshot that carries no configuration (one
            written before configurations were replicated), whose state must
            then have exactly these voters and takes their addresses.

    Raises:
        RestoreError: the data is not a membership snapshot, it was taken at
            another index than the snapshot's, or its configuration differs
            from Raft's (``snapshot.configuration``, else ``initial``'s voters).
    """
    try:
        state = MembershipState.from_bytes(snapshot.data)
    except SnapshotDecodeError as e:
        raise RestoreError(f"snapshot at index {snapshot.index}: {e}") from None
    conf = snapshot.configuration
    if conf is None:
        if not isinstance(initial, ArbiterConfiguration):
            initial = ArbiterConfiguration.initial(dict.fromkeys(initial, ""))
        conf = initial
        if state.configuration.index == 0 and not any(state.configuration.voters.values()):
            state = _with_addresses(state, initial)
    if state.configuration != conf:
        raise RestoreError(
            f"snapshot at index {snapshot.index} is of arbiters {_ids(state.configuration)}, "
            f"but this replica is configured with {_ids(conf)}"
        )
    if state.applied_index != snapshot.index:
        raise RestoreError(
            f"snapshot at index {snapshot.index} holds a state applied to {state.applied_index}"
        )
    return state


def _ids(conf: ArbiterConfiguration) -> str:
    learners = f" (learners {', '.join(conf.learners)})" if conf.learners else ""
    return ", ".join(conf.voters) + learners


def _with_addresses(state: MembershipState, initial: ArbiterConfiguration) -> MembershipState:
    """A state of an old snapshot (voter ids only) given the initial addresses, if the
    ids agree (else unchanged, and the caller refuses it)."""
    if tuple(state.configuration.voters) == tuple(initial.voters) and not initial.learners:
        state._set_configuration(initial.at(0))  # same package, restore only
    return state
