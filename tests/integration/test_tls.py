"""Mutual TLS on real processes: identities bound to certificates, refusals, rotation by SIGHUP.

Every test here clears MEMBERSHIP_INSECURE (tests/conftest.py sets it for the
others) for its children; the cluster's CA and certificates are made in the
test's folder (:class:`membership.testing.localcluster.LocalCluster` with ``tls=True``).
"""

from __future__ import annotations

import asyncio
import datetime
import signal
import socket
import ssl
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509

from arbiter.core.raft import MessageType
from arbiter.v1 import peer_pb2, peer_pb2_grpc
from membership._client import MembershipClient
from membership.shared.errors import InvalidArgument
from membership.shared.tls import TLSFiles
from membership.shared.view import MemberState
from membership.testing.localcluster import free_ports, wait_leader
from membership.testing.pki import CertificateAuthority, identity_uri
from membership.v1 import membership_pb2 as pb
from membership.v1 import membership_pb2_grpc as pb_grpc
from tests.integration.harness import ProcCluster, wait_async, wait_until
from tests.integration.harness import secure_env as _env

pytestmark = pytest.mark.integration


def _cli(*argv: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "membership", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
async def admin(tls_cluster: ProcCluster) -> AsyncIterator[MembershipClient]:
    """An SDK client of the cluster with the admin certificate, once a leader is elected."""
    client = MembershipClient(tls_cluster.addresses, config=tls_cluster.client_config())
    try:
        await wait_leader(client, 30)
        yield client
    finally:
        await client.close()


def _creds(files: TLSFiles, *, client_cert: bool = True) -> grpc.ChannelCredentials:
    ca = files.ca.read_bytes()
    if not client_cert:
        return grpc.ssl_channel_credentials(ca)
    return grpc.ssl_channel_credentials(ca, files.key.read_bytes(), files.cert.read_bytes())


def _write(folder: Path, name: str, cert: bytes, key: bytes, ca: bytes) -> TLSFiles:
    folder.mkdir(parents=True, exist_ok=True)
    files = TLSFiles(folder / "ca.pem", folder / f"{name}.pem", folder / f"{name}-key.pem")
    files.ca.write_bytes(ca)
    files.cert.write_bytes(cert)
    files.key.write_bytes(key)
    return files


async def _heartbeat_code(address: str, creds: grpc.ChannelCredentials, node_id: str) -> str:
    """Opens a heartbeat stream for ``node_id`` with ``creds``: 'OK' when acked, else the code."""
    async with grpc.aio.secure_channel(address, creds) as ch:
        call = pb_grpc.MembershipStub(ch).Heartbeat(timeout=5)
        try:
            await call.write(pb.HeartbeatRequest(node_id=node_id, incarnation=1, seq=1))
            ack = await call.read()
            call.cancel()
            return "OK" if isinstance(ack, pb.HeartbeatAck) else "EOF"
        except grpc.aio.AioRpcError as e:
            return e.code().name


async def _call_code(address: str, creds: grpc.ChannelCredentials, what: str, **kw: object) -> str:
    async with grpc.aio.secure_channel(address, creds) as ch:
        stub = pb_grpc.MembershipStub(ch)
        try:
            if what == "leave":
                await stub.Leave(pb.LeaveRequest(**kw), timeout=5)  # type: ignore[arg-type]
            elif what == "grace":
                await stub.Grace(pb.GraceRequest(**kw), timeout=5)  # type: ignore[arg-type]
            elif what == "view":
                await stub.GetView(pb.GetViewRequest(), timeout=5)
            else:
                call = stub.Subscribe(pb.SubscribeRequest(), timeout=5)
                await call.read()
                call.cancel()
            return "OK"
        except grpc.aio.AioRpcError as e:
            return e.code().name


async def _member(client: MembershipClient, node_id: str) -> tuple[int, MemberState | None]:
    """(epoch, state of ``node_id`` or None) in the view of an arbiter in a quorum."""
    info = await client.get_view()
    m = info.view.get(node_id)
    return info.view.epoch, (m.state if m is not None else None)


async def _start_node(c: ProcCluster, admin: MembershipClient, node_id: str) -> int:
    """Starts node ``node_id`` (its own certificate) and waits until it is ALIVE; the epoch."""
    c.start_node(node_id)
    state: list[MemberState | None] = [None]
    epoch = [0]

    async def alive() -> bool:
        epoch[0], state[0] = await _member(admin, node_id)
        return state[0] is MemberState.ALIVE

    deadline = asyncio.get_running_loop().time() + 30
    while not await alive():
        assert asyncio.get_running_loop().time() < deadline, f"{node_id} not ALIVE: {c.dump()}"
        await asyncio.sleep(0.1)
    return epoch[0]


# --- identities ----------------------------------------------------------------------------


async def test_tls_node_certificate_cannot_heartbeat_or_leave_as_another_node(
    tls_cluster: ProcCluster, admin: MembershipClient
) -> None:
    c = tls_cluster
    epoch = await _start_node(c, admin, "n1")
    n1 = _creds(c.certs.files("n1"))
    for address in c.addresses:
        assert await _heartbeat_code(address, n1, "n2") == "PERMISSION_DENIED"
        assert (
            await _call_code(address, n1, "leave", node_id="n2", incarnation=1)
            == "PERMISSION_DENIED"
        )
    # The message names the certificate and what it may do.
    async with grpc.aio.secure_channel(c.addresses[0], n1) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await pb_grpc.MembershipStub(ch).Leave(
                pb.LeaveRequest(node_id="n2", incarnation=1), timeout=5
            )
    assert "spiffe://default/node/n1" in str(e.value.details())
    assert "heartbeat and leave as node n1" in str(e.value.details())
    # Nothing changed: n2 unknown, n1 ALIVE, no new epoch.
    assert await _member(admin, "n2") == (epoch, None)
    assert await _member(admin, "n1") == (epoch, MemberState.ALIVE)
    # n1's own certificate still heartbeats as n1 (the process does), and so would another stream.
    assert await _heartbeat_code(c.addresses[0], n1, "n1") == "OK"
    # Grace windows: n1 may not ask as n2; an admin may open one for n1, never end it; n1 may.
    info = await admin.get_view()
    inc = info.view.get("n1").incarnation  # type: ignore[union-attr]
    a0, ops = c.addresses[0], _creds(c.certs.files("ops", "admin"))
    assert await _call_code(a0, n1, "grace", node_id="n2", incarnation=1, seconds=9.0) == (
        "PERMISSION_DENIED"
    )
    assert await _call_code(a0, ops, "grace", node_id="n1", incarnation=inc, seconds=9.0) == "OK"
    assert await _call_code(a0, ops, "grace", node_id="n1", incarnation=inc) == (
        "FAILED_PRECONDITION"
    )
    assert await _call_code(a0, n1, "grace", node_id="n1", incarnation=inc) == "OK"


async def test_tls_node_started_with_another_nodes_certificate_exits_2_naming_it(
    tls_cluster: ProcCluster, admin: MembershipClient
) -> None:
    c = tls_cluster
    epoch = (await admin.get_view()).view.epoch
    r = _cli("node", "--id", "n2", "--arbiters", c.arbiter_list(), *c.certs.files("n1").flags())
    assert r.returncode == 2, r.stderr
    error = r.stderr.strip().splitlines()[-1]
    assert error.startswith("membership node: error: ") and "PERMISSION_DENIED" in error, error
    assert "spiffe://default/node/n1 may not speak for node 'n2'" in error
    assert await _member(admin, "n2") == (epoch, None)


async def test_tls_prefix_certificate_speaks_for_matching_ids_only(
    tls_cluster: ProcCluster, admin: MembershipClient
) -> None:
    c = tls_cluster
    agent = c.certs.files("agent", "node", uris=[identity_uri("default", "node", "host7-*")])
    creds = _creds(agent)
    assert await _heartbeat_code(c.addresses[0], creds, "host7-gpu0") == "OK"
    assert await _heartbeat_code(c.addresses[0], creds, "host8-gpu0") == "PERMISSION_DENIED"


async def test_tls_a_client_of_another_ca_is_told_so_not_given_a_raw_handshake_error(
    tls_cluster: ProcCluster, tmp_path: Path
) -> None:
    # Issue 25, item 3: a CA, certificate and key all of another CA read as
    # "TSI_PROTOCOL_FAILURE ... CERTIFICATE_VERIFY_FAILED"; the line now says what it is.
    other = CertificateAuthority.create("default")
    cert = other.issue([identity_uri("default", "node", "n9")])
    files = _write(tmp_path / "other", "n9", cert.cert_pem, cert.key_pem, other.cert_pem())

    def view() -> subprocess.CompletedProcess[str] | None:
        r = _cli(
            "view", "--timeout", "2", "--arbiters", tls_cluster.addresses[0],
            *("--tls-ca", str(files.ca), "--tls-cert", str(files.cert)),
            *("--tls-key", str(files.key)),
        )  # fmt: skip
        return None if "Connection refused" in r.stderr else r  # the arbiter not up yet

    r = wait_until(view, 30, "the arbiter to listen")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "not signed by the CA this client was given" in r.stderr, r.stderr


async def test_tls_client_without_certificate_is_refused(
    tls_cluster: ProcCluster, admin: MembershipClient
) -> None:
    c = tls_cluster
    await _start_node(c, admin, "n1")
    files = c.certs.files("n1")
    # TLS without a client certificate: the handshake fails (mutual TLS requires one).
    no_cert = _creds(files, client_cert=False)
    assert await _call_code(c.addresses[0], no_cert, "view") == "UNAVAILABLE"
    assert await _heartbeat_code(c.addresses[0], no_cert, "n1") == "UNAVAILABLE"
    # Plaintext on a TLS port: no answer either.
    async with grpc.aio.insecure_channel(c.addresses[0]) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await pb_grpc.MembershipStub(ch).GetView(pb.GetViewRequest(), timeout=3)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    # The CLI with --insecure against it fails as "no arbiter answered" (exit 1), and
    # says what "Socket closed" means (issue 25, item 3).
    r = _cli("view", "--insecure", "--timeout", "2", "--arbiters", c.addresses[0])
    assert r.returncode == 1, r.stderr
    assert "UNAVAILABLE" in r.stderr and "the arbiters may expect TLS" in r.stderr, r.stderr
    # A watch retries until --connect-timeout, but says why after 1 s, not 5 s (a fresh
    # user's trial waited the whole 10 s for the reason).
    watch = c.spawn("plain-watch", "watch", "--insecure", "--connect-timeout", "60",
                    "--arbiters", c.addresses[0])  # fmt: skip
    try:
        await wait_async(
            lambda: "the arbiters may expect TLS" in watch.stderr(), 4.0, "the watch to say why"
        )
    finally:
        watch.signal(signal.SIGTERM)
    assert watch.popen.wait(10) == 0, watch.stderr()
    assert (await _member(admin, "n1"))[1] is MemberState.ALIVE


async def _raft_code(address: str, creds: grpc.ChannelCredentials, src: str) -> str:
    async def messages() -> AsyncIterator[peer_pb2.RaftMessage]:
        yield peer_pb2.RaftMessage(type=MessageType.VOTE.value, src=src, dst="a2", term=99)
        await asyncio.sleep(10)

    async with grpc.aio.secure_channel(address, creds) as ch:
        try:
            await peer_pb2_grpc.PeerStub(ch).Raft(messages(), timeout=5)
            return "OK"
        except grpc.aio.AioRpcError as e:
            return e.code().name


async def test_tls_node_certificate_cannot_act_as_a_replica_nor_serve_as_one(
    tls_cluster: ProcCluster, admin: MembershipClient, tmp_path: Path
) -> None:
    c = tls_cluster
    a2 = c.arbiters["a2"]
    before = await admin.get_view()
    # Raft traffic with a node certificate, and with a1's certificate claiming to be a3.
    assert await _raft_code(a2, _creds(c.certs.files("n1")), "a1") == "PERMISSION_DENIED"
    assert await _raft_code(a2, _creds(c.certs.files("a1", "arbiter")), "a3") == "PERMISSION_DENIED"
    assert "refusing raft traffic" in c.children["a2"].stderr()
    # A replica process given a node certificate refuses to start (exit 2, naming it).
    port = free_ports(1)[0]
    files = c.certs.files("n1")
    r = _cli(
        "arbiter",
        *("--id", "a1", "--listen", f"127.0.0.1:{port}", "--peers", f"a1=127.0.0.1:{port}"),
        *("--data-dir", str(tmp_path / "x.data"), *files.flags()),
    )
    assert r.returncode == 2, r.stderr
    assert "needs an arbiter certificate" in r.stderr and "Traceback" not in r.stderr
    # A server presenting a node certificate: clients (a replica's own credentials) refuse it.
    server = grpc.aio.server()
    pb_grpc.add_MembershipServicer_to_server(pb_grpc.MembershipServicer(), server)
    creds = grpc.ssl_server_credentials(
        [(files.key.read_bytes(), files.cert.read_bytes())], files.ca.read_bytes(), True
    )
    fake = server.add_secure_port("127.0.0.1:0", creds)
    await server.start()
    try:
        code = await _call_code(f"127.0.0.1:{fake}", _creds(c.certs.files("a1", "arbiter")), "view")
        assert code == "UNAVAILABLE"
    finally:
        await server.stop(None)
    after = await admin.get_view()
    assert after.in_quorum and after.view.epoch == before.view.epoch


async def test_tls_observer_can_watch_and_view_but_not_heartbeat(
    tls_cluster: ProcCluster, admin: MembershipClient
) -> None:
    c = tls_cluster
    await _start_node(c, admin, "n1")
    obs = c.certs.files("obs", "observer")
    r = _cli("view", "--json", "--arbiters", ",".join(c.addresses), *obs.flags())
    assert r.returncode == 0, r.stderr
    assert '"n1"' in r.stdout
    watch = c.spawn("watch", "watch", "--json", "--arbiters", c.arbiter_list(), *obs.flags())
    snap = wait_until(
        lambda: [ev for ev in watch.json_lines() if ev.get("type") == "snapshot"], 20, "a snapshot"
    )
    assert "n1" in {m["node_id"] for m in snap[0]["members"]}
    creds = _creds(obs)
    assert await _heartbeat_code(c.addresses[0], creds, "obs") == "PERMISSION_DENIED"
    assert (
        await _call_code(c.addresses[0], creds, "leave", node_id="n1", incarnation=1)
        == "PERMISSION_DENIED"
    )
    assert (await _member(admin, "n1"))[1] is MemberState.ALIVE


async def test_tls_wrong_ca_expired_and_other_cluster_are_refused_good_node_undisturbed(
    tls_cluster: ProcCluster, admin: MembershipClient, tmp_path: Path
) -> None:
    c = tls_cluster
    epoch = await _start_node(c, admin, "n1")
    ca = c.certs.ca()
    ca_pem = ca.cert_pem()
    # A certificate for n2 from another CA, one from the right CA that has expired, and one
    # from the right CA for the node n2 of another cluster.
    other = CertificateAuthority.create("default")
    foreign = other.issue([identity_uri("default", "node", "n2")])
    foreign_files = _write(tmp_path / "foreign", "n2", foreign.cert_pem, foreign.key_pem, ca_pem)
    long_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=10)
    old = ca.issue([identity_uri("default", "node", "n2")], not_before=long_ago, days=1)
    old_files = _write(tmp_path / "expired", "n2", old.cert_pem, old.key_pem, ca_pem)
    elsewhere = ca.issue([identity_uri("prod", "node", "n2")])
    elsewhere_files = _write(tmp_path / "prod", "n2", elsewhere.cert_pem, elsewhere.key_pem, ca_pem)
    for _ in range(5):  # repeated, while n1 keeps beating
        for address in c.addresses:
            for files in (foreign_files, old_files):
                assert await _heartbeat_code(address, _creds(files), "n2") == "UNAVAILABLE"
            assert await _heartbeat_code(address, _creds(elsewhere_files), "n2") == (
                "PERMISSION_DENIED"
            )
            assert await _call_code(address, _creds(elsewhere_files), "view") == (
                "PERMISSION_DENIED"
            )
    assert await _member(admin, "n1") == (epoch, MemberState.ALIVE)
    assert not [line for line in c.children["n1"].lines() if line.startswith("n1: fenced")]
    # The SDK refuses the expired certificate before connecting, naming it.
    with pytest.raises(InvalidArgument, match="not now"):
        MembershipClient(
            c.addresses,
            node_id="n2",
            config=c.client_config(
                tls_ca=str(old_files.ca), tls_cert=str(old_files.cert), tls_key=str(old_files.key)
            ),
        )


# --- rotation ------------------------------------------------------------------------------


def _served_serial(address: str, files: TLSFiles) -> int:
    """The serial number of the certificate a replica presents to a new connection."""
    host, _, port = address.rpartition(":")
    ctx = ssl.create_default_context(cafile=str(files.ca))
    ctx.load_cert_chain(str(files.cert), str(files.key))
    ctx.set_alpn_protocols(["h2"])
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return int(x509.load_der_x509_certificate(der).serial_number)


async def test_tls_sighup_rotation_new_connections_get_the_new_certificate_streams_stay_up(
    tls_cluster: ProcCluster, admin: MembershipClient
) -> None:
    c = tls_cluster
    n1 = c.certs.files("n1")
    # The node runs here, so that its stream openings and acks can be counted. A stream is
    # only reopened when it breaks or an ack is late by 1.9 s (no spurious hedge on a busy
    # machine); its lease is shorter, which does not matter to this test.
    client = MembershipClient(
        c.addresses,
        node_id="n1",
        config=c.client_config(
            tls_ca=str(n1.ca),
            tls_cert=str(n1.cert),
            tls_key=str(n1.key),
            ack_timeout=2.0,
            hedge_after=1.9,
            follow_view=False,
            collect_status=False,
        ),
    )
    opened: dict[str, int] = dict.fromkeys(c.addresses, 0)
    acks: dict[str, int] = dict.fromkeys(c.addresses, 0)
    fresh = client._channels.fresh

    def counting_fresh(address: str):  # type: ignore[no-untyped-def]
        opened[address] += 1
        return fresh(address)

    client._channels.fresh = counting_fresh  # type: ignore[method-assign]
    try:
        await client.start()
        assert client._agent is not None
        on_ack = client._agent.on_ack

        def counting_ack(address: str, ack: pb.HeartbeatAck, now: float) -> None:
            acks[address] += 1
            on_ack(address, ack, now)

        client._agent.on_ack = counting_ack  # type: ignore[method-assign]
        await client.wait_alive(timeout=30)
        await wait_async(lambda: min(acks.values()) >= 5, 20, "acks from every replica")
        opened_before = dict(opened)
        a1 = c.certs.files("a1", "arbiter")
        # Everything blocking runs off the event loop: the node heartbeats from this process at
        # a 0.15 s interval, and a CLI process's start run on the loop (over a second on a
        # loaded CI machine) silenced it past D and got it declared DEAD.
        old_serial = await asyncio.to_thread(_served_serial, c.arbiters["a1"], n1)
        assert old_serial == x509.load_pem_x509_certificate(a1.cert.read_bytes()).serial_number
        # Re-issue a1's certificate with the CLI, then SIGHUP every replica.
        r = await asyncio.to_thread(
            _cli, "certs", "issue", str(c.certs.folder), "--arbiters", "a1", "--force"
        )
        assert r.returncode == 0, r.stderr
        new_serial = x509.load_pem_x509_certificate(a1.cert.read_bytes()).serial_number
        assert new_serial != old_serial
        log_lines = {
            rid: c.children[rid].stderr().count("TLS files reloaded") for rid in c.arbiters
        }
        for rid in c.arbiters:
            c.children[rid].signal(signal.SIGHUP)
        for rid in c.arbiters:
            await wait_async(
                lambda rid=rid: (
                    c.children[rid].stderr().count("TLS files reloaded") > log_lines[rid]
                ),
                10,
                f"{rid} reloading",
            )
        assert await asyncio.to_thread(_served_serial, c.arbiters["a1"], n1) == new_serial
        acks_at_hup = dict(acks)
        await wait_async(
            lambda: all(acks[a] >= acks_at_hup[a] + 30 for a in c.addresses),
            30,
            "30 more acks from every replica",
        )
        assert opened == opened_before, "a heartbeat stream was reopened after the SIGHUP"
        assert client.is_member
        # The cluster still works with new connections: a1 serves a fresh client.
        assert await _call_code(c.arbiters["a1"], _creds(n1), "view") == "OK"
        info = await admin.get_view()
        assert info.in_quorum
    finally:
        await client.close()
    for rid in c.arbiters:
        assert "TLS reload failed" not in c.children[rid].stderr()


async def test_tls_sighup_with_a_bad_certificate_keeps_the_old_one(
    tls_cluster: ProcCluster, admin: MembershipClient
) -> None:
    c = tls_cluster
    a1 = c.certs.files("a1", "arbiter")
    n1 = c.certs.files("n1")
    serial = _served_serial(c.arbiters["a1"], n1)
    good = a1.cert.read_bytes()
    a1.cert.write_bytes(b"not a certificate\n")
    c.children["a1"].signal(signal.SIGHUP)
    wait_until(lambda: "TLS reload failed" in c.children["a1"].stderr(), 10, "an ERROR")
    assert "not PEM" in c.children["a1"].stderr()
    a1.cert.write_bytes(good)
    assert _served_serial(c.arbiters["a1"], n1) == serial
    assert await _call_code(c.arbiters["a1"], _creds(n1), "view") == "OK"


# --- secure by default ---------------------------------------------------------------------


def test_tls_secure_by_default_commands_refuse_to_start_without_tls_or_insecure(
    tmp_path: Path,
) -> None:
    port = free_ports(1)[0]
    one = ("--id", "a1", "--listen", f"127.0.0.1:{port}", "--peers", f"a1=127.0.0.1:{port}")
    for argv in (
        ["arbiter", *one, "--data-dir", str(tmp_path / "a1.data")],
        ["node", "--id", "n1", "--arbiters", f"127.0.0.1:{port}"],
        ["watch", "--arbiters", f"127.0.0.1:{port}"],
        ["view", "--arbiters", f"127.0.0.1:{port}"],
    ):
        r = _cli(*argv)
        assert r.returncode == 2, (argv, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert "no TLS settings" in lines[0] and "membership certs init" in lines[0]
        assert "--insecure" in lines[0]
    assert not (tmp_path / "a1.data").exists()
    # Both at once is refused too.
    r = _cli("view", "--arbiters", f"127.0.0.1:{port}", "--insecure", "--tls-ca", "x")
    assert r.returncode == 2 and "choose one" in r.stderr


def test_tls_sdk_refuses_to_construct_without_tls_or_insecure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MEMBERSHIP_INSECURE", raising=False)
    with pytest.raises(InvalidArgument, match="no TLS settings") as e:
        MembershipClient(["127.0.0.1:1"], node_id="n1")
    # a Python user is told of ClientConfig and the variables, not of CLI flags
    assert "config=ClientConfig(tls_ca=" in str(e.value) and "MEMBERSHIP_TLS_CA" in str(e.value)
    assert "--tls-ca" not in str(e.value)
    monkeypatch.setenv("MEMBERSHIP_INSECURE", "1")
    MembershipClient(["127.0.0.1:1"], node_id="n1")  # explicit plaintext: constructed


def test_tls_bad_files_are_one_line_usage_errors(tmp_path: Path) -> None:
    certs = tmp_path / "c"
    assert _cli("certs", "init", str(certs), "--arbiters", "a1", "--nodes", "n1").returncode == 0
    n1 = TLSFiles.in_dir(certs, "n1")
    a1 = TLSFiles.in_dir(certs, "a1")
    cases = [
        (
            ["--tls-ca", str(n1.ca), "--tls-cert", str(n1.cert), "--tls-key", "/nope"],
            "no such file",
        ),
        (
            ["--tls-ca", str(n1.ca), "--tls-cert", str(n1.cert), "--tls-key", str(a1.key)],
            "not the key",
        ),
        (
            ["--tls-ca", str(n1.key), "--tls-cert", str(n1.cert), "--tls-key", str(n1.key)],
            "--tls-ca",
        ),
        (["--tls-ca", str(n1.ca), "--tls-cert", str(n1.cert)], "--tls-key missing"),
    ]
    (tmp_path / "junk.pem").write_text("hello\n")
    cases.append(
        (
            [
                "--tls-ca",
                str(tmp_path / "junk.pem"),
                "--tls-cert",
                str(n1.cert),
                "--tls-key",
                str(n1.key),
            ],
            "not PEM",
        )
    )
    for flags, expect in cases:
        r = _cli("node", "--id", "n1", "--arbiters", "127.0.0.1:1", "--check-config", *flags)
        assert r.returncode == 2, (flags, r.stdout, r.stderr)
        assert expect in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_tls_check_config_prints_the_tls_settings(tmp_path: Path) -> None:
    certs = tmp_path / "c"
    assert _cli("certs", "init", str(certs), "--arbiters", "a1", "--nodes", "n1").returncode == 0
    port = free_ports(1)[0]
    a1 = TLSFiles.in_dir(certs, "a1")
    r = _cli(
        "arbiter",
        *("--id", "a1", "--listen", f"127.0.0.1:{port}", "--peers", f"a1=127.0.0.1:{port}"),
        *("--data-dir", str(tmp_path / "d"), "--check-config", *a1.flags()),
    )
    assert r.returncode == 0, r.stderr
    assert f"tls_cert = {a1.cert}" in r.stdout
    assert "tls_identity = spiffe://default/arbiter/a1" in r.stdout
    n1 = TLSFiles.in_dir(certs, "n1")
    r = _cli("node", "--id", "n1", "--arbiters", f"127.0.0.1:{port}", "--check-config", *n1.flags())
    assert r.returncode == 0, r.stderr
    assert "tls_identity = spiffe://default/node/n1" in r.stdout
    r = _cli("view", "--arbiters", f"127.0.0.1:{port}", "--check-config", "--insecure")
    assert r.returncode == 0 and "tls = off" in r.stdout


def test_tls_insecure_replica_on_a_non_loopback_address_starts_with_a_warning(
    tmp_path: Path,
) -> None:
    port = free_ports(1, host="0.0.0.0")[0]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "membership",
            "arbiter",
            *("--id", "a1", "--listen", f"0.0.0.0:{port}", "--peers", f"a1=127.0.0.1:{port}"),
            *("--data-dir", str(tmp_path / "a1.data"), "--insecure"),
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
        env=_env(),
    )
    try:
        lines: list[str] = []
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "listening on" in line:
                break
        text = "".join(lines)
        assert "WARNING" in text and "plaintext (--insecure)" in text, text
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- certs init ----------------------------------------------------------------------------


def test_certs_init_writes_the_ca_and_certificates_with_private_keys_0600(tmp_path: Path) -> None:
    d = tmp_path / "certs"
    r = _cli(
        "certs",
        "init",
        str(d),
        *("--arbiters", "a1,a2,a3", "--nodes", "n1,n2,agent=host7-*", "--cluster", "prod"),
        *("--hosts", "10.0.0.5,a1=arb1.example", "--observers", "watcher"),
    )
    assert r.returncode == 0, r.stderr
    names = ["ca", "a1", "a2", "a3", "n1", "n2", "agent", "admin", "watcher"]
    expected = {f"{n}.pem" for n in names} | {f"{n}-key.pem" for n in names}
    assert {p.name for p in d.iterdir()} == expected
    for p in d.iterdir():
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode == (0o600 if p.name.endswith("-key.pem") else 0o644), (p.name, oct(mode))

    def sans(name: str) -> tuple[list[str], list[str]]:
        cert = x509.load_pem_x509_certificate((d / f"{name}.pem").read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        hosts = [*san.get_values_for_type(x509.DNSName)]
        hosts += [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
        return san.get_values_for_type(x509.UniformResourceIdentifier), sorted(hosts)

    assert sans("a1") == (["spiffe://prod/arbiter/a1"], sorted(["10.0.0.5", "arb1.example", "a1"]))
    assert sans("a2") == (["spiffe://prod/arbiter/a2"], sorted(["10.0.0.5", "a2"]))
    assert sans("n1") == (["spiffe://prod/node/n1"], [])
    assert sans("agent") == (["spiffe://prod/node/host7-*"], [])
    assert sans("admin") == (["spiffe://prod/admin/admin"], [])
    assert sans("watcher") == (["spiffe://prod/observer/watcher"], [])
    # Never overwritten without --force (exit 1, naming a file); with it, new keys.
    key = (d / "n1-key.pem").read_bytes()
    r = _cli("certs", "init", str(d), "--arbiters", "a1", "--nodes", "n1")
    assert r.returncode == 1 and "--force" in r.stderr and "ca.pem" in r.stderr
    assert (d / "n1-key.pem").read_bytes() == key
    r = _cli("certs", "init", str(d), "--arbiters", "a1", "--nodes", "n1", "--force")
    assert r.returncode == 0, r.stderr
    assert (d / "n1-key.pem").read_bytes() != key
    # certs issue: signed by the CA already there.
    r = _cli("certs", "issue", str(d), "--nodes", "n9", "--cluster", "prod")
    assert r.returncode == 0, r.stderr
    ca = x509.load_pem_x509_certificate((d / "ca.pem").read_bytes())
    n9 = x509.load_pem_x509_certificate((d / "n9.pem").read_bytes())
    assert n9.issuer == ca.subject
    # Bad flags: usage errors.
    for argv, expect in (
        (["--arbiters", "a1", "--nodes", "host7-*"], "NAME=host7-*"),
        (["--arbiters", "a1,a1"], "twice"),
        (["--arbiters", "a1", "--cluster", "a/b"], "trust domain"),
        (["--nodes", "n1"], "--arbiters"),
    ):
        r = _cli("certs", "init", str(tmp_path / "other"), *argv)
        assert r.returncode == 2 and expect in r.stderr, (argv, r.stderr)
