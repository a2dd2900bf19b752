"""One replica's standing in the arbiter group, as ``Admin.Status`` answers it.

What a ``membership admin status`` line shows (membership/cli/admin/status.py):
the Raft role, term, leader and log indexes, the applied epoch, whether the
replica is in a quorum, the package version, the configuration it knows
(:meth:`arbiter.server.app.ArbiterServer.configuration`, the one accessor of
the arbiter set) and, on the leader, each follower's progress: its match
index (the highest log index known to be stored there, etcd raft's
``Progress.Match``) and its lag, the leader's last log index minus it.
A follower the leader has not heard from yet has match index 0.
"""

from __future__ import annotations

import time

from arbiter.server.ops.operated import OperatedReplica
from membership.v1 import membership_pb2 as pb

__all__ = ["describe", "package_version"]


def package_version() -> str:
    """The installed grpc-membership version (``membership --version``)."""
    import membership

    return str(membership.__version__)


def describe(server: OperatedReplica) -> pb.StatusResponse:
    """The :class:`StatusResponse` of a running replica (module docstring)."""
    driver = server.driver
    # With ``now``, a leader's view of every other member too (learners included).
    st = driver.replica.status(time.monotonic())
    status = driver.status()
    config = server.configuration()
    followers = {
        rid: pb.FollowerProgress(
            match_index=p.match,
            lag=max(0, st.last_index - p.match),
            last_heard_seconds=p.last_heard,
        )
        for rid, p in sorted(st.progress.items())
    }
    return pb.StatusResponse(
        arbiter_id=server.replica_id,
        role=st.role.value,
        term=st.term,
        leader_id=st.leader or "",
        commit_index=st.commit,
        applied_index=st.applied,
        last_index=st.last_index,
        snapshot_index=st.snapshot_index,
        epoch=driver.state.epoch,
        in_quorum=status.in_quorum,
        version=package_version(),
        followers=followers,
        voters=config["voters"],
        learners=config["learners"],
        cluster=server.identity,
        instance=driver.state.instance,
    )
