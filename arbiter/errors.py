"""The root of the arbiter package's exception hierarchy.

Every error the arbiter raises on purpose derives from :class:`ArbiterError`,
so a program embedding a replica can catch them all in one clause. Each
subclass keeps the standard base that says what kind of failure it is, so
callers that catch ``ValueError`` or ``OSError`` keep working:

* ``arbiter.core.raft.RaftError``: the Raft core refused an input. Its
  subclasses say why: ``ProposalDropped`` (no leader to take a proposal),
  ``InvalidInput`` (also a ``ValueError``: an input the core has no
  transition for) and ``ConflictingState`` (a peer's message contradicts
  this replica's durable Raft state).
* ``arbiter.core.commands.CommandDecodeError`` (``ValueError``): a log entry
  is not a valid command.
* ``arbiter.core.tally_snapshot.SnapshotDecodeError`` (``ValueError``, also
  importable from ``arbiter.core.tally``): a snapshot is not a valid
  membership state.
* ``arbiter.core.replica.RestoreError`` (``ValueError``): a snapshot does not
  fit this replica.
* ``arbiter.server.consensus.storage.StorageError`` (``OSError``): the data directory
  cannot be used.

A bad setting is :class:`membership.shared.errors.InvalidArgument`, the SDK's error,
as the arbiter validates its settings with the rules the client uses. A broken
invariant of a replica's own state (a caller bug) is an ``AssertionError``,
never an ``ArbiterError``.

This module imports nothing, so the sans-I/O core can use it.
"""

__all__ = ["ArbiterError"]


class ArbiterError(Exception):
    """Root of every error the arbiter package raises on purpose."""
