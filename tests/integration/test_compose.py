"""The docker-compose demo cluster, tested without a Docker engine.

- docker-compose.yml is parsed and its shape checked: Compose specification
  keys only, 3 arbiter replicas with a named volume each for their data dir,
  4 nodes with rack and GPU labels, a watcher, dependencies that exist.
- Mutual TLS: the one-shot ``certs`` service writes the CA and a certificate
  per service to the ``certs`` volume (run here into a folder: twice, the
  second run keeping them), every other service waits for it to complete,
  mounts the volume and names its own certificate (``MEMBERSHIP_TLS_*``).
- Every service's command, and the arbiters' health check, passes the CLI's
  ``--check-config`` with those certificates and that environment (which
  validates every flag and file and connects to nothing, so the service
  names need not resolve), and reports the service's own TLS identity.
- The topology runs as processes, one network namespace per service (the
  chaos suite's :class:`~tests.chaos.netlab.Lab`), with the commands taken from
  the compose file and ``membership`` (the image's ENTRYPOINT) in front. Service
  names resolve to the namespaces' addresses through a hosts file per
  namespace: ``ip netns exec NS`` bind-mounts each file of ``/etc/netns/NS/``
  over the one of the same name in ``/etc`` (iproute2), as Docker's embedded
  DNS would answer them. Named volumes become folders of the test's temporary
  directory. Start order and health follow ``depends_on`` and ``healthcheck``.
  Then the README's walkthrough: every node ALIVE in the watcher's output, a
  node SIGKILLed (``docker compose kill``) is DEAD with the replicas' evidence,
  a replica stopped with SIGTERM (``docker compose stop``) changes nothing and
  the watcher stays served, and started again it serves the same view.

The namespace test needs root, ``ip`` and iptables (it skips, saying which is
missing, like tests/chaos).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from tests.chaos import netlab
from tests.chaos.cluster import (
    DEAD_WITHIN,
    ELECTION_TIMEOUT,
    LEADER_WITHIN,
    START_WITHIN,
    D,
    window,
)
from tests.integration.harness import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"

# Top-level keys of the Compose specification (compose-spec.json); x- keys are extensions.
SPEC_TOP_LEVEL = {
    "version",
    "name",
    "include",
    "services",
    "models",
    "networks",
    "volumes",
    "secrets",
    "configs",
}
# The service keys this file may use (all in the Compose specification).
SERVICE_KEYS = {
    "build",
    "image",
    "command",
    "volumes",
    "restart",
    "depends_on",
    "healthcheck",
    "environment",
}
DEPENDS_ON_CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
PORT = 7000


# --- the compose file ------------------------------------------------------------------------


def load_compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(doc, dict), "docker-compose.yml is not a mapping"
    return doc


def services_by_role(doc: dict[str, Any]) -> dict[str, list[str]]:
    """Service names by the sub-command their command runs (arbiter, node, watch)."""
    roles: dict[str, list[str]] = {}
    for name, svc in doc["services"].items():
        roles.setdefault(svc["command"][0], []).append(name)
    return roles


def flag(command: list[str], name: str) -> list[str]:
    """Every value given to ``name`` in ``command``."""
    return [command[i + 1] for i, word in enumerate(command[:-1]) if word == name]


def depends_on(svc: dict[str, Any]) -> dict[str, str]:
    """A service's dependencies and their conditions (short or long syntax)."""
    deps = svc.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def health_command(svc: dict[str, Any]) -> list[str] | None:
    """The health check as an argv (the form ``["CMD", ...]``), or None without one."""
    test = (svc.get("healthcheck") or {}).get("test")
    if test is None:
        return None
    assert isinstance(test, list) and test[0] == "CMD", f"use the exec form: {test!r}"
    return [str(word) for word in test[1:]]


def start_order(doc: dict[str, Any]) -> list[str]:
    """Services ordered so that each comes after what it depends on."""
    order: list[str] = []
    left = dict(doc["services"])
    while left:
        ready = [n for n, s in left.items() if all(d in order for d in depends_on(s))]
        assert ready, f"depends_on has a cycle among {sorted(left)}"
        for name in ready:
            order.append(name)
            del left[name]
    return order


def test_compose_file_uses_compose_specification_keys_only() -> None:
    doc = load_compose()
    assert "version" not in doc, "the Compose specification has no version key"
    unknown = {k for k in doc if k not in SPEC_TOP_LEVEL and not k.startswith("x-")}
    assert not unknown, f"keys outside the Compose specification: {unknown}"
    for name, svc in doc["services"].items():
        assert set(svc) <= SERVICE_KEYS, f"{name}: unexpected keys {set(svc) - SERVICE_KEYS}"
        # One build context, and no shared image tag (parallel builds of one tag clash).
        assert svc["build"] == "." and "image" not in svc, name
        assert isinstance(svc["command"], list), f"{name}: command must be a YAML list"
        assert all(isinstance(w, str) for w in svc["command"]), f"{name}: {svc['command']}"
        for dep, condition in depends_on(svc).items():
            assert dep in doc["services"], f"{name} depends on unknown service {dep}"
            assert condition in DEPENDS_ON_CONDITIONS, f"{name}: condition {condition!r}"
            if condition == "service_healthy":
                assert health_command(doc["services"][dep]), f"{dep} has no healthcheck"
    start_order(doc)  # no cycle


def test_compose_file_three_arbiters_with_named_volumes_four_labelled_nodes_a_watcher() -> None:
    doc = load_compose()
    services = doc["services"]
    roles = services_by_role(doc)
    assert sorted(roles) == ["arbiter", "certs", "node", "watch"], roles
    arbiters, nodes, watchers = roles["arbiter"], roles["node"], roles["watch"]
    assert len(arbiters) == 3 and len(nodes) == 4 and len(watchers) == 1, roles

    # Every replica lists every replica (the same list), by service name.
    peers = {a: flag(services[a]["command"], "--peers") for a in arbiters}
    assert all(p == peers[arbiters[0]] for p in peers.values()), peers
    assert peers[arbiters[0]] == [",".join(f"{a}={a}:{PORT}" for a in arbiters)]
    declared = doc.get("volumes") or {}
    volumes_used = set()
    for a in arbiters:
        command = services[a]["command"]
        assert flag(command, "--id") == [a]
        assert flag(command, "--listen") == [f"0.0.0.0:{PORT}"]
        (data_dir,) = flag(command, "--data-dir")
        mounts = [str(v).split(":") for v in services[a].get("volumes", [])]
        named = [m[0] for m in mounts if len(m) >= 2 and m[1] == data_dir]
        assert len(named) == 1 and named[0] in declared, f"{a}: {data_dir} is not a named volume"
        volumes_used.add(named[0])
        assert services[a].get("restart") == "unless-stopped"
    assert len(volumes_used) == 3, "two replicas cannot share one data dir"

    arbiter_list = [",".join(f"{a}:{PORT}" for a in arbiters)]
    racks = set()
    for n in nodes:
        command = services[n]["command"]
        assert flag(command, "--id") == [n]
        assert flag(command, "--arbiters") == arbiter_list, f"{n} must list every replica"
        labels = dict(label.split("=", 1) for label in flag(command, "--label"))
        assert {"rack", "gpu"} <= set(labels), f"{n}: labels {labels}"
        racks.add(labels["rack"])
        assert set(depends_on(services[n])) == set(arbiters) | {"certs"}
    assert len(racks) > 1, "every node on one rack"
    assert flag(services[watchers[0]]["command"], "--arbiters") == arbiter_list
    assert set(depends_on(services[watchers[0]])) == set(arbiters) | {"certs"}


def test_compose_file_every_service_has_its_own_certificate_from_the_certs_service() -> None:
    doc = load_compose()
    services = doc["services"]
    (certs,) = services_by_role(doc)["certs"]
    command = services[certs]["command"]
    assert command[:3] == ["certs", "init", "/certs"], command
    assert "--keep-existing" in command, "a second `up` must not fail on the files of the first"
    assert services[certs]["restart"] == "no" and "depends_on" not in services[certs]
    assert services[certs]["volumes"] == ["certs:/certs"] and "certs" in doc["volumes"]
    issued = {
        *flag(command, "--arbiters")[0].split(","),
        *flag(command, "--nodes")[0].split(","),
        *flag(command, "--observers")[0].split(","),
    }
    for name, svc in services.items():
        if name == certs:
            continue
        assert "--insecure" not in svc["command"], name
        assert depends_on(svc)[certs] == "service_completed_successfully", name
        assert "certs:/certs:ro" in svc["volumes"], name
        env = svc["environment"]
        own = name if name in issued else None
        assert own is not None, f"{name} has no certificate of its own in {certs}'s command"
        assert env == {
            "MEMBERSHIP_TLS_CA": "/certs/ca.pem",
            "MEMBERSHIP_TLS_CERT": f"/certs/{own}.pem",
            "MEMBERSHIP_TLS_KEY": f"/certs/{own}-key.pem",
        }, name


def _compose_tools() -> list[list[str]]:
    """The Compose implementations installed here: ``docker compose`` (v2, a plugin of
    the docker client; ``config`` needs no engine) and the legacy ``docker-compose``."""
    tools = []
    if shutil.which("docker"):
        r = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
        if r.returncode == 0:
            tools.append(["docker", "compose"])
    if shutil.which("docker-compose"):
        tools.append(["docker-compose"])
    return tools


def test_compose_file_accepted_by_compose_config_when_installed() -> None:
    tools = _compose_tools()
    if not tools:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed")
    for tool in tools:
        r = subprocess.run(
            [*tool, "-f", str(COMPOSE_FILE), "config", "-q"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert r.returncode == 0, f"{shlex.join(tool)} config: {r.stderr}"


def test_dockerfile_entrypoint_is_membership_as_a_non_root_user() -> None:
    text = DOCKERFILE.read_text()
    entrypoints = re.findall(r"^ENTRYPOINT (.*)$", text, re.M)
    assert [json.loads(e) for e in entrypoints] == [["membership"]]
    users = re.findall(r"^USER (\S+)$", text, re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0")


def _mapped(word: str, mounts: dict[str, Path]) -> str:
    """``word`` with a volume's mount target replaced by the volume's folder."""
    for target, folder in mounts.items():
        if word == target or word.startswith(target + "/"):
            return str(folder) + word[len(target) :]
    return word


def _mounts(svc: dict[str, Any], volumes: Path) -> dict[str, Path]:
    mounts = {}
    for spec in svc.get("volumes", []):
        source, target = str(spec).split(":")[:2]
        mounts[target] = volumes / source
        mounts[target].mkdir(parents=True, exist_ok=True)
    return mounts


def _service_env(svc: dict[str, Any], mounts: dict[str, Path]) -> dict[str, str]:
    """The service's environment with volume paths mapped; no MEMBERSHIP_INSECURE
    (tests/conftest.py sets it for the suite, a container has none)."""
    env = {k: v for k, v in os.environ.items() if k != "MEMBERSHIP_INSECURE"}
    env.update({k: _mapped(str(v), mounts) for k, v in (svc.get("environment") or {}).items()})
    return env


@pytest.fixture(scope="module")
def compose_volumes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The named volumes as folders, after the one-shot certs service ran (twice)."""
    volumes = tmp_path_factory.mktemp("volumes")
    doc = load_compose()
    (certs,) = services_by_role(doc)["certs"]
    svc = doc["services"][certs]
    mounts = _mounts(svc, volumes)
    argv = [_mapped(w, mounts) for w in svc["command"]]
    for run in (1, 2):
        r = subprocess.run(
            [sys.executable, "-m", "membership", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            env=_service_env(svc, mounts),
        )
        assert r.returncode == 0, f"run {run}: {r.stderr}"
        if run == 2:  # keeps what the first run wrote
            assert "kept" in r.stdout and "ca-key.pem" not in r.stdout, r.stdout
    return volumes


@pytest.mark.parametrize("service", sorted(load_compose()["services"]))
def test_compose_command_passes_check_config(service: str, compose_volumes: Path) -> None:
    svc = load_compose()["services"][service]
    if svc["command"][0] == "certs":
        return  # it ran for real in the compose_volumes fixture
    mounts = _mounts(svc, compose_volumes)
    argvs = [svc["command"]]
    health = health_command(svc)
    if health is not None:
        assert health[0] == "membership", health
        argvs.append(health[1:])
    own = Path(svc["environment"]["MEMBERSHIP_TLS_CERT"]).stem
    role = {"arbiter": "arbiter", "node": "node", "watch": "observer"}[svc["command"][0]]
    for argv in argvs:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "membership",
                *[_mapped(w, mounts) for w in argv],
                "--check-config",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            env=_service_env(svc, mounts),
        )
        assert r.returncode == 0, f"{shlex.join(argv)}: {r.stderr}"
        assert "configuration OK" in r.stdout.splitlines()[0], r.stdout
        assert f"tls_identity = spiffe://default/{role}/{own}" in r.stdout, r.stdout
        assert r.stderr == "", r.stderr


# --- the topology on network namespaces ------------------------------------------------------

ETC_NETNS = Path("/etc/netns")


def _remove_etc_netns(name: str) -> None:
    folder = ETC_NETNS / name
    for f in ("hosts", "resolv.conf"):
        with contextlib.suppress(FileNotFoundError):
            (folder / f).unlink()
    with contextlib.suppress(OSError):
        folder.rmdir()


def _remove_stale_etc_netns() -> None:
    """Removes the /etc/netns folders that labs of dead test runs left (the lab's
    own cleanup removes their namespaces, not these files)."""
    if not ETC_NETNS.is_dir():
        return
    for folder in ETC_NETNS.iterdir():
        parts = folder.name.split("-")
        if len(parts) < 3 or parts[0] != netlab.PREFIX or not parts[1].isdigit():
            continue
        pid = int(parts[1])
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            _remove_etc_netns(folder.name)
        except PermissionError:
            pass  # alive, someone else's


class ComposeLab:
    """The compose file's services as processes, one lab host (namespace) per service.

    :meth:`setup` creates the hosts and their /etc/netns files, :meth:`close`
    removes those files (the lab removes the rest).

    Args:
        lab: an open lab.
        doc: the parsed compose file.
        volumes: folder in which each named volume becomes a folder.
    """

    def __init__(self, lab: netlab.Lab, doc: dict[str, Any], volumes: Path) -> None:
        self.lab = lab
        self.doc = doc
        self.services: dict[str, dict[str, Any]] = doc["services"]
        self.volumes = volumes
        self.procs: dict[str, netlab.Proc] = {}
        self._etc: list[str] = []
        entry = Path(sys.executable).with_name("membership")
        self.entrypoint = [str(entry)] if entry.exists() else [sys.executable, "-m", "membership"]

    def setup(self) -> None:
        """A host per service. Each namespace's /etc/hosts names every service; its
        DNS server is its own loopback, where nothing answers, so a name missing from
        hosts fails at once (and no query leaves the lab)."""
        for name in self.services:
            self.lab.host(name)
        hosts = "127.0.0.1 localhost\n" + "".join(
            f"{h.ip} {name}\n" for name, h in self.lab.hosts.items()
        )
        for h in self.lab.hosts.values():
            folder = ETC_NETNS / h.netns
            self._etc.append(h.netns)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "hosts").write_text(hosts)
            (folder / "resolv.conf").write_text("nameserver 127.0.0.1\n")

    def close(self) -> None:
        for name in self._etc:
            _remove_etc_netns(name)
        with contextlib.suppress(OSError):
            ETC_NETNS.rmdir()  # only when empty

    def argv(self, name: str, words: list[str]) -> list[str]:
        """``membership`` + ``words`` in the service's environment (``env VAR=...``,
        MEMBERSHIP_INSECURE cleared), with every volume's mount target replaced by
        the volume's folder."""
        svc = self.services[name]
        mounts = _mounts(svc, self.volumes)
        env = [f"{k}={_mapped(str(v), mounts)}" for k, v in (svc.get("environment") or {}).items()]
        return [
            "env",
            "-u",
            "MEMBERSHIP_INSECURE",
            *env,
            *self.entrypoint,
            *[_mapped(w, mounts) for w in words],
        ]

    def start(self, name: str) -> netlab.Proc:
        argv = self.argv(name, self.services[name]["command"])
        self.procs[name] = self.lab.hosts[name].run(name, argv)
        return self.procs[name]

    def healthy(self, name: str) -> bool:
        """The service's health check passes, run in its namespace."""
        health = health_command(self.services[name])
        assert health is not None and health[0] == "membership", health
        r = self.lab.hosts[name].sh(*self.argv(name, health[1:]), timeout=30)
        return r.returncode == 0

    def up(self) -> None:
        """Starts every service in dependency order, waiting for each dependency's
        condition (started, or healthy) first, as ``docker compose up`` does."""
        healthy: set[str] = set()
        for name in start_order(self.doc):
            for dep, condition in depends_on(self.services[name]).items():
                if condition == "service_healthy" and dep not in healthy:
                    wait_until(partial(self.healthy, dep), START_WITHIN, f"{dep} healthy", 0.5)
                    healthy.add(dep)
                if condition == "service_completed_successfully":
                    done = self.procs[dep]
                    rc = done.wait(timeout=START_WITHIN)
                    assert rc == 0, f"{dep} exited {rc}: {done.stderr()[-2000:]}"
            self.start(name)

    def role(self, role: str) -> list[str]:
        return services_by_role(self.doc)[role]


_SNAPSHOT = re.compile(r"^epoch (?P<epoch>\d+)\s+snapshot from (?P<arbiter>\S+): (?P<members>.*)$")
_CHANGE = re.compile(
    r"^epoch (?P<epoch>\d+)\s+(?P<id>\S+) \(incarnation (?P<inc>\d+)\) (?P<state>[A-Z]+)"
)
_QUORUM = re.compile(r"^arbiter (?P<id>\S+) (?P<word>lost|regained) its quorum")


def watcher_states(lines: list[str]) -> dict[str, str]:
    """Each node's state according to what a (text) watcher printed so far."""
    states: dict[str, str] = {}
    for line in lines:
        if m := _SNAPSHOT.match(line):
            states = {}
            if m["members"] != "(empty)":
                for item in m["members"].split(", "):
                    node, state = item.rsplit("=", 1)
                    states[node] = state
        elif m := _CHANGE.match(line):
            states[m["id"]] = m["state"]
    return states


def test_watcher_states_from_text_lines() -> None:
    lines = [
        "epoch 2  snapshot from a1: n1=ALIVE, n2=DEAD",
        "epoch 3  n3 (incarnation 17) ALIVE",
        "arbiter a1 lost its quorum (leader: none)",
        "epoch 4  n1 (incarnation 12) DEAD; suspected by a1 after 0.76s silent (missed 5.1)",
    ]
    assert watcher_states(lines) == {"n1": "DEAD", "n2": "DEAD", "n3": "ALIVE"}
    assert watcher_states([*lines, "epoch 5  snapshot from a2: (empty)"]) == {}


@pytest.fixture
def compose_lab(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ComposeLab]:
    """The compose topology on a lab (not started); everything removed afterwards."""
    reason = netlab.unavailable()
    if reason is not None:
        pytest.skip(reason)
    doc = load_compose()
    netlab.cleanup_leftovers()
    _remove_stale_etc_netns()
    lab = netlab.Lab(tmp_path / "lab")
    cl = ComposeLab(lab, doc, tmp_path / "volumes")
    try:
        cl.setup()
        yield cl
    finally:
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            print(f"lab workdir: {lab.workdir}")
            for name, proc in sorted(lab.procs.items()):
                print(f"--- {name} stdout\n" + "\n".join(proc.lines()[-40:]))
            print(lab.dump())
        lab.close()
        cl.close()


def test_compose_topology_in_namespaces_kill_node_dead_stop_replica_nothing_changes(
    compose_lab: ComposeLab,
) -> None:
    cl = compose_lab
    nodes, arbiters = cl.role("node"), cl.role("arbiter")
    (watcher_name,) = cl.role("watch")
    cl.up()
    watcher = cl.procs[watcher_name]

    def states() -> dict[str, str]:
        assert watcher.alive(), f"the watcher exited: {watcher.stderr()[-2000:]}"
        return watcher_states(watcher.lines())

    wait_until(
        lambda: all(states().get(n) == "ALIVE" for n in nodes),
        START_WITHIN,
        f"the watcher showing {nodes} ALIVE",
    )

    # docker compose kill n2: SIGKILL; the replicas decide DEAD and say why.
    victim = nodes[1]
    t0 = time.monotonic()
    cl.procs[victim].kill()
    wait_until(lambda: states().get(victim) == "DEAD", DEAD_WITHIN, f"{victim} DEAD")
    took = time.monotonic() - t0
    dead = [line for line in watcher.lines() if (m := _CHANGE.match(line)) and m["id"] == victim]
    assert "suspected by" in dead[-1], dead
    expect = {n: "DEAD" if n == victim else "ALIVE" for n in nodes}
    assert states() == expect, f"{took:.2f}s after the kill"

    # docker compose stop a1: SIGTERM; the other two replicas go on, nothing changes.
    # Nodes keep leases from two of three replicas. A wrongful DEAD would need
    # D of silence and one Raft round, after a new leader is elected when a1
    # led (at most 2.5 election timeouts): the window covers both.
    stopped = cl.procs[arbiters[0]]
    seen = len(watcher.lines())
    stopped.terminate()
    assert stopped.wait(timeout=15) == 0, stopped.stderr()[-2000:]

    def unchanged() -> None:
        assert states() == expect
        assert not any(_CHANGE.match(line) for line in watcher.lines()[seen:])
        assert all(cl.procs[n].alive() for n in nodes if n != victim)

    window(2.5 * ELECTION_TIMEOUT + 2 * D, unchanged)

    # The watcher stays served: when the replica serving it reported its quorum
    # lost with a1 (a1 led), it moved on to one in the new quorum.
    def served() -> bool:
        said = [m for line in watcher.lines()[seen:] if (m := _QUORUM.match(line))]
        return not said or (said[-1]["word"] == "regained" and said[-1]["id"] != arbiters[0])

    wait_until(served, LEADER_WITHIN, "the watcher served by a replica in a quorum")

    # docker compose start a1: back on its data dir, in a quorum, the same view.
    stopped.start()
    wait_until(
        lambda: cl.healthy(arbiters[0]), START_WITHIN, f"{arbiters[0]} healthy again", interval=0.5
    )

    views: list[dict[str, Any]] = []

    def restarted_serves_the_view() -> bool:
        r = cl.lab.hosts[arbiters[0]].sh(
            *cl.argv(arbiters[0], ["view", "--json", "--arbiters", f"127.0.0.1:{PORT}"])
        )
        if r.returncode != 0:
            return False
        views.append(json.loads(r.stdout))
        members = {m["node_id"]: m["state"] for m in views[-1]["members"]}
        return views[-1]["arbiter"] == arbiters[0] and views[-1]["in_quorum"] and members == expect

    try:
        wait_until(restarted_serves_the_view, LEADER_WITHIN + START_WITHIN, "a1 back")
    except AssertionError as e:
        raise AssertionError(f"{e}: {arbiters[0]}'s last view: {views[-1:]}") from None
    unchanged()
