"""Leader-side log replication: per-follower progress, flow, commit and quorum contact.

Rules (Ongaro & Ousterhout, "In Search of an Understandable Consensus
Algorithm", 2014, §5.3 and §5.4.2; etcd raft ``tracker.Progress``):

1. Each follower is in PROBE, REPLICATE or SNAPSHOT. In PROBE the leader
   sends one APPEND and waits (paused) for its answer or the next heartbeat
   answer, because it does not yet know where the logs match. In REPLICATE
   it streams entries optimistically, advancing ``next`` as it sends.
2. A rejected APPEND moves ``next`` back, straight to the follower's hint
   (the last index where the logs may match, found by term on both sides),
   never below ``match + 1``; a follower in REPLICATE falls back to PROBE.
   An accepted one raises ``match``; a probing follower starts REPLICATE.
3. The commit index moves to the highest index stored on a quorum, only if
   that entry is of the leader's current term (§5.4.2: older entries are
   committed indirectly).
4. A HEARTBEAT carries ``commit = min(commit, match)``, so a follower never
   learns a commit index beyond what it is known to hold (etcd).
5. Snapshots (§7, etcd ``StateSnapshot``): when the entry before ``next``
   has been compacted away the leader sends its snapshot instead of an
   APPEND and waits in SNAPSHOT for an APPEND_RESP at or past the snapshot
   (or past the leader's first entry), then replicates. A snapshot left
   unanswered while the follower answers one election timeout's worth of
   heartbeats (election_timeout / heartbeat_interval, at least 2) was lost
   and is sent again; so it is after ``report_unreachable``. Rejections are
   stale while in SNAPSHOT and are ignored.
6. Contact: the time of the last APPEND_RESP or HEARTBEAT_RESP from each
   follower is kept; the leader's lease on the group (CheckQuorum, thesis
   §6.2) runs until the quorum-th most recent contact among the voters (the
   leader's own counting as now when it is one) plus the election timeout.
   All followers count as heard when the leader takes office, and a member
   added later when it is added.
7. Configuration (thesis §4.1-4.2): the leader replicates to every member
   of the configuration in force, voters and learners; only voters count
   towards commit and contact, and the leader counts itself only while it is
   a voter (a leader being removed commits its removal without itself,
   §4.2.2). A member added gets a fresh progress; a member removed keeps
   its progress (and gets the log, counting in nothing) until its removal
   is committed, so that it learns the removal and its shell can stop it
   (etcd likewise replicates to a server until its removal is applied).
8. Joining: a member that is not in the configuration the log starts from
   (a replica added later, with an empty disk) never gets entries from index
   1: it could not know the configuration they were made under. It gets a
   snapshot; when there is none yet, ``snapshot_wanted`` is set and the
   caller takes one (``RaftNode.wants_snapshot``).
9. Catch-up (thesis §4.2.1, the promotion rule): a learner is caught up
   when its match index is at or above the leader's commit index at the
   previous check and it answered within the election timeout.

The follower side of these messages is in ``follower``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence

from arbiter.core.raft.config import RaftConfig
from arbiter.core.raft.configuration import ArbiterConfiguration
from arbiter.core.raft.errors import ConflictingState
from arbiter.core.raft.log import RaftLog
from arbiter.core.raft.messages import Message, MessageType, PeerProgress, Snapshot
from arbiter.core.raft.quorum import committed_index

__all__ = ["Progress", "ProgressState", "Replicator"]


class ProgressState(enum.Enum):
    """How the leader is sending to one follower (etcd raft tracker states)."""

    PROBE = "probe"
    REPLICATE = "replicate"
    SNAPSHOT = "snapshot"


class Progress:
    """The leader's view of one follower's log (mutable, leader-private).

    Attributes:
        match: highest index known to be stored on the follower.
        next: index of the next entry to send.
        state: PROBE, REPLICATE or SNAPSHOT.
        paused: in PROBE, an APPEND is outstanding; send no more until an answer.
        heard: monotonic seconds of the last answer from the follower.
        pending_snapshot: in SNAPSHOT, the index of the snapshot sent.
        snapshot_wait: in SNAPSHOT, heartbeat answers left before the
            snapshot is deemed lost and sent again (rule 5).
        catch_up_mark: the leader's commit index at the last catch-up
            check of a learner (rule 9); None before the first.
    """

    __slots__ = (
        "catch_up_mark",
        "heard",
        "match",
        "next",
        "paused",
        "pending_snapshot",
        "snapshot_wait",
        "state",
    )

    def __init__(self, *, next_index: int, now: float) -> None:
        self.catch_up_mark: int | None = None
        self.match = 0
        self.next = next_index
        self.state = ProgressState.PROBE
        self.paused = False
        self.heard = now
        self.pending_snapshot = 0
        self.snapshot_wait = 0

    def become_probe(self) -> None:
        """Falls back to probing just after the last known match."""
        self.state = ProgressState.PROBE
        self.next = self.match + 1
        self.paused = False

    def become_replicate(self) -> None:
        """Starts streaming right after the last known match."""
        self.state = ProgressState.REPLICATE
        self.next = self.match + 1
        self.paused = False

    def become_snapshot(self, index: int, wait: int) -> None:
        """Waits for the follower to take the snapshot at ``index`` (rule 5)."""
        self.state = ProgressState.SNAPSHOT
        self.pending_snapshot = index
        self.snapshot_wait = wait
        self.next = index + 1
        self.paused = True

    def maybe_update(self, index: int) -> bool:
        """Records that the follower matches up to ``index``; True if ``match`` rose."""
        self.paused = False
        self.next = max(self.next, index + 1)
        if index > self.match:
            self.match = index
            return True
        return False

    def maybe_decrease_to(self, rejected: int, hint: int) -> bool:
        """Moves ``next`` back after a rejection of prev index ``rejected``.

        Returns:
            False if the rejection is stale (answers an APPEND sent before a
            newer one), True if ``next`` moved and a new APPEND should go out.
        """
        if self.state is ProgressState.SNAPSHOT:
            return False
        if self.state is ProgressState.REPLICATE:
            if rejected <= self.match:
                return False
            self.become_probe()
            return True
        if self.next - 1 != rejected:
            return False
        self.next = max(min(rejected, hint + 1), self.match + 1)
        self.paused = False
        return True


class Replicator:
    """The leader's replication state for one term.

    Args:
        node_id: the leader's id.
        configuration: the configuration in force (rule 7).
        term: the leader's term.
        log: the leader's log (shared with the node).
        config: timers and limits.
        send: called with each outgoing message.
        now: monotonic seconds at which leadership began.
    """

    def __init__(
        self,
        *,
        node_id: str,
        configuration: ArbiterConfiguration,
        term: int,
        log: RaftLog,
        config: RaftConfig,
        send: Callable[[Message], None],
        now: float,
    ) -> None:
        self._id = node_id
        self._term = term
        self._log = log
        self._config = config
        self._send = send
        self._snapshot_wait = max(2, math.ceil(config.election_timeout / config.heartbeat_interval))
        self.progress: dict[str, Progress] = {}
        self.snapshot_wanted = False
        self._voters: Sequence[str] = ()
        self._learners: Sequence[str] = ()
        self.set_configuration(configuration, log.configuration_at(log.committed), now)

    def set_configuration(
        self, configuration: ArbiterConfiguration, committed: ArbiterConfiguration, now: float
    ) -> None:
        """Follows the configuration in force and the committed one (rule 7): a progress
        for each other member of either; the voters and learners of the one in force."""
        members = [p for p in sorted({*configuration.ids, *committed.ids}) if p != self._id]
        for p in list(self.progress):
            if p not in members:
                del self.progress[p]
        for p in members:
            if p not in self.progress:
                self.progress[p] = Progress(next_index=self._log.last_index + 1, now=now)
        self._voters = tuple(configuration.voters)
        self._learners = tuple(configuration.learners)

    def status(self, now: float) -> dict[str, PeerProgress]:
        """Every other member's progress as seen at ``now`` (seconds)."""
        return {
            p: PeerProgress(
                match=pr.match,
                next=pr.next,
                state=pr.state.value,
                last_heard=max(0.0, now - pr.heard),
                voter=p in self._voters,
                member=p in self._voters or p in self._learners,
            )
            for p, pr in sorted(self.progress.items())
        }

    def caught_up_learners(self, now: float) -> list[str]:
        """The learners caught up by rule 9, sorted; records this check's commit mark."""
        out = []
        for p, pr in sorted(self.progress.items()):
            if p not in self._learners:
                continue
            mark, pr.catch_up_mark = pr.catch_up_mark, self._log.committed
            recent = now - pr.heard < self._config.election_timeout
            if mark is not None and pr.match >= mark and recent:
                out.append(p)
        return out

    # --- sending --------------------------------------------------------------

    def send_append(self, peer: str, *, send_empty: bool = True) -> None:
        """Sends the next APPEND to ``peer`` unless its probe is outstanding.

        Args:
            peer: the follower.
            send_empty: also send when there is no new entry (to carry the
                commit index or to probe).
        """
        pr = self.progress[peer]
        if pr.paused:
            return
        log = self._log
        joining = pr.next == 1 and peer not in log.configuration_at(log.snapshot_index)  # rule 8
        if pr.next <= log.snapshot_index or joining:
            if log.snapshot_index == 0:
                self.snapshot_wanted = True
                return
            self._send_snapshot(peer, pr)
            return
        prev = pr.next - 1
        entries = self._log.slice(pr.next, pr.next + self._config.max_append_entries)
        if not entries and not send_empty:
            return
        self._send(
            Message(
                type=MessageType.APPEND,
                src=self._id,
                dst=peer,
                term=self._term,
                index=prev,
                log_term=self._log.term(prev),
                entries=entries,
                commit=self._log.committed,
            )
        )
        if pr.state is ProgressState.REPLICATE:
            if entries:
                pr.next = entries[-1].index + 1
        else:
            pr.paused = True

    def _send_snapshot(self, peer: str, pr: Progress) -> None:
        """Sends the leader's snapshot: the entries ``peer`` needs are compacted (rule 5)."""
        snapshot: Snapshot = self._log.snapshot
        self.snapshot_wanted = False
        self._send(
            Message(
                type=MessageType.SNAPSHOT,
                src=self._id,
                dst=peer,
                term=self._term,
                commit=self._log.committed,
                snapshot=snapshot,
            )
        )
        pr.become_snapshot(snapshot.index, self._snapshot_wait)

    def broadcast_append(self, *, send_empty: bool = False) -> None:
        """Sends new entries (or, with ``send_empty``, at least the commit) to every follower."""
        for peer in self.progress:
            self.send_append(peer, send_empty=send_empty)

    def broadcast_heartbeat(self) -> None:
        """Sends a HEARTBEAT to every follower (rule 4)."""
        for peer, pr in self.progress.items():
            self._send(
                Message(
                    type=MessageType.HEARTBEAT,
                    src=self._id,
                    dst=peer,
                    term=self._term,
                    commit=min(pr.match, self._log.committed),
                )
            )

    # --- answers ----------------------------------------------------------------

    def on_append_resp(self, msg: Message, now: float) -> None:
        """Handles an APPEND_RESP of the current term (rules 1-3).

        Raises:
            ConflictingState: the follower acknowledges an index beyond this
                leader's log (one of the two lost its durable state).
        """
        pr = self.progress.get(msg.src)
        if pr is None:
            return  # from a replica removed since
        pr.heard = now
        if msg.reject:
            hint = msg.reject_hint
            if msg.log_term > 0:
                hint, _ = self._log.find_conflict_by_term(msg.reject_hint, msg.log_term)
            if pr.maybe_decrease_to(msg.index, hint):
                self.send_append(msg.src)
            return
        if msg.index > self._log.last_index:
            raise ConflictingState(
                f"{msg.src} acknowledged {msg.index}, beyond my last index {self._log.last_index}"
            )
        probe_matched = pr.state is not ProgressState.REPLICATE and msg.index == pr.match
        if not pr.maybe_update(msg.index) and not probe_matched:
            return  # a duplicate or reordered answer
        if pr.state is ProgressState.PROBE or (
            pr.state is ProgressState.SNAPSHOT
            and (pr.match >= pr.pending_snapshot or pr.match + 1 >= self._log.first_index)
        ):
            pr.become_replicate()
        elif pr.state is ProgressState.SNAPSHOT:
            pr.paused = True  # still waiting for the snapshot's answer
        if self.maybe_commit():
            self.broadcast_append(send_empty=True)
        else:
            self.send_append(msg.src, send_empty=False)

    def on_heartbeat_resp(self, msg: Message, now: float) -> None:
        """Handles a HEARTBEAT_RESP: contact, unpause a probe, resend what is missing."""
        pr = self.progress.get(msg.src)
        if pr is None:
            return  # from a replica removed since
        pr.heard = now
        if pr.state is ProgressState.SNAPSHOT:
            pr.snapshot_wait -= 1
            if pr.snapshot_wait > 0:
                return
            pr.become_probe()  # rule 5: the snapshot was lost; send it again
        pr.paused = False
        if pr.match < self._log.last_index:
            self.send_append(msg.src)

    def report_unreachable(self, peer: str) -> None:
        """Transport hint: stop streaming (or waiting for a snapshot) and probe again (etcd)."""
        pr = self.progress.get(peer)
        if pr is not None and pr.state is not ProgressState.PROBE:
            pr.become_probe()

    # --- commit and contact -------------------------------------------------------

    def maybe_commit(self) -> bool:
        """Advances the commit index per rules 3 and 7; True if it moved."""
        matches = [
            self._log.last_index if v == self._id else self.progress[v].match for v in self._voters
        ]
        if not matches:
            return False
        index = committed_index(matches)
        if index <= self._log.committed or self._log.term(index) != self._term:
            return False
        return self._log.commit_to(index)

    def lease_expiry(self) -> float:
        """Monotonic seconds at which the leader stops being in touch with a quorum (rule 6)."""
        if not self._voters:
            return -math.inf
        heard = sorted(
            (math.inf if v == self._id else self.progress[v].heard for v in self._voters),
            reverse=True,
        )
        return heard[len(heard) // 2] + self._config.election_timeout
