"""The lab itself (tests/chaos/netlab.py): cuts drop exactly the direction asked for,
heals restore, processes pause, resume, die and restart, and nothing is left behind.

Directions are checked with UDP datagrams, which TCP's handshake would hide (a
one-way cut breaks a TCP connection both ways). A datagram that must NOT
arrive is checked without waiting for a timeout: after it, a marker is sent on
a healed link, and the receiver, reading in order, must show the marker
without the datagram before it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest

from tests.chaos import netlab
from tests.chaos.netlab import Host, Lab, wait_until

pytestmark = pytest.mark.chaos

PORT = 9000
# Local datagrams and process starts, on a loaded machine.
WITHIN = 20.0

_RECEIVER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
while True:
    data, _ = s.recvfrom(1000)
    print(data.decode(), flush=True)
"""
_SENDER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.sendto(sys.argv[3].encode(), (sys.argv[1], int(sys.argv[2])))
"""
_TICKER = """
import itertools, time
for i in itertools.count():
    print(i, flush=True)
    time.sleep(0.02)
"""


def _send(src: Host, dst: Host, text: str) -> None:
    r = src.sh(sys.executable, "-c", _SENDER, dst.ip, str(PORT), text)
    assert r.returncode == 0, r.stderr


def _received(lab: Lab, host: Host) -> list[str]:
    return lab.procs[f"rx_{host.name}"].lines()[1:]


def _has(lab: Lab, host: Host, text: str) -> bool:
    return text in _received(lab, host)


def _receivers(lab: Lab, *hosts: Host) -> None:
    for h in hosts:
        h.run(f"rx_{h.name}", [sys.executable, "-c", _RECEIVER, h.ip, str(PORT)])
    for h in hosts:
        lab.procs[f"rx_{h.name}"].wait_lines(1, WITHIN)


def _flush(lab: Lab, *pairs: tuple[Host, Host], tag: str) -> None:
    """Heals everything and sends a marker over each pair; waits for every marker."""
    lab.heal_all()
    for src, dst in pairs:
        _send(src, dst, f"{tag}:{src.name}>{dst.name}")
    for src, dst in pairs:
        marker = f"{tag}:{src.name}>{dst.name}"
        wait_until(partial(_has, lab, dst, marker), WITHIN, marker)


def test_chaos_netlab_cuts_drop_only_the_direction_asked(lab: Lab) -> None:
    a, b, c = lab.host("a"), lab.host("b"), lab.host("c")
    probe = lab.host("p", mgmt=True)
    _receivers(lab, a, b, c, probe)
    everyone = [(x, y) for x in (a, b, c) for y in (a, b, c) if x is not y]

    a.cut(b, "out")  # a's packets to b dropped; b's to a pass
    _send(a, b, "1:a>b")
    _send(b, a, "1:b>a")
    _flush(lab, (a, b), (b, a), tag="m1")
    assert "1:a>b" not in _received(lab, b)
    assert "1:b>a" in _received(lab, a)

    a.cut(b, "in")  # b's packets to a dropped; a's to b pass
    _send(a, b, "2:a>b")
    _send(b, a, "2:b>a")
    _flush(lab, (a, b), (b, a), tag="m2")
    assert "2:a>b" in _received(lab, b)
    assert "2:b>a" not in _received(lab, a)

    a.cut(b)  # both ways; c untouched
    assert f"-A INPUT -s {b.ip}/32 -j DROP" in a.rules()
    assert f"-A INPUT -s {a.ip}/32 -j DROP" in b.rules()
    for src, dst in everyone:
        _send(src, dst, f"3:{src.name}>{dst.name}")
    a.heal(b)
    _flush(lab, *everyone, tag="m3")
    for src, dst in everyone:
        cut = {src.name, dst.name} == {"a", "b"}
        assert (f"3:{src.name}>{dst.name}" in _received(lab, dst)) is not cut, (src, dst)
    assert a.rules().count("-A ") == b.rules().count("-A ") == 0

    a.isolate()  # from b and c, not from the management host
    for src, dst in [*everyone, (a, probe), (probe, a)]:
        _send(src, dst, f"4:{src.name}>{dst.name}")
    _flush(lab, *everyone, (a, probe), (probe, a), tag="m4")
    for src, dst in everyone:
        cut = "a" in (src.name, dst.name)
        assert (f"4:{src.name}>{dst.name}" in _received(lab, dst)) is not cut, (src, dst)
    assert "4:a>p" in _received(lab, probe) and "4:p>a" in _received(lab, a)

    lab.partition([a], [b, c])
    for src, dst in everyone:
        _send(src, dst, f"5:{src.name}>{dst.name}")
    _flush(lab, *everyone, tag="m5")
    for src, dst in everyone:
        cut = "a" in (src.name, dst.name)
        assert (f"5:{src.name}>{dst.name}" in _received(lab, dst)) is not cut, (src, dst)


_ECHO_SERVER = """
import socket, sys
srv = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
conn, _ = srv.accept()
while data := conn.recv(1000):
    conn.sendall(data)
"""
_LINE_CLIENT = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
f = c.makefile("rw")
print("connected", flush=True)
for line in sys.stdin:
    f.write(line)
    f.flush()
    print(f.readline().strip(), flush=True)
"""


def test_chaos_netlab_proxy_in_a_namespace_forwards_freezes_heals(lab: Lab) -> None:
    a, p, b = lab.host("a"), lab.host("p"), lab.host("b")
    b.run("echo", [sys.executable, "-c", _ECHO_SERVER, b.ip, str(PORT)]).wait_lines(1, WITHIN)
    proxy = p.proxy("proxy", PORT + 1, b.addr(PORT), delay=0.05)
    assert proxy.address == p.addr(PORT + 1)
    host, port = proxy.address.split(":")
    client = a.run("client", [sys.executable, "-c", _LINE_CLIENT, host, port])
    client.wait_lines(1, WITHIN)
    client.send_line("one")
    assert client.wait_lines(2, WITHIN)[1] == "one"
    proxy.freeze()
    client.send_line("two")
    # Bounded window: frozen, nothing comes back (the echo takes ~0.1 s when open).
    time.sleep(0.5)
    assert len(client.lines()) == 2
    proxy.heal()
    assert client.wait_lines(3, WITHIN)[2] == "two"


def test_chaos_netlab_pause_resume_kill_restart(lab: Lab) -> None:
    h = lab.host("h")
    p = h.run("ticker", [sys.executable, "-u", "-c", _TICKER])
    p.wait_lines(3, WITHIN)
    p.pause()
    n = len(p.lines())
    # Bounded window: a stopped process prints nothing (it ticks every 20 ms).
    time.sleep(0.5)
    assert len(p.lines()) <= n + 1  # one line may have been in the pipe
    p.resume()
    p.wait_lines(n + 5, WITHIN)
    pid = p.pid
    p.kill()
    assert not p.alive() and p.returncode() == -9
    p.restart()
    assert p.alive() and p.pid != pid and p.starts == 2
    p.wait_lines(len(p.lines()) + 3, WITHIN)
    # Its namespace: only its own address and loopback.
    r = h.sh("ip", "-4", "-o", "addr")
    assert h.ip in r.stdout and "eth0" in r.stdout, r.stdout


def test_chaos_netlab_remove_host_kills_its_processes_deletes_its_namespace(lab: Lab) -> None:
    a, gone = lab.host("a"), lab.host("gone")
    p = gone.run("ticker", [sys.executable, "-u", "-c", _TICKER])
    p.wait_lines(1, WITHIN)
    a.cut(gone)
    lab.remove_host("gone")
    assert not p.alive() and "gone" not in lab.hosts and "ticker" in lab.procs
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert gone.netns not in listed
    assert a.blocked_in == set(), a.blocked_in  # no rule left for an address that is gone
    # Its address is never given to a host added later.
    assert lab.host("later").ip not in {gone.ip, a.ip}


def test_chaos_netlab_close_removes_everything_and_leftovers_are_cleaned(tmp_path: Path) -> None:
    reason = netlab.unavailable()
    if reason is not None:
        pytest.skip(reason)
    lab = Lab(tmp_path)
    a = lab.host("a")
    p = a.run("sleeper", ["sleep", "600"])
    pid = p.pid
    base = lab.base
    assert any(ln.startswith(base) for ln in _netns())
    lab.close()
    lab.close()  # idempotent
    assert not any(ln.startswith(base) for ln in _netns())
    assert pid is not None and not _alive(pid)

    # A namespace of a run that died (its pid is gone) is removed, with its processes.
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"{netlab.PREFIX}-{dead.pid}-1-x"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    sleeper = subprocess.Popen(["ip", "netns", "exec", stale, "sleep", "600"])
    try:
        wait_until(lambda: str(sleeper.pid) in _pids(stale), WITHIN, "the sleeper in the namespace")
        assert stale in netlab.cleanup_leftovers()
        assert stale not in _netns()
        sleeper.wait(timeout=WITHIN)
    finally:
        sleeper.kill()
        subprocess.run(["ip", "netns", "del", stale], capture_output=True)


def _netns() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [ln.split()[0] for ln in out.splitlines() if ln.split()]


def _pids(netns: str) -> list[str]:
    r = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    return r.stdout.split()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (not reaped by anyone yet) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize(
    ("euid", "missing", "reason"),
    [
        (1000, None, "need root"),
        (0, "ip", "apt-get install iproute2"),
        (0, "iptables", "apt-get install iptables"),
        (0, "iptables-restore", "apt-get install iptables"),
    ],
)
def test_chaos_netlab_says_why_it_cannot_run(
    monkeypatch: pytest.MonkeyPatch, euid: int, missing: str | None, reason: str
) -> None:
    real_which = shutil.which
    monkeypatch.setattr(netlab, "_checked", False)
    monkeypatch.setattr(netlab, "_unavailable", None)
    monkeypatch.setattr(os, "geteuid", lambda: euid)
    monkeypatch.setattr(shutil, "which", lambda name: None if name == missing else real_which(name))
    got = netlab.unavailable()
    assert got is not None and reason in got, got
