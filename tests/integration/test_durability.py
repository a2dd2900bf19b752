"""Durability on real processes: SIGKILLed replicas come back from their data dirs.

The durability rule (arbiter/server/consensus/storage.py, rule 1; docs/architecture.md,
"Correctness rules"): term, vote and log are fsynced before a message
that depends on them leaves, and the log is compacted by snapshots. Every
arbiter here snapshots every 5 applied entries, so restarts go through a
stored snapshot plus a log tail, and a replica that was down long enough
catches up by receiving the leader's snapshot.
"""

from __future__ import annotations

import re
import signal
import time
from typing import Any

import pytest

from arbiter.config import ArbiterConfig
from membership.testing.localcluster import free_ports
from tests.integration.harness import (
    Proc,
    ProcCluster,
    alive_set,
    changes,
    run_cli,
    wait_until,
)

pytestmark = pytest.mark.integration

IDS = ("a1", "a2", "a3")
EXTRA = ("--snapshot-every", "5")
LEASE = ArbiterConfig.lan().lease
FATAL = ("Traceback", "CRITICAL", "driver turn failed", "AssertionError")


def _restart(cluster: ProcCluster, rid: str) -> Proc:
    """Starts a killed arbiter again with the same id, address and data dir.

    Its first life's output is kept beside, as ``<rid>.life<n>.out/err``.
    """
    old = cluster.procs[rid]
    assert not old.alive()
    life = 1 + sum(1 for _ in cluster.workdir.glob(f"{rid}.life*.err"))
    for f in (old.out, old.err):
        f.rename(f.with_name(f"{rid}.life{life}{f.suffix}"))
    peers = ",".join(f"{k}={v}" for k, v in cluster.arbiters.items())
    return cluster.spawn(
        rid,
        "arbiter",
        *("--id", rid, "--listen", cluster.arbiters[rid], "--peers", peers),
        *("--data-dir", str(cluster.workdir / f"{rid}.data"), *EXTRA),
    )


def _views(cluster: ProcCluster, ids: tuple[str, ...] = IDS) -> dict[str, dict[str, Any]] | None:
    """``view --json`` of each replica in ``ids``, or None if one does not answer."""
    out = {}
    for a in ids:
        v = cluster.view(a)
        if v is None:
            return None
        out[a] = v
    return out


def _members(view: dict[str, Any]) -> list[tuple[str, int, str, tuple[tuple[str, str], ...]]]:
    return sorted(
        (m["node_id"], m["incarnation"], m["state"], tuple(sorted(m["labels"].items())))
        for m in view["members"]
    )


def _agreed(views: dict[str, dict[str, Any]] | None, epoch: int) -> dict[str, Any] | None:
    """The common view if every replica has the same epoch (>= ``epoch``) and members."""
    if views is None:
        return None
    first = next(iter(views.values()))
    if first["epoch"] < epoch or any(
        v["epoch"] != first["epoch"] or _members(v) != _members(first) for v in views.values()
    ):
        return None
    return first


def _check_stream(w: Proc) -> list[dict[str, Any]]:
    """A watcher's output has no duplicate change and no gap; returns its change lines."""
    last: int | None = None
    seen: set[tuple[int, str, int, str]] = set()
    out = []
    for ev in w.json_lines():
        if ev["type"] == "snapshot":
            assert last is None or ev["epoch"] >= last, f"snapshot went back to {ev}"
            last = ev["epoch"]
        elif ev["type"] == "change":
            key = (ev["epoch"], ev["node_id"], ev["incarnation"], ev["state"])
            assert key not in seen, f"duplicate change {ev}"
            seen.add(key)
            assert last is None or ev["epoch"] in (last, last + 1), f"gap before {ev} (at {last})"
            last = ev["epoch"]
            out.append(ev)
    return out


def _recovered_ms(proc: Proc) -> float:
    m = re.search(r"recovered raft state in (\d+) ms", proc.stderr())
    assert m, proc.stderr()[-2000:]
    return float(m.group(1))


def test_durability_all_replicas_sigkilled_come_back_with_the_same_view(
    cluster: ProcCluster,
) -> None:
    cluster.start_arbiters(3, *EXTRA)
    wait_until(cluster.leader, 20, "a leader")
    for n in ("n1", "n2"):
        cluster.start_node(n, "--label", f"rack=r{n[-1]}")
    w = cluster.start_watch("w", first="a1")
    wait_until(lambda: alive_set(w) == {"n1", "n2"}, 20, "n1 and n2 ALIVE")
    cluster.procs["n2"].kill()
    wait_until(lambda: any(c["state"] == "DEAD" for c in changes(w, "n2")), 10, "n2 DEAD")
    dead_epoch = changes(w, "n2")[-1]["epoch"]
    before = wait_until(
        lambda: _agreed(_views(cluster), dead_epoch), 10, "every replica at the death's epoch"
    )
    n1 = cluster.procs["n1"]
    seen = len(n1.lines())

    for rid in IDS:
        cluster.procs[rid].kill()
    t0 = time.monotonic()
    for rid in IDS:
        _restart(cluster, rid)
    epochs: list[int] = []

    def back() -> dict[str, Any] | None:
        views = _views(cluster)
        if views is not None:
            epochs.extend(v["epoch"] for v in views.values())
            if all(v["in_quorum"] for v in views.values()):
                return _agreed(views, 0)
        return None

    after = wait_until(back, 20, "the restarted replicas to agree with a quorum")
    outage = time.monotonic() - t0
    # Recovered from disk: the same epoch and members, and no epoch ever went back.
    assert after["epoch"] == before["epoch"]
    assert _members(after) == _members(before)
    assert min(epochs) >= before["epoch"], epochs
    for rid in IDS:
        assert _recovered_ms(cluster.procs[rid]) < 5000

    # n1 kept running through the outage: once a quorum of restarted replicas
    # grants it leases again it is unfenced, and it was never declared dead.
    if outage > LEASE:
        wait_until(
            lambda: "unfenced" in "\n".join(n1.lines()[seen:]), 15, "n1 unfenced after restart"
        )
    still = _agreed(_views(cluster), 0)
    assert still is not None and still["epoch"] == before["epoch"], still
    assert _members(still) == _members(before)  # n1 ALIVE at the same incarnation

    # The watcher reconnected on its own and resumes after the restart without a gap.
    cluster.start_node("n3")
    wait_until(lambda: "n3" in alive_set(w), 20, "the watcher sees n3 join")
    stream = _check_stream(w)
    assert [c["epoch"] for c in stream if c["node_id"] == "n3"] == [before["epoch"] + 1]
    assert [c for c in changes(w, "n2") if c["state"] == "DEAD"] == [changes(w, "n2")[-1]]
    for rid in IDS:
        err = cluster.procs[rid].stderr()
        assert not any(word in err for word in FATAL), err[-3000:]


def test_durability_replica_restarted_alone_catches_up_by_snapshot(cluster: ProcCluster) -> None:
    cluster.start_arbiters(3, *EXTRA)
    leader = wait_until(cluster.leader, 20, "a leader")
    victim = next(r for r in IDS if r != leader)
    others = tuple(r for r in IDS if r != victim)
    cluster.start_node("n1")
    wait_until(lambda: _agreed(_views(cluster), 1), 20, "n1 ALIVE everywhere")
    cluster.procs[victim].kill()

    # While the victim is down the others commit well over 5 entries, one node
    # at a time (each join is at least one observation batch per replica),
    # and compact their logs past everything the victim holds.
    for i, n in enumerate(("n2", "n3", "n4", "n5", "n6"), start=2):
        cluster.start_node(n)
        wait_until(
            lambda i=i: (v := cluster.view(leader)) and len(v["members"]) == i,
            20,
            f"{n} ALIVE on the survivors",
        )
    cluster.procs["n2"].kill()
    target = wait_until(
        lambda: (
            (v := _agreed(_views(cluster, others), 0))
            and any(m[0] == "n2" and m[2] == "DEAD" for m in _members(v))
            and v
        ),
        15,
        "n2 DEAD on the survivors",
    )

    proc = _restart(cluster, victim)
    caught_up = wait_until(
        lambda: _agreed(_views(cluster), target["epoch"]), 20, f"{victim} to catch up"
    )
    assert _members(caught_up) == _members(target)
    err = proc.stderr()
    assert "recovered raft state" in err
    assert re.search(r"state machine restored from the leader's snapshot at index \d+", err), err
    for rid in IDS:
        text = cluster.procs[rid].stderr()
        assert not any(word in text for word in FATAL), f"{rid}: {text[-3000:]}"
    # It takes part again: a new node needs its observations no more than anyone's,
    # but the view it serves keeps up.
    cluster.start_node("n7")
    wait_until(
        lambda: (v := cluster.view(victim)) and any(m["node_id"] == "n7" for m in v["members"]),
        20,
        f"{victim} to see n7 join",
    )


def test_durability_data_dir_in_use_or_unusable_is_a_one_line_error(cluster: ProcCluster) -> None:
    cluster.start_arbiters(1)
    wait_until(cluster.leader, 20, "the single replica to lead")
    [port] = free_ports(1)
    base = ("arbiter", "--id", "a1", "--listen", f"127.0.0.1:{port}")
    peers = ("--peers", f"a1=127.0.0.1:{port}")
    r = run_cli(*base, *peers, "--data-dir", str(cluster.workdir / "a1.data"))
    assert r.returncode == 1
    [line] = r.stderr.strip().splitlines()
    pid = cluster.procs["a1"].popen.pid
    assert f"is in use by another arbiter (pid {pid})" in line, line
    (cluster.workdir / "file").write_text("")
    r = run_cli(*base, *peers, "--data-dir", str(cluster.workdir / "file" / "sub"))
    assert r.returncode == 1
    [line] = r.stderr.strip().splitlines()
    assert "file/sub is not usable" in line, line
    # The running replica was not disturbed.
    assert cluster.procs["a1"].alive() and cluster.leader() == "a1"


def test_durability_all_replicas_stopped_gracefully_declare_nobody_dead(
    cluster: ProcCluster,
) -> None:
    # SIGTERM to every replica at once (a planned shutdown): nodes lose every
    # heartbeat stream, but the replicas stop their detectors first, so no
    # quorum can commit a death on the way out (found by a user trial: every
    # node was DEAD after a graceful stop, not after a SIGKILL).
    cluster.start_arbiters(3, *EXTRA)
    wait_until(cluster.leader, 20, "a leader")
    for n in ("n1", "n2"):
        cluster.start_node(n)
    w = cluster.start_watch("w", first="a1")
    wait_until(lambda: alive_set(w) == {"n1", "n2"}, 20, "n1 and n2 ALIVE")
    before = wait_until(lambda: _agreed(_views(cluster), 0), 10, "agreed views")
    for rid in IDS:
        cluster.procs[rid].signal(signal.SIGTERM)
    for rid in IDS:
        wait_until(lambda rid=rid: not cluster.procs[rid].alive(), 15, f"{rid} to exit")
        assert "stopped" in cluster.procs[rid].stderr()
    for rid in IDS:
        _restart(cluster, rid)
    after = wait_until(lambda: _agreed(_views(cluster), 0), 20, "the restarted replicas to agree")
    assert after["epoch"] == before["epoch"], "a view change was committed during the stop"
    assert _members(after) == _members(before)
    assert not any(c["state"] == "DEAD" for c in changes(w))


def test_durability_replica_whose_data_dir_was_lost_stops_with_one_error(
    cluster: ProcCluster,
) -> None:
    # A replica restarted on an empty data dir while the others kept its old
    # log: the leader's first message contradicts its (empty) state. It must
    # not take part (its votes are forgotten) nor serve an empty view as
    # current: it says why, once, and exits 1. The others go on deciding.
    cluster.start_arbiters(3, *EXTRA)
    leader = wait_until(cluster.leader, 20, "a leader")
    victim = next(r for r in IDS if r != leader)
    cluster.start_node("n1")
    wait_until(lambda: _agreed(_views(cluster), 1), 20, "n1 ALIVE everywhere")
    cluster.procs[victim].signal(signal.SIGTERM)
    cluster.procs[victim].popen.wait(15)
    data = cluster.workdir / f"{victim}.data"
    data.rename(data.with_name(f"{victim}.data.lost"))

    proc = _restart(cluster, victim)
    assert proc.popen.wait(20) == 1, proc.stderr()[-3000:]
    err = proc.stderr()
    assert "data dir was lost or replaced" in err, err[-3000:]
    assert err.count("CRITICAL") == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    # The two others still decide: n1 killed is DEAD on them.
    others = tuple(r for r in IDS if r != victim)
    cluster.procs["n1"].kill()
    wait_until(
        lambda: (
            (v := _agreed(_views(cluster, others), 0))
            and any(m[0] == "n1" and m[2] == "DEAD" for m in _members(v))
        ),
        15,
        "n1 DEAD on the two others",
    )
