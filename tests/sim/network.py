"""A seeded, lossy, partitionable network between replicas, nodes and subscribers.

Rules:

1. Every message travels on a directed link ``(src, dst)``. Its delay is the
   link's base latency, plus an exponential jitter, plus (rarely) a spike;
   jitter and spikes reorder messages. All draws come from one
   ``random.Random`` derived from the run's seed, in the order messages are
   sent, so a seed replays exactly.
2. A message is lost if its link is cut when it is sent or when it would
   arrive, or by the link's drop probability. It may be duplicated (each copy
   has its own delay).
3. Cuts are directed: ``cut(a, b)`` stops a -> b only. Two-way partitions,
   one-way partitions and bridges are sets of cuts; ``heal`` removes them all.
4. Streams (``stream_delay``) are FIFO like a TCP connection: never reordered
   or duplicated; a cut breaks them (the caller decides what that means).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tests.sim.clock import EventQueue

__all__ = ["NetProfile", "Network"]


@dataclass(frozen=True, slots=True, kw_only=True)
class NetProfile:
    """How bad the network is for a whole run (seconds and probabilities).

    Attributes:
        base_min: smallest base latency of a link.
        base_max: largest base latency of a link.
        jitter: mean of the exponential jitter added to every message.
        drop: probability that a message is lost.
        dup: probability that a message is delivered twice.
        spike: probability of a latency spike.
        spike_max: largest spike, drawn uniformly from [0, spike_max).
    """

    base_min: float = 0.0002
    base_max: float = 0.002
    jitter: float = 0.001
    drop: float = 0.0
    dup: float = 0.0
    spike: float = 0.0
    spike_max: float = 0.1

    @classmethod
    def draw(cls, rng: random.Random) -> NetProfile:
        """A random profile: from a clean LAN to a lossy, spiky one."""
        return cls(
            base_min=0.0002,
            base_max=rng.choice((0.001, 0.002, 0.005)),
            jitter=rng.choice((0.0005, 0.001, 0.003)),
            drop=rng.choice((0.0, 0.0, 0.01, 0.03)),
            dup=rng.choice((0.0, 0.01, 0.02)),
            spike=rng.choice((0.0, 0.01, 0.03)),
            spike_max=rng.choice((0.05, 0.15, 0.3)),
        )


class Network:
    """Directed links between named endpoints, with cuts, loss, duplicates and delays.

    Args:
        queue: the event queue deliveries are scheduled on.
        endpoints: every endpoint name (replicas, nodes, subscribers).
        rng: the network's own random stream.
        profile: loss, duplication and delay parameters.
    """

    def __init__(
        self,
        queue: EventQueue,
        endpoints: Iterable[str],
        rng: random.Random,
        profile: NetProfile,
    ) -> None:
        self._q = queue
        self._rng = rng
        self.profile = profile
        self.cuts: set[tuple[str, str]] = set()
        self.lossy = True  # False once the run's faults are over: no random drops
        names = sorted(endpoints)
        self._base = {
            (a, b): rng.uniform(profile.base_min, profile.base_max)
            for a in names
            for b in names
            if a != b
        }
        self._stream_tail: dict[tuple[str, str], float] = {}
        self.sent = 0
        self.lost = 0

    def add_endpoint(self, name: str, others: Iterable[str], rng: random.Random) -> None:
        """Adds ``name`` (a replica started during the run), its links to ``others`` drawn
        from ``rng`` (not the network's stream, so runs without additions stay as they were)."""
        p = self.profile
        for o in others:
            if o != name:
                self._base[(name, o)] = rng.uniform(p.base_min, p.base_max)
                self._base[(o, name)] = rng.uniform(p.base_min, p.base_max)

    # --- faults -------------------------------------------------------------------

    def cut(self, src: str, dst: str) -> None:
        """Stops every message from ``src`` to ``dst`` (one way)."""
        self.cuts.add((src, dst))

    def cut_both(self, a: str, b: str) -> None:
        """Stops every message between ``a`` and ``b``, both ways."""
        self.cuts.add((a, b))
        self.cuts.add((b, a))

    def partition(self, *groups: Iterable[str]) -> None:
        """Cuts every link between endpoints of different groups, both ways.

        Endpoints in no group keep every link (a bridge, if they are replicas).
        """
        sets = [sorted(g) for g in groups]
        for i, g in enumerate(sets):
            for h in sets[i + 1 :]:
                for a in g:
                    for b in h:
                        self.cut_both(a, b)

    def heal(self) -> None:
        """Removes every cut."""
        self.cuts.clear()

    def connected(self, src: str, dst: str) -> bool:
        """True if ``src -> dst`` is not cut."""
        return (src, dst) not in self.cuts

    # --- sending ----------------------------------------------------------------------

    def _delay(self, link: tuple[str, str]) -> float:
        p = self.profile
        rng = self._rng
        d = self._base[link] + rng.expovariate(1.0 / p.jitter)
        if p.spike and rng.random() < p.spike:
            d += rng.random() * p.spike_max
        return d

    def send(self, src: str, dst: str, deliver: Callable[[Any], None], payload: Any) -> None:
        """Sends ``payload`` from ``src``; ``deliver(payload)`` runs on arrival (maybe twice)."""
        link = (src, dst)
        self.sent += 1
        if link in self.cuts:
            self.lost += 1
            return
        p = self.profile
        if self.lossy and p.drop and self._rng.random() < p.drop:
            self.lost += 1
            return
        now = self._q.now
        self._q.at(now + self._delay(link), self._arrive, link, deliver, payload)
        if self.lossy and p.dup and self._rng.random() < p.dup:
            self._q.at(now + self._delay(link), self._arrive, link, deliver, payload)

    def _arrive(self, link: tuple[str, str], deliver: Callable[[Any], None], payload: Any) -> None:
        if link in self.cuts:
            self.lost += 1
            return
        deliver(payload)

    def stream_delay(self, src: str, dst: str) -> float:
        """Arrival time of the next item on the FIFO stream ``src -> dst`` (rule 4)."""
        link = (src, dst)
        t = max(self._q.now + self._delay(link), self._stream_tail.get(link, 0.0))
        self._stream_tail[link] = t
        return t
