"""``membership ... --check-config``: every flag validated, nothing connected, the settings
that matter printed; the command line's exit codes, global flags and ``--version``."""

from __future__ import annotations

import re
from pathlib import Path

import grpc
import pytest

from membership.cli import main
from membership.testing.pki import CertificateAuthority, identity_uri

ARBITERS = "a1:7000,a2:7000,a3:7000"


@pytest.fixture(autouse=True)
def no_channels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails the test if a command opens a channel: --check-config must not connect."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"--check-config opened a channel to {args[:1]}")

    monkeypatch.setattr(grpc.aio, "insecure_channel", refuse)


@pytest.mark.parametrize(
    ("argv", "first_line", "settings"),
    [
        (
            [
                *("node", "--id", "n1", "--arbiters", ARBITERS),
                *("--label", "rack=r1", "--label", "gpu=a100"),
                *("--no-status-probes", "--incarnation", "5"),
            ],
            "node n1: configuration OK",
            [
                f"arbiters = {ARBITERS}",
                "labels = rack=r1,gpu=a100",
                "incarnation = 5",
                "collect_status = False",
                "auto_rejoin = True",
            ],
        ),
        (
            ["node", "--id", "n1", "--arbiters", ARBITERS, "--no-rejoin"],
            "node n1: configuration OK",
            ["labels = ", "auto_rejoin = False", "leave_timeout = 5.0"],
        ),
        (
            ["watch", "--arbiters", ARBITERS, "--json", "--since-epoch", "7"],
            "watch: configuration OK",
            [f"arbiters = {ARBITERS}", "json = True", "since_epoch = 7"],
        ),
        (
            ["view", "--arbiters", "127.0.0.1:7000", "--timeout", "2"],
            "view: configuration OK",
            ["arbiters = 127.0.0.1:7000", "timeout = 2.0", "json = False"],
        ),
    ],
)
def test_cli_check_config_valid_flags_print_ok_and_exit_zero(
    argv: list[str], first_line: str, settings: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--check-config"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == first_line
    for line in settings:
        assert f"  {line}" in out, (line, out)


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["node", "--id", "bad id", "--arbiters", ARBITERS], "node_id"),
        (["node", "--id", "n1", "--arbiters", ARBITERS, "--label", "/x=1"], "label key"),
        (["node", "--id", "n1", "--arbiters", ARBITERS, "--label", "k=\x01"], "non-printable"),
        (["node", "--id", "n1", "--arbiters", ARBITERS, "--incarnation", "0"], "incarnation"),
    ],
)
def test_cli_check_config_invalid_value_one_line_error_exit_two(
    argv: list[str], expect: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--check-config"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"membership {argv[0]}: error: ")
    assert expect in lines[0]


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["node", "--id", "n1", "--arbiters", "a1"], "not host:port"),
        (["node", "--id", "n1", "--arbiters", ARBITERS, "--label", "novalue"], "key=value"),
        (["watch", "--arbiters", "a1:0"], "valid port"),
        (["watch", "--arbiters", ARBITERS, "--since-epoch", "-1"], ">= 0"),
        (["view", "--arbiters", ARBITERS, "--timeout", "inf"], "finite number"),
        (["node", "--id", "n1", "--arbiters", "a1:7000,a1:7000"], "listed twice"),
        (["watch", "--arbiters", "a1:7000,a1:7000"], "listed twice"),
        (["view", "--arbiters", "a1:7000,a1:7000"], "listed twice"),
    ],
)
def test_cli_check_config_malformed_flag_is_a_usage_error(
    argv: list[str], expect: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--check-config"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert expect in err.strip().splitlines()[-1]
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"membership {argv[0]}: error: "), err


# Settings only a node has (heartbeats, leases, status probes, rejoin).
NODE_ONLY = ("ack_timeout", "heartbeat_interval", "auto_rejoin", "collect_status", "labels")
# Settings only a subscriber has.
WATCH_ONLY = ("stream_idle_timeout", "failover_probe_interval", "since_epoch")


def _settings(capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    out = capsys.readouterr().out.splitlines()
    pairs = (line.lstrip(" ").partition(" = ") for line in out[1:])
    return {name: value for name, _, value in pairs}


@pytest.mark.parametrize(
    ("argv", "absent"),
    [
        (["watch", "--arbiters", ARBITERS], NODE_ONLY),
        (["view", "--arbiters", ARBITERS], NODE_ONLY + WATCH_ONLY + ("keepalive_time",)),
        (["node", "--id", "n1", "--arbiters", ARBITERS], WATCH_ONLY),
    ],
)
def test_cli_check_config_prints_only_the_settings_of_its_command(
    argv: list[str], absent: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--check-config"]) == 0
    settings = _settings(capsys)
    assert settings["arbiters"] == ("a1:7000,a2:7000,a3:7000")
    assert not set(absent) & set(settings), settings


PEERS = "a1=127.0.0.1:7001,a2=127.0.0.1:7002,a3=127.0.0.1:7003"


def _arbiter(*argv: str) -> list[str]:
    return ["arbiter", "--id", "a1", "--data-dir", "/nonexistent/a1", *argv, "--check-config"]


def test_cli_arbiter_check_config_prints_id_listen_peers_identity_data_dir(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from arbiter.server.consensus.storage import cluster_identity
    from arbiter.server.net.addresses import parse_peers

    assert main(_arbiter("--listen", "127.0.0.1:7001", "--peers", PEERS)) == 0
    settings = _settings(capsys)
    assert settings["id"] == "a1"
    assert settings["listen"] == "127.0.0.1:7001"
    assert settings["peers"] == PEERS
    assert settings["cluster_identity"] == cluster_identity("default", parse_peers(PEERS))
    assert settings["data_dir"] == "/nonexistent/a1"
    assert settings["election_timeout"] == "1.0"  # and the configuration's fields


@pytest.mark.parametrize(
    ("listen", "peers"),
    [
        # docker-compose.yml: every interface, peers by service name (not resolvable here).
        ("0.0.0.0:7000", "a1=a1:7000,a2=a2:7000,a3=a3:7000"),
        ("[::]:7000", "a1=a1:7000,a2=a2:7000,a3=a3:7000"),
        # Two names of one address of this machine.
        ("127.0.0.1:7001", "a1=localhost:7001,a2=127.0.0.1:7002"),
        ("LOCALHOST:7001", "a1=localhost:7001,a2=127.0.0.1:7002"),
    ],
)
def test_cli_arbiter_check_config_accepts_listen_that_is_its_own_peer_address(
    listen: str, peers: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_arbiter("--listen", listen, "--peers", peers)) == 0, capsys.readouterr().err


@pytest.mark.parametrize(
    ("listen", "peers", "expect"),
    [
        ("127.0.0.1:7001", "a1=127.0.0.1:7002,a2=127.0.0.1:7003", "the ports differ"),
        ("0.0.0.0:7000", "a1=a1:7001,a2=a2:7000", "the ports differ"),
        ("127.0.0.2:7001", "a1=127.0.0.1:7001,a2=127.0.0.1:7002", "different addresses"),
        ("127.0.0.1:7001", "a1=no-such-host.invalid:7001,a2=x:1", "cannot resolve"),
        ("127.0.0.1:7001", "a1=127.0.0.1:7001,a2=127.0.0.1:7001", "to a1 and a2"),
        ("127.0.0.1:7001", "a1=127.0.0.1:7001,a2=Host:1,a3=host:1", "to a2 and a3"),
    ],
)
def test_cli_arbiter_check_config_refuses_listen_peers_mismatch_and_duplicates(
    listen: str, peers: str, expect: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_arbiter("--listen", listen, "--peers", peers)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.strip().splitlines()
    assert line.startswith("membership arbiter: error: ") and expect in line, line


def test_cli_arbiter_data_dir_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["arbiter", "--id", "a1", "--listen", "127.0.0.1:7001", "--peers", PEERS])
    assert exc.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == "membership arbiter: error: the following arguments are required: --data-dir"


def test_cli_version_before_and_after_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    import membership

    assert membership.__version__ and membership.__version__ != "0+unknown"
    for argv in (["--version"], ["view", "--version"], ["arbiter", "--version"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 0
        assert capsys.readouterr().out == f"membership {membership.__version__}\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["--log-level", "debug", "view", "--arbiters", ARBITERS],
        ["view", "--log-level", "debug", "--arbiters", ARBITERS],
        ["view", "--arbiters", ARBITERS, "--log-level", "debug"],
    ],
)
def test_cli_global_flags_before_or_after_the_command(argv: list[str]) -> None:
    from membership.cli import build_parser

    args = build_parser().parse_args(argv)
    assert args.command == "view" and args.log_level == "debug"


def test_cli_global_flag_before_the_command_survives_the_command_parser() -> None:
    from membership.cli import build_parser

    args = build_parser().parse_args(["--log-level", "error", "watch", "--arbiters", ARBITERS])
    assert args.log_level == "error"
    assert build_parser().parse_args(["watch", "--arbiters", ARBITERS]).log_level is None


def test_cli_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for code in ("  0 ", "  1 ", "  2 ", "  3 ", "128+N"):
        assert code in out, out


# --- MEMBERSHIP_ARBITERS (membership/cli/endpoints.py): the flag wins, the variable
# fills in, and an error caused by the variable names it ---------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["node", "--id", "n1", "--check-config"],
        ["watch", "--check-config"],
        ["view", "--check-config"],
    ],
)
def test_cli_endpoints_come_from_membership_arbiters_when_the_flag_is_absent(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MEMBERSHIP_ARBITERS", ARBITERS)
    assert main(argv) == 0
    assert f"arbiters = {ARBITERS}" in capsys.readouterr().out


def test_cli_endpoints_flag_wins_over_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MEMBERSHIP_ARBITERS", "not an address")  # never read
    assert main(["view", "--arbiters", "127.0.0.1:7000", "--check-config"]) == 0
    assert "arbiters = 127.0.0.1:7000" in capsys.readouterr().out


def test_cli_endpoints_missing_or_malformed_is_a_usage_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("MEMBERSHIP_ARBITERS", raising=False)
    with pytest.raises(SystemExit) as e:
        main(["view", "--check-config"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--arbiters (or set MEMBERSHIP_ARBITERS)" in err
    monkeypatch.setenv("MEMBERSHIP_ARBITERS", "a1:notaport")
    for argv in (["view"], ["admin", "status"], ["admin", "arbiters", "list"], ["top", "--once"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2, argv
        assert "MEMBERSHIP_ARBITERS='a1:notaport'" in err and "argument --arbiters" not in err, err


@pytest.mark.parametrize(
    ("argv", "flag", "meant"),
    [
        (["node", "--id", "n1", "--arbitres", "127.0.0.1:7000"], "--arbitres", "--arbiters"),
        (["watch", "--arbiters", "127.0.0.1:7000", "--sinse-epoch", "3"], "--sinse-epoch",
         "--since-epoch"),
    ],
)  # fmt: skip
def test_cli_a_misspelt_flag_is_named_with_the_flag_meant(
    argv: list[str], flag: str, meant: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    # Issue 25, item 6: not "--arbiters is required" while the user typed --arbitres.
    monkeypatch.delenv("MEMBERSHIP_ARBITERS", raising=False)
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert f"unrecognized arguments: {flag}" in err and f"did you mean {meant}?" in err, err
    assert "required" not in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "prog"),
    [
        (["admin", "status", "--arbiters", "127.0.0.1:7000", "--bogus"], "membership admin status"),
        (["admin", "arbiters", "list", "--bogus"], "membership admin arbiters list"),
        (["node", "--id", "n1", "--arbiters", "127.0.0.1:7000", "--bogus"], "membership node"),
    ],
)  # fmt: skip
def test_cli_an_unknown_flag_is_reported_by_its_sub_command(
    argv: list[str], prog: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A fresh user's trial: argparse reports unknown flags from the top ("membership:").
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err.startswith(f"{prog}: error: unrecognized arguments: --bogus"), err


def test_cli_a_misspelt_flag_is_named_even_when_a_required_one_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `node --arbitres X` without --id: the missing --id and the flag meant, in one line.
    monkeypatch.delenv("MEMBERSHIP_ARBITERS", raising=False)
    with pytest.raises(SystemExit) as e:
        main(["node", "--arbitres", "127.0.0.1:7000"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert "required: --id" in err and "unknown --arbitres" in err, err
    assert "did you mean --arbiters?" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("where", ["flag", "variable"])
def test_cli_endpoints_an_empty_address_in_the_list_is_an_error(
    where: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A fresh user's trial: MEMBERSHIP_ARBITERS='a:1,,' was taken silently as one arbiter.
    argv = ["view", "--check-config"]
    if where == "flag":
        argv += ["--arbiters", "127.0.0.1:7000,"]
    else:
        monkeypatch.setenv("MEMBERSHIP_ARBITERS", "127.0.0.1:7000,,")
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "an empty address in the list" in err, err
    named = "argument --arbiters" if where == "flag" else "MEMBERSHIP_ARBITERS='127.0.0.1:7000,,'"
    assert named in err, err


@pytest.mark.parametrize(
    ("argv", "prog", "meant"),
    [(["wathc"], "membership", "watch"), (["admin", "stauts"], "membership admin", "status")],
)
def test_cli_a_misspelt_command_gets_the_command_meant(
    argv: list[str], prog: str, meant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"{prog}: error: argument"), err
    assert err.rstrip().endswith(f"(did you mean {meant}?)"), err


@pytest.mark.parametrize(
    "argv",
    [
        ["view", "--arbiters", ARBITERS],
        ["admin", "status", "--arbiters", ARBITERS],
        ["admin", "arbiters", "list", "--arbiters", ARBITERS],
    ],
)
def test_cli_a_tls_file_from_the_environment_is_named_by_its_variable(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    # A fresh user's trial: MEMBERSHIP_TLS_KEY of another certificate, with --tls-cert,
    # was reported as "--tls-key ... is not the key of --tls-cert ...".
    ca = CertificateAuthority.create("default")
    mine = ca.issue([identity_uri("default", "admin", "admin")])
    other = ca.issue([identity_uri("default", "observer", "w")])
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem())
    (tmp_path / "admin.pem").write_bytes(mine.cert_pem)
    (tmp_path / "w-key.pem").write_bytes(other.key_pem)
    monkeypatch.setenv("MEMBERSHIP_TLS_CA", str(tmp_path / "ca.pem"))
    monkeypatch.setenv("MEMBERSHIP_TLS_KEY", str(tmp_path / "w-key.pem"))
    assert main([*argv, "--tls-cert", str(tmp_path / "admin.pem")]) == 2
    err = capsys.readouterr().err
    prog = "membership " + " ".join(w for w in argv if not w.startswith("-") and w != ARBITERS)
    assert err.startswith(
        f"{prog}: error: MEMBERSHIP_TLS_KEY={tmp_path / 'w-key.pem'} is not the key of "
        f"--tls-cert {tmp_path / 'admin.pem'} "
    ), err
    assert err.count("\n") == 1 and "Traceback" not in err


def _exit_rows(text: str) -> dict[str, str]:
    """Exit code -> its text, from --help's table (``  2        usage: ...``) or the
    Markdown table of docs/using.md (``| 2 | usage: ... |``)."""
    rows: dict[str, str] = {}
    code = None
    for line in text.splitlines():
        md = re.match(r"\| (\d+|128 \+ N) \| (.*) \|$", line)
        cli = re.match(r"  (\d+|128\+N)\s{2,}(.*)$", line)
        if md or cli:
            m = md or cli
            assert m is not None
            code = m.group(1).replace(" ", "")
            rows[code] = m.group(2)
        elif code is not None and re.match(r"\s{11}\S", line):
            rows[code] += " " + line.strip()
        else:
            code = None
    return rows


def test_cli_help_and_docs_give_one_table_of_exit_codes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A fresh user's trial: --help and docs/using.md told exit 0 and 1 differently (SIGHUP).
    with pytest.raises(SystemExit):
        main(["--help"])
    helped = _exit_rows(capsys.readouterr().out.split("exit status", 1)[1])
    docs = _exit_rows((Path(__file__).parents[2] / "docs" / "using.md").read_text())
    assert set(helped) == set(docs) == {"0", "1", "2", "3", "128+N"}, (helped, docs)
    facts = {
        "0": ["SIGINT", "SIGTERM", "SIGHUP", "stopped before joining", "reload the TLS files"],
        "1": ["--connect-timeout", "--metrics-listen", "not committed", "--restore", "FILE"],
        "2": ["PERMISSION_DENIED", "--insecure", "two different clusters"],
        "3": ["--no-rejoin", "LEFT", "admin remove"],
        "128+N": ["130", "143", "second"],
    }
    for code, words in facts.items():
        for word in words:
            assert word in helped[code] and word in docs[code], (code, word)


def test_cli_endpoints_a_duplicate_in_the_variable_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # helper-11's trial: "arbiter address listed twice" did not say where it came from.
    monkeypatch.setenv("MEMBERSHIP_ARBITERS", "127.0.0.1:7000,127.0.0.1:7000")
    with pytest.raises(SystemExit) as e:
        main(["view", "--check-config"])
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert "MEMBERSHIP_ARBITERS='127.0.0.1:7000,127.0.0.1:7000'" in err and "listed twice" in err


def test_cli_arbiter_certificate_of_the_environment_is_named_by_its_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # helper-11's trial: the replica's identity check said --tls-cert for MEMBERSHIP_TLS_CERT.
    ca = CertificateAuthority.create("default")
    node = ca.issue([identity_uri("default", "node", "n1")])
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem())
    (tmp_path / "n1.pem").write_bytes(node.cert_pem)
    (tmp_path / "n1-key.pem").write_bytes(node.key_pem)
    for var, name in (("CA", "ca.pem"), ("CERT", "n1.pem"), ("KEY", "n1-key.pem")):
        monkeypatch.setenv(f"MEMBERSHIP_TLS_{var}", str(tmp_path / name))
    monkeypatch.delenv("MEMBERSHIP_INSECURE", raising=False)
    argv = ["arbiter", "--id", "a1", "--listen", "127.0.0.1:7000", "--peers",
            "a1=127.0.0.1:7000", "--data-dir", str(tmp_path / "d"), "--check-config"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"MEMBERSHIP_TLS_CERT={tmp_path / 'n1.pem'} names spiffe://default/node/n1" in err, err
