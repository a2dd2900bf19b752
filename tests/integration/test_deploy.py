"""The deployment files beyond Compose: deploy/kubernetes/*.yaml and deploy/systemd/.

Kubernetes: every manifest validates against the Kubernetes schemas
(kubernetes-validate, strict), the pieces fit each other (the StatefulSet's
Service, the probes' port, the PodDisruptionBudget's selector), and the
StatefulSet's command line, with the pod's environment substituted as the
kubelet does (``$(VAR)``) and its mounts pointed at temporary folders, is
accepted by the real ``membership arbiter --check-config`` for each pod.

systemd: the unit's hardening options are there, and its ExecStart, with the
example environment file and the specifiers substituted (loopback addresses
in place of the example's), is run as is: it serves the health service on
its --health-listen port, and SIGTERM stops it with exit 0 within
TimeoutStopSec. ``systemd-analyze verify`` checks the unit when installed.
"""

from __future__ import annotations

import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import kubernetes_validate
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from arbiter.workers import ingest_worker_count
from membership.testing.localcluster import free_ports
from tests.integration.harness import ProcCluster, wait_until
from tests.integration.harness import secure_env as _env

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MEMBERSHIP = str(Path(sys.executable).with_name("membership"))


def _certs(folder: Path, arbiters: str) -> Path:
    r = subprocess.run(
        [MEMBERSHIP, "certs", "init", str(folder), "--arbiters", arbiters],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
    )
    assert r.returncode == 0, r.stderr
    return folder


# --- Kubernetes ---------------------------------------------------------------------


def _manifests() -> dict[str, dict[str, Any]]:
    """Every resource of deploy/kubernetes, by ``Kind/name``."""
    out = {}
    for f in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            if doc:
                out[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return out


def test_kubernetes_every_manifest_validates_strictly() -> None:
    resources = _manifests()
    assert set(resources) == {
        "StatefulSet/arbiter",
        "Service/arbiter-peers",
        "Service/arbiter",
        "PodDisruptionBudget/arbiter",
    }
    version = kubernetes_validate.latest_version()
    for doc in resources.values():
        kubernetes_validate.validate(doc, version, strict=True)  # raises ValidationError
    broken = yaml.safe_load((DEPLOY / "kubernetes" / "pdb.yaml").read_text())
    broken["spec"]["maxUnavailable"] = {"not": "a number"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)


def _container(sts: dict[str, Any]) -> dict[str, Any]:
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _flag(args: list[str], name: str) -> str:
    return next(a.split("=", 1)[1] for a in args if a.startswith(f"{name}="))


def test_kubernetes_pieces_fit_together() -> None:
    r = _manifests()
    sts, headless = r["StatefulSet/arbiter"], r["Service/arbiter-peers"]
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["serviceName"] == "arbiter-peers"
    assert sts["spec"]["podManagementPolicy"] == "Parallel"  # readiness needs a quorum
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"]
    for name in ("Service/arbiter-peers", "Service/arbiter"):
        assert r[name]["spec"]["selector"].items() <= pod_labels.items()
    pdb = r["PodDisruptionBudget/arbiter"]["spec"]
    assert (
        pdb["maxUnavailable"] == 1 and pdb["selector"]["matchLabels"].items() <= pod_labels.items()
    )
    c = _container(sts)
    health_port = int(_flag(c["args"], "--health-listen").rsplit(":", 1)[1])
    assert c["readinessProbe"]["grpc"] == {
        "port": health_port,
        "service": "membership.v1.Membership",
    }
    assert c["livenessProbe"]["grpc"] == {"port": health_port}
    peers = _flag(c["args"], "--peers").split(",")
    assert [p.split("=", 1)[0] for p in peers] == ["arbiter-0", "arbiter-1", "arbiter-2"]
    pod_security = sts["spec"]["template"]["spec"]["securityContext"]
    assert pod_security["runAsNonRoot"] and pod_security["runAsUser"] != 0
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert _flag(c["args"], "--data-dir").startswith(mounts[claim["metadata"]["name"]] + "/")
    assert "limits" in c["resources"] and "requests" in c["resources"]


def _kubelet_expand(value: str, env: dict[str, str]) -> str:
    """``$(VAR)`` replaced as the kubelet does (an unknown one is left as it is)."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), value)


@pytest.fixture(scope="module")
def k8s_secret(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files of the Secret membership-tls, made as README.md says (once for the module)."""
    return _certs(tmp_path_factory.mktemp("secret") / "tls", "arbiter-0,arbiter-1,arbiter-2")


@pytest.mark.parametrize("ordinal", [0, 1, 2])
def test_kubernetes_statefulset_command_line_passes_check_config(
    tmp_path: Path, k8s_secret: Path, ordinal: int
) -> None:
    sts = _manifests()["StatefulSet/arbiter"]
    c = _container(sts)
    pod = f"{sts['metadata']['name']}-{ordinal}"
    # The mounts, pointed at temporary folders; the TLS secret made as README.md says.
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    mounts = {}
    for m in c["volumeMounts"]:
        secret = "secret" in volumes.get(m["name"], {})
        mounts[m["mountPath"]] = str(k8s_secret if secret else tmp_path / m["name"])

    def local(value: str) -> str:
        """A path under a mount (the whole value, or after a flag's ``=``) moved to its folder."""
        paths = "|".join(re.escape(p) for p in sorted(mounts, key=len, reverse=True))
        return re.sub(rf"(^|=)({paths})/", lambda m: f"{m[1]}{mounts[m[2]]}/", value)

    fields = {"metadata.name": pod, "metadata.namespace": "membership"}
    env: dict[str, str] = {}
    for item in c["env"]:
        if "valueFrom" in item:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[item["name"]] = local(_kubelet_expand(item["value"], env))
    args = [local(_kubelet_expand(a, env)) for a in c["args"]]
    assert not [a for a in args if "$(" in a], args
    r = subprocess.run(
        [MEMBERSHIP, *args, "--check-config"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**_env(), **env},
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, r.stderr
    assert f"arbiter {pod}: configuration OK" in r.stdout
    assert f"  id = {pod}\n" in r.stdout
    assert f"spiffe://default/arbiter/{pod}" in r.stdout
    assert f"{pod}={pod}.arbiter-peers.membership.svc.cluster.local:7000" in r.stdout
    assert "  ingest_workers = 1\n" in r.stdout  # the manifest's, not auto's node cores


# --- systemd -----------------------------------------------------------------------


def _unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A unit file: section -> key -> every value given (in order), continuations joined."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    pending = ""
    for raw in path.read_text().splitlines():
        line = pending + raw.strip()
        pending = ""
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def _env_file(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip().strip("'\"")
    return out


UNIT = DEPLOY / "systemd" / "membership-arbiter.service"


def test_systemd_unit_hardening_and_stop_options() -> None:
    svc = _unit(UNIT)["Service"]
    one = {k: v[-1] for k, v in svc.items()}
    assert one["DynamicUser"] == "yes" and one["StateDirectory"] == "membership-arbiter"
    assert one["NoNewPrivileges"] == "yes" and one["ProtectSystem"] == "strict"
    assert one["Restart"] == "on-failure" and one["KillSignal"] == "SIGTERM"
    # Graceful stop: the shutdown grace (1 s) and the driver's stop fit well inside.
    assert 5 <= int(one["TimeoutStopSec"]) <= 60
    assert "%S/membership-arbiter" in one["ExecStart"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    # verify checks that the program exists: point it at this environment's.
    text = UNIT.read_text()
    program = shlex.split(_unit(UNIT)["Service"]["ExecStart"][-1])[0]
    unit = tmp_path / UNIT.name
    unit.write_text(text.replace(program, MEMBERSHIP))
    r = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    said = [line for line in (r.stdout + r.stderr).splitlines() if UNIT.name in line]
    assert r.returncode == 0 and not said, r.stdout + r.stderr


def _specifiers(value: str, table: dict[str, str]) -> str:
    return re.sub(r"%(.)", lambda m: table[m[1]], value)


def test_systemd_unit_command_line_serves_health_and_stops_on_sigterm(
    cluster: ProcCluster, tmp_path: Path
) -> None:
    svc = _unit(UNIT)["Service"]
    env = _env_file(DEPLOY / "systemd" / "arbiter.env.example")
    # The example's machines, moved to loopback ports here.
    port, other1, other2, health = free_ports(4)
    env["ARBITER_LISTEN"] = f"127.0.0.1:{port}"
    env["ARBITER_PEERS"] = (
        f"{env['ARBITER_ID']}=127.0.0.1:{port},x2=127.0.0.1:{other1},x3=127.0.0.1:{other2}"
    )
    env["ARBITER_HEALTH_LISTEN"] = f"127.0.0.1:{health}"
    # LoadCredential=NAME:PATH, PATH a file of `membership certs init` renamed as the unit says.
    certs = _certs(tmp_path / "certs", f"{env['ARBITER_ID']},x2,x3")
    creds = tmp_path / "credentials"
    creds.mkdir()
    for spec in svc["LoadCredential"]:
        name, _, source = spec.partition(":")
        given = Path(source).name.replace("arbiter", env["ARBITER_ID"])
        shutil.copy(certs / given, creds / name)
    state = tmp_path / "state"
    state.mkdir()
    table = {"S": str(state), "d": str(creds), "%": "%"}
    (exec_start,) = svc["ExecStart"]
    argv = shlex.split(_specifiers(exec_start, table))
    assert Path(argv[0]).name == "membership"
    argv = [
        MEMBERSHIP,
        *(re.sub(r"\$\{(\w+)\}", lambda m: env[m[1]], a) for a in argv[1:]),
    ]
    assert not [a for a in argv if "$" in a or "%" in a], argv
    proc = cluster.spawn_command("a1", argv, env={**_env(), **env})

    def status(service: str) -> int | None:
        try:
            with grpc.insecure_channel(env["ARBITER_HEALTH_LISTEN"]) as ch:
                stub = health_pb2_grpc.HealthStub(ch)
                return int(
                    stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2).status
                )
        except grpc.RpcError:
            return None

    serving = health_pb2.HealthCheckResponse.SERVING
    wait_until(lambda: status("") == serving, 30, "the health port SERVING")
    # Alone of its group, in no quorum: the API is NOT_SERVING (readiness fails).
    assert status("membership.v1.Membership") == health_pb2.HealthCheckResponse.NOT_SERVING
    assert (state / "membership-arbiter" / "raft.sqlite3").exists()
    # The unit runs the default, auto: one ingest worker per usable core, each serving.
    k = ingest_worker_count("auto")
    wait_until(lambda: f"ingest worker {k - 1} (pid" in proc.stderr(), 10, "the last worker")
    proc.signal(getattr(signal, _unit(UNIT)["Service"]["KillSignal"][-1]))
    assert proc.popen.wait(int(svc["TimeoutStopSec"][-1])) == 0, proc.stderr()
    assert "Traceback" not in proc.stderr()
