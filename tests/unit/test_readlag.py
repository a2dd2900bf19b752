"""A replica behind suspects nobody for it: the read lag (arbiter/server/load/readlag.py:
queueing delay from send times, no clock sync) and the late ack of slow start
(Replica.acked)."""

from __future__ import annotations

import math
import random

import pytest

from arbiter.core.commands import Observation, Opinion
from arbiter.core.detection import MissedHeartbeatDetector
from arbiter.core.raft import RaftConfig
from arbiter.core.replica import Replica, ReplicaSettings
from arbiter.server.load.monitor import LocalHealth
from arbiter.server.load.readlag import (
    ACCEPT_STALE,
    BASE_BUCKET,
    HostBases,
    ReadLag,
    StreamBase,
    host_of,
)
from tests.unit.test_batching import Log


def test_readlag_queueing_delay_cancels_the_clock_offset() -> None:
    base = StreamBase()
    offset = -37.25  # the node's clock runs 37.25 s ahead: every delay is negative
    assert base.queued(offset + 0.002, 0.0) == 0.0  # the first is the base
    assert base.queued(offset + 0.001, 0.1) == 0.0  # a faster one lowers it
    assert base.queued(offset + 0.801, 0.2) == pytest.approx(0.8)  # read 0.8 s late


def test_readlag_a_clock_stepped_back_is_forgotten_after_two_buckets() -> None:
    base = StreamBase()
    base.queued(0.001, 0.0)
    # The node's clock steps 5 s back: its heartbeats look 5 s late until the
    # bucket holding the old base is gone (RFC 6817's base delay history).
    assert base.queued(5.001, 1.0) == pytest.approx(5.0)
    assert base.queued(5.001, BASE_BUCKET + 1.0) == pytest.approx(5.0)
    assert base.queued(5.001, 2 * BASE_BUCKET + 1.0) == 0.0


def test_readlag_is_the_median_so_one_slow_stream_does_not_make_the_replica_late() -> None:
    lag = ReadLag(window=8, stale=1.0)
    assert lag.lateness(0.0) == 0.0  # nothing read yet
    for i in range(8):
        lag.add(3.0 if i % 4 == 0 else 0.01, 10.0)  # two of eight streams slow
    assert lag.lateness(10.0) == pytest.approx(0.01)
    for _ in range(8):
        lag.add(1.5, 10.5)  # everyone read 1.5 s late: the replica is behind
    assert lag.lateness(10.5) == pytest.approx(1.5)
    assert lag.lateness(11.6) == 0.0  # nothing read for `stale` s: the loop lag's to see


@pytest.mark.parametrize(("window", "stale"), [(0, 1.0), (8, 0.0), (8, math.nan)])
def test_readlag_refuses_a_bad_window_or_stale(window: int, stale: float) -> None:
    with pytest.raises(ValueError, match="window > 0 and stale > 0"):
        ReadLag(window=window, stale=stale)


class _Lag:
    latest_late = (0.0, -math.inf)

    def recent_lag(self, now: float, at: float) -> float:
        return 0.0

    def mean_lateness(self, now: float) -> float:
        return 0.0


def test_readlag_counts_as_lateness_not_as_a_backlog_to_shed_on() -> None:
    h = LocalHealth(_Lag(), listen_after=0.15)  # type: ignore[arg-type]
    h.add_source(lambda now: 1.2, backlog=False)
    assert h.lateness(5.0) == pytest.approx(1.2)
    assert h.backlog(5.0) == 0.0


def test_readlag_a_stream_born_behind_starts_from_the_replicas_lag() -> None:
    # Rule 1a: in a storm every stream's first heartbeat already waited; its
    # base starts at that delay minus the lag the older streams show.
    lag = ReadLag(window=4, stale=1.0)
    old = StreamBase()
    old.queued(0.001, 0.0, lag)  # born on time: lag 0
    for _ in range(4):
        lag.add(old.queued(2.001, 1.0, lag), 1.0)  # now read 2 s late
    assert lag.lateness(1.0) == pytest.approx(2.0)
    born = StreamBase()
    offset = 40.0  # its clock is 40 s behind: delays read 40 s more
    assert born.queued(offset + 2.001, 1.0, lag) == pytest.approx(2.0)
    assert born.queued(offset + 2.501, 1.2, lag) == pytest.approx(2.5)
    assert born.queued(offset + 0.001, 2.0, lag) == 0.0  # caught up: its true base
    assert born.queued(offset + 0.101, 2.1, lag) == pytest.approx(0.1)


def test_readlag_a_storm_of_new_streams_reads_its_lag_from_the_hosts_base() -> None:
    # Rule 1b. A storm whose streams are all born late: without the host's base
    # each takes its first, late heartbeat for its base (rule 1a reads the lag
    # of streams that are themselves born late) and the replica reads no lag
    # while it accepts streams 2 s late; with it, the lag is there.
    for with_host in (False, True):
        lag, hosts = ReadLag(window=8, stale=1.0), HostBases()
        first = StreamBase()  # the host's first stream, born on time
        host = hosts.of("ipv4:10.0.0.7:40000", 0.0) if with_host else None
        lag.add(first.queued(0.001, 0.0, lag, host), 0.0)
        for i in range(8):  # the storm: accepted 2 s after its nodes opened them
            born = StreamBase()
            peer_host = hosts.of(f"ipv4:10.0.0.7:{40001 + i}", 1.0) if with_host else None
            lag.add(born.queued(2.001, 2.0 + i * 0.01, lag, peer_host), 2.0 + i * 0.01)
        assert lag.lateness(2.1) == (pytest.approx(2.0) if with_host else 0.0)


def test_readlag_new_streams_waiting_to_be_accepted_are_lag_while_old_ones_read_on_time() -> None:
    # Rule 2a, the traced case: the old streams are read on time (rule 2's median
    # stays 0) while each new stream's first heartbeat waited longer than the
    # last: the replica is late in accepting streams, and says so.
    lag, hosts = ReadLag(window=64, stale=1.0), HostBases()
    old = [StreamBase() for _ in range(20)]
    for b in old:
        lag.add(b.queued(0.001, 0.0, lag, hosts.of("ipv4:10.0.0.7:1", 0.0)), 0.0)
    t = 0.0
    for i, waited in enumerate((0.6, 1.3, 2.1)):
        t += 0.5
        for b in old:  # the old streams: on time
            lag.add(b.queued(0.001, t, lag, hosts.of("ipv4:10.0.0.7:1", t)), t)
        born = StreamBase()
        q = born.queued(0.001 + waited, t, lag, hosts.of(f"ipv4:10.0.0.7:{100 + i}", t))
        lag.add(q, t)
        assert q == pytest.approx(waited)
    assert lag.median(t) == 0.0  # rule 2 alone: on time
    assert lag.accept_lag(t) == pytest.approx(1.3)  # the median of 0.6, 1.3, 2.1
    assert lag.lateness(t) == pytest.approx(1.3)
    # no stream accepted for ACCEPT_STALE seconds: no accept lag
    assert lag.accept_lag(t + ACCEPT_STALE + 0.01) == 0.0


def test_readlag_the_accept_lag_does_not_feed_itself_through_new_streams_bases() -> None:
    # Rule 2a counts only first heartbeats measured against their host's base, and
    # rule 1a reads rule 2's median: a first heartbeat based by rule 1a on a lag
    # that includes the accept lag would echo it, and a churn of new streams,
    # however promptly read, would keep the replica "late" for as long as it lasts.
    lag, hosts = ReadLag(window=4, stale=1.0), HostBases()
    old = StreamBase()
    lag.add(old.queued(0.001, 0.0, lag, hosts.of("ipv4:10.0.0.7:1", 0.0)), 0.0)
    late = StreamBase()
    lag.add(late.queued(2.001, 0.1, lag, hosts.of("ipv4:10.0.0.7:2", 0.1)), 0.1)
    assert lag.accept_lag(0.1) == pytest.approx(2.0)
    for i in range(40):  # prompt new streams from hosts seen once each, 10 a second
        t = 0.2 + i * 0.1
        lag.add(old.queued(0.001, t, lag, hosts.of("ipv4:10.0.0.7:1", t)), t)  # on time
        born = StreamBase()
        lag.add(born.queued(5.0, t, lag, hosts.of(f"ipv4:10.0.1.{i}:1", t)), t)
        assert lag.accept_lag(t) == (pytest.approx(2.0) if t - ACCEPT_STALE <= 0.1 else 0.0)
    assert lag.lateness(4.1) == 0.0  # the churn goes on, and nobody is late


def test_readlag_the_hosts_base_only_lowers_a_new_streams_base() -> None:
    hosts = HostBases()
    host = hosts.of("ipv6:[::1]:5000", 0.0)
    assert host is not None and host.floor(0.0) == math.inf  # nothing seen yet
    StreamBase().queued(5.0, 0.0, None, host)  # a stream whose first read waited 5 s
    born = StreamBase()
    # a faster first heartbeat than anything the host showed is its own base
    assert born.queued(1.0, 0.1, None, hosts.of("ipv6:[::1]:5001", 0.1)) == 0.0
    assert host.floor(0.1) == 1.0  # and it lowered the host's
    # the host's base is forgotten with its buckets: a stream born much later
    # is its own base again
    late = 2 * BASE_BUCKET + 1
    later = hosts.of("ipv6:[::1]:5002", late)
    assert later is not None and later.floor(late) == math.inf
    assert StreamBase().queued(7.0, late, None, later) == 0.0


def test_readlag_hosts_are_keyed_without_the_port_and_forgotten_when_gone() -> None:
    assert host_of("ipv4:10.0.0.7:40000") == "ipv4:10.0.0.7"
    assert host_of("ipv6:[2001:db8::1]:443") == "ipv6:[2001:db8::1]"
    assert host_of("unix:/run/membership.sock") == "unix:/run/membership.sock"
    assert host_of("") is None and host_of(None) is None
    hosts = HostBases()
    a = hosts.of("ipv4:10.0.0.7:1", 0.0)
    assert a is hosts.of("ipv4:10.0.0.7:2", 0.0)  # one host, one base
    assert a is not hosts.of("ipv4:10.0.0.8:1", 0.0)
    assert a is not None
    a.see(0.001, 0.0)
    assert len(hosts) == 2
    hosts.of("ipv4:10.0.0.9:1", 3 * BASE_BUCKET)  # a prune: both are long gone
    assert len(hosts) == 1


def _replica() -> Replica:
    return Replica(
        replica_id="a1",
        replica_ids=["a1", "a2", "a3"],
        raft_config=RaftConfig(),
        settings=ReplicaSettings(
            lease=0.5, observation_retry=0.2, restart_grace=0.0, heartbeat_interval=0.1
        ),
        detector=MissedHeartbeatDetector(interval=0.1, missed_limit=5),
        rng=random.Random(1),
        now=0.0,
        seq_base=1,
    )


def test_readlag_a_late_replica_woken_at_its_deadline_finds_it_passed() -> None:
    # deadline + lateness may round so that a tick then, at now - lateness, falls
    # just short of the deadline: the driver would wake, find nothing and be told
    # the same time again, forever (found by the simulator's slow-accept runs).
    late = 0.5012408275796174
    heard = 15.2  # D 0.5: deadlines just below 16, their sums with late just above
    for _ in range(1000):  # a heartbeat time whose deadline rounds that way
        rep = _replica()
        rep.heartbeat("n1", 1, {}, heard)
        d = rep.observer.detector.next_deadline()
        assert d is not None
        if (d + late) - late < d:
            break
        heard += 1e-6
    else:
        pytest.fail("no such deadline found")
    assert late <= rep.settings.max_lateness
    now, same = heard, 0
    while rep.observer.suspects() != ["n1"]:  # the driver's loop: tick at each deadline
        due = max(now, rep.next_deadline(late))
        same = same + 1 if due == now else 0
        assert same < 10, f"woken at {due} again and again, n1 not suspected"
        now = due
        rep.tick(now, late)
    assert now - late >= d


@pytest.mark.parametrize("ack_late", [False, True])
def test_readlag_slow_start_silence_counts_from_the_ack_that_kept_the_node_waiting(
    ack_late: bool,
) -> None:
    # Replica.acked: a node granted no lease here (its join not committed: slow
    # start) sends again only once the ack of its last heartbeat reaches it. D =
    # 0.5 s. Heard at 1.0, its ack handed to gRPC only at 1.8 (the replica was
    # behind): silent until 2.3 at most through no fault of its own.
    rep = _replica()
    verdict = rep.heartbeat("n1", 1, {}, 1.0)
    assert verdict.accepted and verdict.lease == 0.0  # slow start
    if ack_late:
        rep.acked("n1", 1, 1.8, None)
    rep.tick(2.0)
    assert rep.observer.suspects() == ([] if ack_late else ["n1"])
    rep.tick(2.31)
    assert rep.observer.suspects() == ["n1"]  # then a silence is a silence
    rep.acked("n1", 1, 2.4, None)  # suspected already: nothing to hold
    assert rep.observer.suspects() == ["n1"]


def test_readlag_an_ack_suggesting_a_longer_interval_moves_the_suspicion_with_it() -> None:
    # The node heartbeats every 0.05 s (D = 0.25 s); the replica's ack suggests
    # its configured 0.1 s: the node may now wait 0.1 s, so D at that pace (0.5 s)
    # from the ack, not 0.25 s from the heartbeat.
    rep = _replica()
    assert rep.suggested_interval() == pytest.approx(0.1)
    assert rep.heartbeat("n1", 1, {}, 1.0, interval=0.05).accepted
    rep.tick(1.3)
    assert rep.observer.suspects() == []
    rep.tick(1.51)
    assert rep.observer.suspects() == ["n1"]


def test_readlag_a_member_known_only_from_the_log_gets_the_lease_of_the_suggested_pace() -> None:
    # Observer rule 5: a1 learns from the others' commits that n1 is ALIVE before
    # it reads n1's first heartbeat (a join storm's backlog). The replica keeps
    # unheard_hold at the lease of the interval it suggests; n1 is not suspected
    # before that, and then is (it may be dead: a2 and a3 decide with a1).
    log = Log()
    for r in ("a2", "a3"):
        log.commit(r, (Observation(node_id="n1", incarnation=1, opinion=Opinion.ALIVE, seq=1),))
    rep = _replica()
    assert rep.settings.lease_for(rep.suggested_interval()) == pytest.approx(0.5)
    rep.observer.unheard_hold = 2.0  # as if it suggested a pace four times slower
    rep.observer.tick(10.0, log.state)  # syncs the view: n1 tracked, unheard
    rep.observer.tick(11.5, log.state)
    assert rep.observer.suspects() == []  # D = 0.5 s at the configured pace
    rep.observer.tick(12.01, log.state)
    assert rep.observer.suspects() == ["n1"]
    rep.tick(12.02)
    assert rep.observer.unheard_hold == pytest.approx(0.5)  # the replica's own suggestion


@pytest.mark.parametrize("shed_here", [False, True])
def test_readlag_a_node_this_replica_shed_is_not_suspected_before_its_retry_hint(
    shed_here: bool,
) -> None:
    # Observer rule 5, refusals: a1 shed n1's stream at 10.0 with a 4 s retry
    # hint; a2 and a3 admitted it, and a1 learns from the log at 10.5 that n1
    # is ALIVE. n1 may not come back before 14.0: a1 holds it until then plus
    # unheard_hold (2 s), not 2 s from the view (bench/scale.py --hogs 4: two
    # replicas did this to one node, and it was DEAD though it never stopped).
    log = Log()
    for r in ("a2", "a3"):
        log.commit(r, (Observation(node_id="n1", incarnation=1, opinion=Opinion.ALIVE, seq=1),))
    rep = _replica()
    rep.observer.unheard_hold = 2.0
    if shed_here:
        rep.observer.refused("n1", 14.0, 10.0)
    rep.observer.tick(10.5, log.state)  # syncs the view: n1 tracked, unheard
    rep.observer.tick(12.6, log.state)
    assert rep.observer.suspects() == ([] if shed_here else ["n1"])
    rep.observer.tick(15.9, log.state)
    assert rep.observer.suspects() == ([] if shed_here else ["n1"])
    rep.observer.tick(16.01, log.state)  # never came back: a silence is a silence
    assert rep.observer.suspects() == ["n1"]


def test_readlag_refusals_are_bounded_and_a_stale_one_holds_nothing() -> None:
    # The map of refusals forgets the stale ones once it grows past 4,096 nodes,
    # and a refusal whose hint ran out long ago adds no hold.
    log = Log()
    log.commit("a2", (Observation(node_id="n1", incarnation=1, opinion=Opinion.ALIVE, seq=1),))
    log.commit("a3", (Observation(node_id="n1", incarnation=1, opinion=Opinion.ALIVE, seq=1),))
    rep = _replica()
    rep.observer.unheard_hold = 2.0
    rep.observer.refused("n1", 1.0, 0.0)  # told to wait 1 s, at 0.0
    for i in range(5000):
        rep.observer.refused(f"x{i}", 100.0 + i * 1e-3, 99.0 + i * 1e-3)
    assert len(rep.observer._refused) <= 4097
    rep.observer.tick(100.0, log.state)
    rep.observer.tick(102.01, log.state)
    assert rep.observer.suspects() == ["n1"]
