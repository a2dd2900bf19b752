"""The main job end to end: real arbiter, node and watcher processes over real gRPC on loopback."""

from __future__ import annotations

import signal
import time
from functools import partial

import pytest

from tests.integration.harness import ProcCluster, alive_set, changes, wait_until

pytestmark = pytest.mark.integration

NODES = ("n1", "n2", "n3")


def _start(cluster: ProcCluster, nodes: tuple[str, ...] = NODES) -> None:
    cluster.start_arbiters(3)
    wait_until(cluster.leader, 20, "a leader among the replicas")
    for n in nodes:
        cluster.start_node(n, "--label", f"rack=r{n[-1]}")


def test_cluster_sigkill_node_is_dead_once_at_same_epoch_on_every_subscriber(
    cluster: ProcCluster,
) -> None:
    _start(cluster)
    w1 = cluster.start_watch("w1", first="a1")
    w2 = cluster.start_watch("w2", first="a3")
    for w in (w1, w2):
        wait_until(lambda w=w: alive_set(w) == set(NODES), 20, f"{w.name} to see every node ALIVE")
    served = {w.name: {ev["arbiter"] for ev in w.json_lines()} for w in (w1, w2)}
    assert served["w1"] != served["w2"], f"watchers should be on different replicas: {served}"

    t0 = time.monotonic()
    cluster.procs["n2"].kill()
    for w in (w1, w2):
        wait_until(
            lambda w=w: any(c["state"] == "DEAD" for c in changes(w, "n2")),
            5,
            f"{w.name} to print DEAD for n2",
        )
    elapsed = time.monotonic() - t0
    assert elapsed < 5.0

    # Let any duplicate arrive before counting: both replicas must report the
    # same committed epoch beyond the death.
    epoch = changes(w1, "n2")[-1]["epoch"]
    wait_until(
        lambda: all((cluster.view(a) or {}).get("epoch", 0) >= epoch for a in ("a1", "a2", "a3")),
        5,
        "every replica to apply the death",
    )
    dead1 = [c for c in changes(w1, "n2") if c["state"] == "DEAD"]
    dead2 = [c for c in changes(w2, "n2") if c["state"] == "DEAD"]
    assert len(dead1) == 1 and len(dead2) == 1, (dead1, dead2)
    assert dead1[0]["epoch"] == dead2[0]["epoch"]
    for w in (w1, w2):
        others = [c for c in changes(w) if c["node_id"] != "n2"]
        assert all(c["state"] == "ALIVE" for c in others), others
        assert alive_set(w) == {"n1", "n3"}
    view = cluster.view("a2")
    assert view is not None
    states = {m["node_id"]: m["state"] for m in view["members"]}
    assert states == {"n1": "ALIVE", "n2": "DEAD", "n3": "ALIVE"}


def test_cluster_after_leader_killed_two_replicas_still_decide(cluster: ProcCluster) -> None:
    _start(cluster)
    w = cluster.start_watch("w", first="a1")
    wait_until(lambda: alive_set(w) == set(NODES), 20, "every node ALIVE")
    leader = wait_until(cluster.leader, 10, "a leader")
    cluster.procs[leader].kill()

    cluster.procs["n1"].kill()
    wait_until(
        lambda: any(c["state"] == "DEAD" for c in changes(w, "n1")),
        15,
        "n1 declared DEAD by the two remaining replicas",
    )
    cluster.start_node("n4")
    wait_until(lambda: "n4" in alive_set(w), 15, "n4 ALIVE")
    assert alive_set(w) == {"n2", "n3", "n4"}
    new_leader = wait_until(cluster.leader, 10, "a new leader")
    assert new_leader != leader


def test_cluster_single_replica_left_decides_nothing(cluster: ProcCluster) -> None:
    _start(cluster)
    wait_until(
        lambda: (v := cluster.view("a3")) and sum(m["state"] == "ALIVE" for m in v["members"]) == 3,
        20,
        "every node ALIVE on a3",
    )
    before = cluster.view("a3")
    assert before is not None
    cluster.procs["a1"].kill()
    cluster.procs["a2"].kill()
    wait_until(
        lambda: (v := cluster.view("a3")) and v["in_quorum"] is False,
        10,
        "a3 to report in_quorum false",
    )
    cluster.procs["n1"].kill()
    # a3's own detector suspects n1 (proof that detection time has passed),
    # yet with no quorum nothing is committed.
    wait_until(
        lambda: (v := cluster.view("a3")) and "n1" in v["local_suspects"],
        10,
        "a3 to suspect n1 locally",
    )
    after = cluster.view("a3")
    assert after is not None
    assert after["in_quorum"] is False
    assert after["epoch"] == before["epoch"]
    states = {m["node_id"]: m["state"] for m in after["members"]}
    assert states["n1"] == "ALIVE"


# SIGHUP too: an operator who signals every membership process as replicas are
# signalled to reload their certificates must not get nodes declared DEAD.
# Both go through the node's one handler (membership/cli/commands.py, _SIGNALS): one
# cluster, a node per signal (once a cluster per signal), each checked alone.
SIGNALLED = {"n3": signal.SIGTERM, "n2": signal.SIGHUP}


def test_cluster_sigterm_node_leaves_never_dead(cluster: ProcCluster) -> None:
    _start(cluster)
    w = cluster.start_watch("w", first="a2")
    wait_until(lambda: alive_set(w) == set(NODES), 20, "every node ALIVE")
    for nid, sig in SIGNALLED.items():
        cluster.procs[nid].signal(sig)
    for nid, sig in SIGNALLED.items():
        node = cluster.procs[nid]
        left = partial(lambda n: any(c["state"] == "LEFT" for c in changes(w, n)), nid)
        wait_until(left, 10, f"{nid} LEFT ({sig.name})")
        assert node.popen.wait(10) == 0, node.stderr()
        out = "\n".join(node.lines())
        assert "LEFT at epoch" in out, (sig.name, out)
    # LEFT is final for that incarnation: the silence that follows cannot turn it DEAD.
    view = cluster.view()
    assert view is not None
    states = {m["node_id"]: m["state"] for m in view["members"]}
    for nid, sig in SIGNALLED.items():
        assert states[nid] == "LEFT", (sig.name, states)
        assert not any(c["state"] == "DEAD" for c in changes(w, nid)), sig.name


def test_cluster_same_node_id_twice_newer_takes_over_older_steps_aside(
    cluster: ProcCluster,
) -> None:
    _start(cluster, nodes=("n1",))
    w = cluster.start_watch("w", first="a1")
    wait_until(lambda: alive_set(w) == {"n1"}, 20, "n1 ALIVE")
    old = cluster.procs["n1"]
    new = cluster.spawn("n1-again", "node", "--id", "n1", "--arbiters", cluster.arbiter_list())
    # The old process learns a newer incarnation holds its id and stops, with a
    # one-line error and exit code 3 (ended by the cluster); the two never flap.
    assert old.popen.wait(15) == 3
    assert "taken over" in old.stderr() and "Traceback" not in old.stderr()
    # its stdout says the takeover, not "is DEAD" before it (a fresh user's trial)
    said = old.lines()
    assert any("taken over by" in line for line in said), said
    assert not any(line.endswith("is DEAD") for line in said), said
    wait_until(lambda: any("is ALIVE" in line for line in new.lines()), 10, "new n1 ALIVE")
    n1 = changes(w, "n1")
    incarnations = sorted({c["incarnation"] for c in n1})
    assert len(incarnations) == 2, n1
    # The old incarnation is retired (DEAD) no later than the epoch the new one joins.
    retired = [c for c in n1 if c["incarnation"] == incarnations[0] and c["state"] == "DEAD"]
    joined = [c for c in n1 if c["incarnation"] == incarnations[1] and c["state"] == "ALIVE"]
    assert len(retired) == 1 and len(joined) == 1
    assert retired[0]["epoch"] <= joined[0]["epoch"]
    assert new.alive()


def test_cluster_replicas_with_different_peer_lists_refuse_each_other_loudly(
    cluster: ProcCluster,
) -> None:
    from membership.testing.localcluster import free_ports

    ports = free_ports(3)
    addrs = {f"a{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(ports)}
    full = ",".join(f"{k}={v}" for k, v in addrs.items())
    cluster.arbiters = addrs
    a1 = cluster.spawn(
        "a1",
        *("arbiter", "--id", "a1", "--listen", addrs["a1"], "--peers", f"a1={addrs['a1']}"),
        *("--data-dir", str(cluster.data_dir("a1"))),
    )
    others = [
        cluster.spawn(
            r,
            *("arbiter", "--id", r, "--listen", addrs[r], "--peers", full),
            *("--data-dir", str(cluster.data_dir(r))),
        )
        for r in ("a2", "a3")
    ]
    wait_until(
        lambda: "every replica must be given the same" in a1.stderr(),
        15,
        "a1 to refuse traffic from a replica with another --peers list",
    )
    assert "ERROR" in a1.stderr()
    wait_until(
        lambda: any("refuses our raft traffic" in p.stderr() for p in others),
        15,
        "a2 or a3 to log that a1 refuses them",
    )
    assert "a group of 1 replica(s) survives no replica failure" in a1.stderr()


def test_cluster_phi_detector_declares_a_killed_node_dead_and_nobody_else(
    cluster: ProcCluster,
) -> None:
    cluster.start_arbiters(3, "--detector", "phi")
    wait_until(cluster.leader, 20, "a leader")
    for n in NODES:
        cluster.start_node(n)
    w = cluster.start_watch("w", first="a2")
    wait_until(lambda: alive_set(w) == set(NODES), 20, "every node ALIVE")
    cluster.procs["n3"].kill()
    wait_until(lambda: any(c["state"] == "DEAD" for c in changes(w, "n3")), 10, "n3 DEAD")
    assert alive_set(w) == {"n1", "n2"}
    assert all(c["state"] == "ALIVE" for c in changes(w) if c["node_id"] != "n3")
