"""One replica's record of its opinion of one node, and the observation it owes.

Sans-I/O, data only: :mod:`arbiter.core.observer` makes and keeps these
records (its rules 1 to 5); :func:`to_observation` turns one into the
observation proposed to the log (:mod:`arbiter.core.commands`).
"""

from __future__ import annotations

from dataclasses import dataclass

from arbiter.core.commands import Observation, Opinion

__all__ = ["OpinionRecord", "to_observation"]


@dataclass(slots=True)
class OpinionRecord:
    """This replica's latest opinion of one node and where its observation stands.

    Attributes:
        incarnation: the node's life the opinion is about.
        opinion: ALIVE or SUSPECT.
        seq: the observation's sequence number (observer rule 1).
        labels: the node's labels, sorted (key, value) pairs.
        evidence: SUSPECT only: (silence seconds, suspicion level).
        assumed: ALIVE after a restart without hearing the node: never proposed
            (observer rule 5).
        proposed_at: monotonic seconds it was last proposed (None: never, or
            committed).
        committed: the committed state holds it.
        since: monotonic seconds it was made: ready to be proposed from then.
        retried: proposed more than once: no commit-time sample (Karn's rule,
            :mod:`arbiter.core.retry`).
        era: the leader era it was last proposed in (retry rule 4).
    """

    incarnation: int
    opinion: Opinion
    seq: int
    labels: tuple[tuple[str, str], ...]
    evidence: tuple[float, float] | None = None
    assumed: bool = False
    proposed_at: float | None = None
    committed: bool = False
    since: float = 0.0
    retried: bool = False
    era: int = 0


def to_observation(node_id: str, op: OpinionRecord, detector: str) -> Observation:
    """The observation ``op`` owes the log (labels only with ALIVE, evidence only with
    SUSPECT, ``detector`` naming the failure detector that produced the evidence)."""
    ev = op.evidence if op.opinion is Opinion.SUSPECT else None
    return Observation(
        node_id=node_id,
        incarnation=op.incarnation,
        opinion=op.opinion,
        seq=op.seq,
        labels=op.labels if op.opinion is Opinion.ALIVE else (),
        silence=None if ev is None else ev[0],
        suspicion=None if ev is None else ev[1],
        detector=detector if ev is not None else "",
    )
