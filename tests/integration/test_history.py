"""Bounded history on real processes: a DEAD record is forgotten after the retention
on every replica at the same epoch, and its incarnation stays refused (README,
"Bounded history"; tally rule 12)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.integration.harness import ProcCluster, alive_set, changes, run_cli, wait_until

pytestmark = pytest.mark.integration

# Seconds from n1's DEAD to its forgetting: the tombstone must be seen first, by
# two `view` calls made in the harness's long-lived CLI process (a tenth of a
# second each, a second on a loaded machine; when they were `membership`
# processes, ~1 s each, this was 8 s). Four seconds are left to spare.
RETENTION = 5.0


def _views(cluster: ProcCluster) -> dict[str, dict[str, Any]]:
    """Every replica's own applied view (``view --json`` against each one)."""
    views = {}
    for rid in cluster.arbiters:
        v = cluster.view(rid)
        assert v is not None, f"{rid} did not answer"
        views[rid] = v
    return views


def _member(view: dict[str, Any], node_id: str) -> dict[str, Any] | None:
    return next((m for m in view["members"] if m["node_id"] == node_id), None)


def _forgotten_everywhere(cluster: ProcCluster, node_id: str) -> bool:
    """Whether no replica's own view lists ``node_id``."""
    return all(_member(v, node_id) is None for v in _views(cluster).values())


def _states(watcher: Any, node_id: str) -> list[tuple[int, str, bool]]:
    """(incarnation, state, forgotten) of each change of ``node_id`` the watcher printed."""
    return [
        (c["incarnation"], c["state"], bool(c.get("forgotten"))) for c in changes(watcher, node_id)
    ]


def _view_cli(cluster: ProcCluster, *flags: str, fast: bool = False) -> list[str]:
    """Node ids ``membership view --json FLAGS`` prints; ``fast``: the same command
    run by the harness's long-lived CLI process (no Python start), where time counts."""
    argv = ("view", "--json", "--arbiters", cluster.arbiter_list(), *flags)
    r = cluster.query(*argv) if fast else run_cli(*argv)
    assert r.returncode == 0, r.stderr
    return [m["node_id"] for m in json.loads(r.stdout)["members"]]


def test_dead_record_is_forgotten_everywhere_and_its_incarnation_stays_refused(
    cluster: ProcCluster,
) -> None:
    cluster.start_arbiters(3, "--tombstone-retention", str(RETENTION), "--max-tombstones", "100")
    wait_until(cluster.leader, 20, "a leader")
    watcher = cluster.start_watch("w", "a1")
    tombstones = cluster.spawn(
        "w-dead", "watch", "--json", "--arbiters", cluster.arbiter_list("a2"),
        "--state", "DEAD,LEFT", "--label", "job=j1", log_level="warning",
    )  # fmt: skip
    n1 = cluster.start_node("n1", "--incarnation", "5", "--no-status-probes", labels={"job": "j1"})
    cluster.start_node("n2", "--incarnation", "1", "--no-status-probes", labels={"job": "j2"})
    wait_until(lambda: alive_set(watcher) == {"n1", "n2"}, 30, "n1 and n2 ALIVE")
    assert _view_cli(cluster, "--state", "ALIVE", "--label", "job=j2") == ["n2"]

    n1.kill()
    wait_until(lambda: (5, "DEAD", False) in _states(watcher, "n1"), 20, "n1 DEAD")
    # --state DEAD,LEFT is the way to see tombstones.
    assert _view_cli(cluster, "--state", "DEAD,LEFT", fast=True) == ["n1"]
    assert _view_cli(cluster, "--state", "ALIVE", fast=True) == ["n2"]

    # After the retention the leader's Forget removes it: on every replica, at one epoch.
    forgotten = wait_until(
        lambda: [c for c in changes(watcher, "n1") if c.get("forgotten")], 30, "forgotten change"
    )
    (change,) = forgotten
    assert (change["state"], change["incarnation"], change["labels"]) == ("DEAD", 5, {"job": "j1"})
    epoch = change["epoch"]
    line = f"epoch {epoch}: n1 incarnation 5 is DEAD, forgotten (bounded history)"
    for rid in cluster.arbiters:  # each replica applied it at that same epoch
        wait_until(lambda rid=rid: line in cluster.procs[rid].stderr(), 10, f"{rid} log")
    assert _forgotten_everywhere(cluster, "n1")
    # The filtered watcher printed only n1's DEAD and its forgetting (no ALIVE, no n2).
    wait_until(lambda: len(changes(tombstones)) == 2, 10, "the filtered watcher's two changes")
    assert _states(tombstones, "n1") == [(5, "DEAD", False), (5, "DEAD", True)]
    assert changes(tombstones) == changes(tombstones, "n1")
    assert _view_cli(cluster, "--state", "DEAD,LEFT") == []

    # The old life started again (a stale checkpoint, rejoin off) is refused: told
    # DEAD, it exits 3 and never appears in a view.
    addresses = ",".join(cluster.addresses)
    old = cluster.spawn(
        "n1-old", "node", "--id", "n1", "--arbiters", addresses, "--incarnation", "5",
        "--no-rejoin", "--no-status-probes",
    )  # fmt: skip
    wait_until(lambda: old.popen.poll() is not None, 30, "the old incarnation to be refused")
    assert old.popen.returncode == 3, old.stderr()
    assert any(re.search(r"incarnation 5 declared DEAD", ln) for ln in old.lines()), old.lines()

    # The same old incarnation with rejoin on picks one above the floor and joins.
    cluster.spawn(
        "n1-again", "node", "--id", "n1", "--arbiters", addresses, "--incarnation", "5",
        "--no-status-probes",
    )  # fmt: skip
    wait_until(lambda: (6, "ALIVE", False) in _states(watcher, "n1"), 30, "n1 ALIVE at 6")
    # No change named incarnation 5 of n1 after it was forgotten, on any replica.
    later = [c for c in changes(watcher, "n1") if c["epoch"] > epoch]
    assert [(c["incarnation"], c["state"]) for c in later] == [(6, "ALIVE")]
    wait_until(
        lambda: all(
            (_member(v, "n1") or {}).get("incarnation") == 6 for v in _views(cluster).values()
        ),
        10,
        "n1 at 6 on every replica",
    )
