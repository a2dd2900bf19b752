"""Shedding: new heartbeat streams refused while the replica is loaded (monitor.py's figures).

Rule (:func:`check_shedding`): a heartbeat stream whose first
heartbeat names a node the replica does not know (no opinion, no record
in the view) is refused while the loop thread's time *on a CPU* (monitor.py rule 1
without the wait for one: the replica's own work, not its neighbours')
is above ``shed_utilisation`` of the time (1.0: never; through an ingest
worker, the maximum of the replica's and that worker's, as its latest
batch gave it), or its backlog is at least ``shed_lateness`` seconds
(monitor.py rule 4: the loop's lateness averaged over the last 2 s, or an
ingest backlog; a short stall counts little, being short). The backlog is
what makes shedding fire on a replica that falls behind while it *waits*
for a CPU: a starved loop's time on a CPU stays low, but its acks are late.
Refused:
RESOURCE_EXHAUSTED with a message that starts ``shedding:`` and names the
load, and the trailing metadata ``grpc-retry-pushback-ms`` (gRFC A6): the
hint ``h`` times a random factor in [1, 2), so that refused nodes do not
come back in step. ``h`` is ``shed_retry_after`` when an episode of
shedding starts, and doubles for every ``shed_retry_after`` seconds it
lasts, up to half the longest hint a client takes (``MAX_PUSHBACK``): a
refused node comes back, and every return costs the replica a new stream
(gRPC's accept, the handler, the first heartbeat) whether it is taken or
refused again, so a storm refused at a fixed hint would be offered again
at the same rate for as long as the replica is behind. The episode ends at
the first check that finds the replica unloaded, or once nothing was shed
for ``2 * shed_retry_after`` seconds. Streams of known nodes are never
shed: refusing them would make the replica suspect live nodes, and a node
that reconnects is load the replica already carries. Known: this replica
has an opinion of it, the view has a record of it, or another replica's
observation of it is committed (it is joining: a replica admitted it).
The last because a node becomes ALIVE only once a quorum admits it (the
tally's rule 3): with every replica shedding independently, a node taken
by one and refused by the others waited for their hints to coincide with
an unloaded moment, and a 1,000-node join under four busy loops took 45 s
(bench/scale.py --hogs 4). Its first admission is the cost of the join;
completing the quorum ends the others' retries.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from arbiter.server.api.limits import LimitExceeded
from membership.shared.backoff import MAX_PUSHBACK, PUSHBACK_KEY

if TYPE_CHECKING:
    from arbiter.server.consensus.driver import Driver

__all__ = ["PUSHBACK_KEY", "Shed", "check_shedding"]


class Shed(LimitExceeded):
    """A new node's stream refused while the replica is loaded (module rule).

    Attributes:
        pushback_ms: the retry hint, milliseconds.
        trailing: the trailing metadata to end the call with.
    """

    def __init__(self, message: str, pushback_ms: int) -> None:
        super().__init__(message)
        self.pushback_ms = pushback_ms
        self.trailing = ((PUSHBACK_KEY, str(pushback_ms)),)


def check_shedding(
    driver: Driver,
    node_id: str,
    now: float,
    rng: random.Random | None = None,
    cpu: float = 0.0,
) -> None:
    """Refuses the first heartbeat of an unknown node while the replica is loaded (module rule).

    Args:
        driver: the replica's driver (its load monitor, lateness, observer, view).
        node_id: the node of the stream's first heartbeat.
        now: monotonic seconds.
        rng: for the hint's jitter (default: the module's random).
        cpu: the latest time on a CPU (0 to 1) of the ingest worker that holds the
            stream, when one does (the maximum with the replica's own counts).

    Raises:
        Shed: the replica sheds; its message names the load and the hint.
    """
    cfg = driver.config
    u = max(driver.load.cpu, cpu)
    late = driver.health.backlog(now)
    load = driver.load
    if u <= cfg.shed_utilisation and late < cfg.shed_lateness:  # 1.0: never on utilisation
        load.shed_since = None  # the episode is over
        return
    if driver.observer.opinion(node_id) is not None:
        return
    if driver.state.highest_incarnation(node_id) is not None:  # a record, or committed observations
        return
    base = cfg.shed_retry_after
    if load.shed_since is None or now - load.last_shed > 2 * base:
        load.shed_since = now
    load.last_shed = now
    hint = min(MAX_PUSHBACK / 2, base * 2 ** min(16, int((now - load.shed_since) / base)))
    pushback = int(hint * 1000 * (1.0 + (rng or random).random()))
    load.shed += 1
    # the node's silence here until it may come back is ours (observer rule 5)
    driver.observer.refused(node_id, now + pushback / 1000, now)
    raise Shed(
        f"shedding: arbiter {driver.replica_id} is loaded (cpu {u:.2f}, "
        f"shed_utilisation {cfg.shed_utilisation:g}; backlog {late:.3f}s, shed_lateness "
        f"{cfg.shed_lateness:g}s) and takes no new node now; retry {node_id!r} after "
        f"{pushback} ms ({PUSHBACK_KEY})",
        pushback,
    )
