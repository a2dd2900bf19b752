"""The operating surfaces without a cluster: JSON log lines, the metrics' histograms and
counters, the ``--metrics-listen`` and ``--log-format`` flags, ``admin status`` output."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from arbiter.server.ops.metrics import Buckets, Counters
from membership.cli import main
from membership.cli.admin.status import status_table
from membership.shared.errors import InvalidArgument
from membership.shared.logfmt import JsonFormatter, log_event, setup_logging
from membership.testing.localcluster import free_ports

PEERS = "a1=127.0.0.1:7001,a2=127.0.0.1:7002,a3=127.0.0.1:7003"


def _record(logger: logging.Logger, emit: object) -> logging.LogRecord:
    """The one record ``emit()`` logs on ``logger``."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep()
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        emit()  # type: ignore[operator]
    finally:
        logger.removeHandler(handler)
    assert len(records) == 1
    return records[0]


def test_logfmt_event_is_one_json_object_with_its_fields() -> None:
    log = logging.getLogger("test.logfmt")
    rec = _record(
        log,
        lambda: log_event(
            log, "membership_change", "n1 is DEAD\nreally", node="n1", evidence=[{"a": 1}], ts=5
        ),
    )
    line = JsonFormatter().format(rec)
    assert "\n" not in line
    d = json.loads(line)
    assert d["level"] == "INFO" and d["logger"] == "test.logfmt"
    assert d["msg"] == "n1 is DEAD\nreally" and d["event"] == "membership_change"
    assert d["node"] == "n1" and d["evidence"] == [{"a": 1}]
    assert d["ts"].endswith("Z") and d["field_ts"] == 5  # a field never hides a fixed key
    # In text, the message alone; without one, the event and its fields.
    assert rec.getMessage() == "n1 is DEAD\nreally"
    rec = _record(log, lambda: log_event(log, "config_change", arbiter="a4", voters=["a1"]))
    assert rec.getMessage() == 'config_change arbiter="a4" voters=["a1"]'


def test_config_change_is_a_json_event_at_the_level_given() -> None:
    from arbiter.server.consensus.events import log as events_log
    from arbiter.server.consensus.events import log_config_change

    rec = _record(
        events_log,
        lambda: log_config_change(
            "a1", "change add_learner a4", change="add_learner", replica="a4", index=7
        ),
    )
    d = json.loads(JsonFormatter().format(rec))
    assert d["event"] == "config_change" and d["level"] == "WARNING"
    assert (d["arbiter"], d["change"], d["replica"], d["index"]) == ("a1", "add_learner", "a4", 7)
    rec = _record(events_log, lambda: log_config_change("a2", "now", level=logging.INFO, index=8))
    assert json.loads(JsonFormatter().format(rec))["level"] == "INFO"


def test_logfmt_plain_record_and_exception() -> None:
    log = logging.getLogger("test.logfmt.plain")

    def boom() -> None:
        try:
            raise ValueError("bad")
        except ValueError:
            log.exception("turn %d failed", 3)

    d = json.loads(JsonFormatter().format(_record(log, boom)))
    assert d["msg"] == "turn 3 failed" and d["level"] == "ERROR"
    assert "ValueError: bad" in d["exc"] and "event" not in d


def test_logfmt_unknown_format_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMBERSHIP_LOG_FORMAT", "xml")
    with pytest.raises(InvalidArgument, match="MEMBERSHIP_LOG_FORMAT"):
        setup_logging("info")


def test_cli_log_format_json_every_stderr_line_is_json(tmp_path: object) -> None:
    """A real command with --log-format json after the sub-command: JSON lines on stderr."""
    (port,) = free_ports(1)
    r = subprocess.run(
        [
            *(sys.executable, "-m", "membership", "--log-level", "info", "--log-format", "json"),
            *("view", "--insecure", "--timeout", "0.5", "--arbiters", f"127.0.0.1:{port}"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    # The one-line CLI error stays plain text (rule 2 of membership/cli.py): the last line.
    assert lines[-1].startswith("membership view: error:")
    for line in lines[:-1]:
        assert {"ts", "level", "logger", "msg"} <= json.loads(line).keys()


def test_metrics_buckets_are_cumulative_and_bounds_inclusive() -> None:
    b = Buckets((0.1, 0.5))
    for v in (0.05, 0.1, 0.3, 7.0):
        b.observe(v)
    fam = b.family("x_seconds", "doc", "a1")
    got = {(s.name, s.labels.get("le")): s.value for s in fam.samples}
    assert got[("x_seconds_bucket", "0.1")] == 2  # le means <=
    assert got[("x_seconds_bucket", "0.5")] == 3
    assert got[("x_seconds_bucket", "+Inf")] == 4
    assert got[("x_seconds_count", None)] == 4
    assert got[("x_seconds_sum", None)] == pytest.approx(7.45)
    assert all(s.labels["arbiter"] == "a1" for s in fam.samples)
    with pytest.raises(ValueError):
        Buckets((0.5, 0.1))


def test_metrics_commit_to_subscriber_latency_of_known_epochs_only() -> None:
    c = Counters()
    c.applied(7, 10.0)
    c.delivered(7, 10.25)
    c.delivered(8, 11.0)  # applied before the process started, or long forgotten: not counted
    assert sum(c.delivery.counts) == 1 and c.delivery.sum == pytest.approx(0.25)
    for epoch in range(2000):
        c.applied(epoch, 0.0)
    c.delivered(0, 1.0)  # the oldest are forgotten (memory bound)
    assert sum(c.delivery.counts) == 1


def _arbiter(*argv: str) -> list[str]:
    return [
        *("arbiter", "--id", "a1", "--data-dir", "/nonexistent/a1"),
        *("--listen", "127.0.0.1:7001", "--peers", PEERS, *argv, "--check-config"),
    ]


def test_cli_arbiter_metrics_listen_flag_and_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_arbiter()) == 0
    assert "  metrics_listen = " in capsys.readouterr().out.splitlines()  # off by default
    monkeypatch.setenv("MEMBERSHIP_METRICS_LISTEN", "127.0.0.1:9101")
    assert main(_arbiter()) == 0
    assert "  metrics_listen = 127.0.0.1:9101" in capsys.readouterr().out.splitlines()
    assert main(_arbiter("--metrics-listen", "0.0.0.0:9102")) == 0  # the flag wins
    assert "  metrics_listen = 0.0.0.0:9102" in capsys.readouterr().out.splitlines()


@pytest.mark.parametrize(
    ("value", "expect"),
    [
        ("9100", "--metrics-listen: address '9100' is not host:port"),
        ("127.0.0.1:7001", "is the --listen address"),
    ],
)
def test_cli_arbiter_metrics_listen_refused(
    value: str, expect: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_arbiter("--metrics-listen", value)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expect in err[0], err


def test_admin_status_table_rows_configuration_and_errors() -> None:
    cfg = {"voters": {"a1": "h:1", "a2": "h:2"}, "learners": {}}
    lines = [
        {
            **dict(arbiter="a1", address="h:1", role="leader", term=3, leader="a1"),
            **dict(commit_index=9, applied_index=9, epoch=4, in_quorum=True, version="0.1.0"),
            "configuration": cfg,
            "followers": {"a2": {"match_index": 9, "lag": 0, "last_heard_seconds": 12.44}},
        },
        {
            **dict(arbiter="a2", address="h:2", role="follower", term=3, leader="a1"),
            **dict(commit_index=9, applied_index=8, epoch=4, in_quorum=False, version="0.1.0"),
            "configuration": cfg,
        },
        {"arbiter": "h:3", "address": "h:3", "error": "UNAVAILABLE: connection refused"},
    ]
    out = status_table(lines).splitlines()
    assert out[0].split()[:4] == ["ARBITER", "ADDRESS", "ROLE", "TERM"]
    row1 = "a1 h:1 leader 3 a1 9 9 4 yes 0.1.0 a2=9/0/12.4s"
    row2 = "a2 h:2 follower 3 a1 9 8 4 NO 0.1.0 -"
    assert " ".join(out[1].split()) == row1
    assert " ".join(out[2].split()) == row2
    assert out[3] == "configuration (a1, a2): voters a1=h:1, a2=h:2"
    assert out[4] == "h:3: error: UNAVAILABLE: connection refused"


def test_cli_admin_status_exit_one_when_no_replica_answers() -> None:
    ports = free_ports(2)
    addrs = ",".join(f"127.0.0.1:{p}" for p in ports)
    r = subprocess.run(
        [
            *(sys.executable, "-m", "membership", "admin", "status", "--json", "--insecure"),
            *("--timeout", "0.5", "--arbiters", addrs),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 1
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [line["arbiter"] for line in lines] == addrs.split(",")
    assert all(line["error"].startswith(("UNAVAILABLE", "DEADLINE_EXCEEDED")) for line in lines)
    assert r.stderr.strip() == "membership admin status: error: none of the 2 arbiter(s) answered"


def test_config_metrics_listen_is_off_by_default_and_validated() -> None:
    from arbiter.config import ArbiterConfig

    assert ArbiterConfig.lan().metrics_listen == ""
    assert ArbiterConfig(metrics_listen="[::1]:9101").validate().metrics_listen == "[::1]:9101"
    with pytest.raises(InvalidArgument, match="metrics_listen: address 'x' is not host:port"):
        ArbiterConfig(metrics_listen="x").validate()
