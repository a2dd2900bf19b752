"""membership._host.table: what an agent vouches for toward one arbiter (sans-I/O, time given)."""

from __future__ import annotations

from membership._host.table import HostTable, LocalLink
from membership.v1 import membership_pb2 as pb

INTERVAL = 0.15


def _link(table: HostTable, nid: str) -> tuple[LocalLink, list[object]]:
    got: list[object] = []
    link = LocalLink(node_id=nid, deliver=got.append)
    table.open(link)
    return link, got


def _hb(nid: str, seq: int) -> pb.HeartbeatRequest:
    return pb.HeartbeatRequest(node_id=nid, incarnation=7, seq=seq, interval_seconds=INTERVAL)


def _ack(entries: list[pb.HeartbeatEntry], lease: float = 0.75) -> pb.HeartbeatAck:
    return pb.HeartbeatAck(
        epoch=4,
        arbiter_id="a1",
        next_interval_seconds=INTERVAL,
        entries=[
            pb.HeartbeatEntryAck(node_id=e.node_id, seq=e.seq, lease_seconds=lease, incarnation=7)
            for e in entries
        ],
    )


def test_host_table_vouches_while_the_last_heartbeat_is_fresh_then_drops_it() -> None:
    # Rule 1: at most 1.5 intervals old; a hung process leaves the entries.
    t = HostTable()
    a, _ = _link(t, "w1")
    b, _ = _link(t, "w2")
    t.heard(a, _hb("w1", 1), 0.0)
    t.heard(b, _hb("w2", 1), 0.0)
    assert [e.node_id for e in t.entries(0.1, INTERVAL)] == ["w1", "w2"]
    t.heard(a, _hb("w1", 2), 0.15)
    assert [e.node_id for e in t.entries(0.3, INTERVAL)] == ["w1"]  # w2 0.3 s silent
    t.close(a)
    assert t.entries(0.31, INTERVAL) == []


def test_host_table_acks_each_process_heartbeat_once_with_its_own_seq() -> None:
    # Rules 2, 3: the entry seqs are the agent's; the ack goes back with the process's seq,
    # once, and carries the shared fields of the host ack.
    t = HostTable()
    a, got = _link(t, "w1")
    t.heard(a, _hb("w1", 41), 0.0)
    first = t.entries(0.0, INTERVAL)
    second = t.entries(0.1, INTERVAL)  # no new heartbeat: the same process seq again
    assert [e.seq for e in first + second] == [1, 2]
    assert t.on_ack(_ack(first)) == 1
    assert t.on_ack(_ack(second)) == 0  # that heartbeat was acked already
    (wire,) = got
    assert isinstance(wire, bytes)
    ack = pb.HeartbeatAck.FromString(wire)
    assert (ack.seq, ack.lease_seconds, ack.epoch, ack.arbiter_id) == (41, 0.75, 4, "a1")
    assert not ack.entries


def test_host_table_a_refused_entry_ends_its_link_only() -> None:
    # Rule 4: the other links go on.
    t = HostTable()
    a, got_a = _link(t, "w1")
    b, got_b = _link(t, "x1")
    t.heard(a, _hb("w1", 1), 0.0)
    t.heard(b, _hb("x1", 1), 0.0)
    entries = t.entries(0.0, INTERVAL)
    ack = _ack(entries)
    ack.entries[1].error_code, ack.entries[1].error_message = 7, "may not speak for x1"
    t.on_ack(ack)
    assert got_b == [(7, "may not speak for x1")] and b.closed
    assert len(got_a) == 1 and not a.closed
    assert [e.node_id for e in t.entries(0.1, INTERVAL)] == ["w1"]


def test_host_table_a_newer_stream_of_an_id_replaces_the_older() -> None:
    # Rule 5: the older stream ends; the host stream's seqs of the id go on rising.
    t = HostTable()
    old, got_old = _link(t, "w1")
    t.heard(old, _hb("w1", 1), 0.0)
    (e1,) = t.entries(0.0, INTERVAL)
    new, _ = _link(t, "w1")
    t.heard(new, _hb("w1", 1), 0.05)
    (e2,) = t.entries(0.1, INTERVAL)
    assert got_old and got_old[0][0] == 10  # type: ignore[index]  # ABORTED
    assert e2.seq > e1.seq
