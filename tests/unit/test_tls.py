"""membership.shared.tls and membership.shared.grants: files checked, flags and
environment resolved, identities parsed from certificates and matched against what a call asks."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import pytest
from cryptography import x509

from membership.shared.errors import InvalidArgument
from membership.shared.grants import Grant, Identity, identity_of_pem, parse_identity
from membership.shared.tls import TLSFiles, handshake_hint, join_reasons, load, resolve
from membership.testing.pki import CertificateAuthority, identity_uri


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return CertificateAuthority.create("c1")


def _files(tmp: Path, name: str, cert: bytes, key: bytes, ca_pem: bytes) -> TLSFiles:
    files = TLSFiles(tmp / "ca.pem", tmp / f"{name}.pem", tmp / f"{name}-key.pem")
    files.ca.write_bytes(ca_pem)
    files.cert.write_bytes(cert)
    files.key.write_bytes(key)
    return files


def _identity(ca: CertificateAuthority, *uris: str) -> Identity:

    return parse_identity(x509.load_pem_x509_certificate(ca.issue(list(uris)).cert_pem))


# --- grants ----------------------------------------------------------------------------------


def test_grants_node_exact_and_prefix_pattern() -> None:
    assert Grant("c1", "node", "n1").covers_node("n1")
    assert not Grant("c1", "node", "n1").covers_node("n10")
    assert Grant("c1", "node", "host7-*").covers_node("host7-gpu3")
    assert Grant("c1", "node", "host7-*").covers_node("host7-")
    assert not Grant("c1", "node", "host7-*").covers_node("host70")
    assert not Grant("c1", "admin", "n1").covers_node("n1")


def test_grants_rights_per_role_only_in_the_certificates_cluster(
    ca: CertificateAuthority,
) -> None:
    node = _identity(ca, identity_uri("c1", "node", "n1"))
    arbiter = _identity(ca, identity_uri("c1", "arbiter", "a1"))
    admin = _identity(ca, identity_uri("c1", "admin", "ops"))
    observer = _identity(ca, identity_uri("c1", "observer", "w"))
    other = _identity(ca, identity_uri("c2", "node", "n1"))
    table = {
        # identity: (read, node n1, replica a1, admin)
        "node": (node, (True, True, False, False)),
        "arbiter": (arbiter, (True, False, True, False)),
        "admin": (admin, (True, False, False, True)),
        "observer": (observer, (True, False, False, False)),
        "other cluster": (other, (False, False, False, False)),
    }
    for what, (ident, expected) in table.items():
        got = (
            ident.may_read("c1"),
            ident.may_node("c1", "n1"),
            ident.may_replica("c1", "a1"),
            ident.may_admin("c1"),
        )
        assert got == expected, what
    assert other.may_node("c2", "n1")
    assert "of cluster c2" in other.rights("c1")
    # a refusal says what the certificate may do: an observer reads status and the list too
    assert observer.rights("c1") == "read the view, the replicas' status and the arbiter list"
    assert node.rights("c1") == "heartbeat and leave as node n1; read the view"


def test_grants_several_uris_are_a_union_and_odd_uris_grant_nothing(
    ca: CertificateAuthority,
) -> None:
    both = _identity(ca, identity_uri("c1", "node", "n1"), identity_uri("c1", "admin", "ops"))
    assert both.may_node("c1", "n1") and both.may_admin("c1")
    odd = _identity(
        ca,
        "spiffe://c1/arbiter/a*",  # only node grants may be patterns
        "spiffe://c1/root/x",
        "https://c1/node/n1",
        "spiffe://c1/node/a/b",
    )
    assert odd.grants == ()
    assert not odd.may_read("c1")


def test_grants_identity_is_parsed_once_per_certificate(ca: CertificateAuthority) -> None:
    pem = ca.issue([identity_uri("c1", "node", "n1")]).cert_pem
    first = identity_of_pem(pem)
    assert identity_of_pem(pem) is first
    assert first.grants == (Grant("c1", "node", "n1"),)


# --- files -----------------------------------------------------------------------------------


def test_tls_load_accepts_a_matching_set_and_reads_its_identity(
    ca: CertificateAuthority, tmp_path: Path
) -> None:
    issued = ca.issue_arbiter("c1", "a1")
    loaded = load(_files(tmp_path, "a1", issued.cert_pem, issued.key_pem, ca.cert_pem()))
    assert loaded.server and loaded.identity.may_replica("c1", "a1")
    assert loaded.identity.serial == issued.serial
    client = ca.issue([identity_uri("c1", "node", "n1")])
    assert not load(_files(tmp_path, "n1", client.cert_pem, client.key_pem, ca.cert_pem())).server


def test_tls_load_names_what_is_wrong(ca: CertificateAuthority, tmp_path: Path) -> None:
    good = ca.issue([identity_uri("c1", "node", "n1")])
    other = ca.issue([identity_uri("c1", "node", "n2")])
    foreign = CertificateAuthority.create("c1")
    long_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=30)
    old = ca.issue([identity_uri("c1", "node", "n1")], not_before=long_ago, days=1)
    files = _files(tmp_path, "n1", good.cert_pem, good.key_pem, ca.cert_pem())
    cases = {
        "no such file": TLSFiles(files.ca, files.cert, tmp_path / "missing.pem"),
        "is a folder": TLSFiles(tmp_path, files.cert, files.key),
    }
    for expect, bad in cases.items():
        with pytest.raises(InvalidArgument, match=expect):
            load(bad)
    (tmp_path / "junk.pem").write_text("junk\n")
    with pytest.raises(InvalidArgument, match=r"--tls-cert .*not PEM"):
        load(TLSFiles(files.ca, tmp_path / "junk.pem", files.key))
    (tmp_path / "other-key.pem").write_bytes(other.key_pem)
    with pytest.raises(InvalidArgument, match="is not the key of"):
        load(TLSFiles(files.ca, files.cert, tmp_path / "other-key.pem"))
    (tmp_path / "foreign.pem").write_bytes(foreign.cert_pem())
    with pytest.raises(InvalidArgument, match="not signed by the CA") as refused:
        load(TLSFiles(tmp_path / "foreign.pem", files.cert, files.key))
    # two CAs of one name (two `certs init` of one cluster): the key ids tell them apart
    ids = re.findall(r"key id ([0-9A-F:]{23})", str(refused.value))
    assert len(ids) == 2 and ids[0] != ids[1], refused.value
    assert "another CA of the same name" in str(refused.value)
    (tmp_path / "old").mkdir()
    old_files = _files(tmp_path / "old", "n1", old.cert_pem, old.key_pem, ca.cert_pem())
    with pytest.raises(InvalidArgument, match="not now"):
        load(old_files)
    with pytest.raises(InvalidArgument, match=r"--tls-key .*not a PEM private key"):
        load(TLSFiles(files.ca, files.cert, files.cert))


# --- flags and environment -----------------------------------------------------------------------


def test_tls_resolve_flags_win_over_the_environment() -> None:
    env = {"MEMBERSHIP_INSECURE": "1"}
    files = resolve(ca="ca.pem", cert="n1.pem", key="n1-key.pem", env=env)
    assert files == TLSFiles(Path("ca.pem"), Path("n1.pem"), Path("n1-key.pem"))
    tls_env = {
        "MEMBERSHIP_TLS_CA": "/c/ca.pem",
        "MEMBERSHIP_TLS_CERT": "/c/n1.pem",
        "MEMBERSHIP_TLS_KEY": "/c/n1-key.pem",
    }
    assert resolve(insecure=True, env=tls_env) is None
    assert resolve(env=tls_env) == TLSFiles(
        Path("/c/ca.pem"), Path("/c/n1.pem"), Path("/c/n1-key.pem")
    )
    assert resolve(env=env) is None
    assert resolve(env={"MEMBERSHIP_INSECURE": "true"}) is None


@pytest.mark.parametrize(
    ("kwargs", "env", "expect"),
    [
        ({}, {}, "no TLS settings"),
        ({}, {"MEMBERSHIP_INSECURE": "0"}, "no TLS settings"),
        ({"ca": "ca.pem", "insecure": True}, {}, "choose one"),
        ({}, {"MEMBERSHIP_INSECURE": "1", "MEMBERSHIP_TLS_CA": "ca.pem"}, "choose one"),
        ({"ca": "ca.pem", "cert": "n1.pem"}, {}, r"--tls-key missing \(or MEMBERSHIP_TLS_KEY\)"),
        (
            {},
            {"MEMBERSHIP_TLS_CERT": "n1.pem"},
            r"MEMBERSHIP_TLS_CA, MEMBERSHIP_TLS_KEY missing \(or --tls-ca, --tls-key\): .*"
            r"given: MEMBERSHIP_TLS_CERT$",
        ),
        (
            {"ca": "ca.pem"},
            {"MEMBERSHIP_TLS_CERT": "n1.pem"},
            r"--tls-key missing \(or MEMBERSHIP_TLS_KEY\).*given: --tls-ca, MEMBERSHIP_TLS_CERT$",
        ),
        ({}, {"MEMBERSHIP_INSECURE": "banana"}, r"MEMBERSHIP_INSECURE='banana' is not a boolean"),
    ],
)
def test_tls_resolve_refuses_neither_both_or_part(
    kwargs: dict[str, object], env: dict[str, str], expect: str
) -> None:
    with pytest.raises(InvalidArgument, match=expect):
        resolve(env=env, **kwargs)  # type: ignore[arg-type]


def test_tls_resolve_combines_flags_and_environment_item_by_item() -> None:
    env = {"MEMBERSHIP_TLS_CA": "/c/ca.pem", "MEMBERSHIP_TLS_CERT": "/c/n1.pem",
           "MEMBERSHIP_TLS_KEY": "/c/n1-key.pem"}  # fmt: skip
    # one flag given: the other two still come from the environment
    assert resolve(cert="/d/n2.pem", key="/d/n2-key.pem", env=env) == TLSFiles(
        Path("/c/ca.pem"), Path("/d/n2.pem"), Path("/d/n2-key.pem")
    )
    # an explicit TLS file chooses TLS: MEMBERSHIP_INSECURE (even malformed) is not read
    assert resolve(ca="/d/ca.pem", env={**env, "MEMBERSHIP_INSECURE": "banana"}) == TLSFiles(
        Path("/d/ca.pem"), Path("/c/n1.pem"), Path("/c/n1-key.pem")
    )


def test_tls_resolve_names_what_the_user_gave() -> None:
    # a variable's mistake names the variable, not a flag nobody typed
    with pytest.raises(InvalidArgument) as e:
        resolve(env={"MEMBERSHIP_TLS_CA": "ca.pem", "MEMBERSHIP_INSECURE": "1"})
    assert "MEMBERSHIP_TLS_CA" in str(e.value) and "MEMBERSHIP_INSECURE" in str(e.value)
    assert "--tls" not in str(e.value) and "--insecure" not in str(e.value)
    # the SDK's settings are ClientConfig fields, with the environment variables
    with pytest.raises(InvalidArgument) as e:
        resolve(env={}, names="config")
    msg = str(e.value)
    assert "ClientConfig(tls_ca=" in msg and "MEMBERSHIP_TLS_CA" in msg and "--tls" not in msg
    with pytest.raises(
        InvalidArgument, match=r"ClientConfig\(tls_key=\) missing \(or MEMBERSHIP_TLS_KEY\)"
    ):
        resolve(ca="ca.pem", cert="n1.pem", env={}, names="config")


def test_tls_handshake_hint_says_what_grpcs_transport_errors_mean() -> None:
    # Issue 25, item 3: "Socket closed" to a plaintext client is a TLS port, and a
    # CERTIFICATE_VERIFY_FAILED is a CA that did not sign the arbiter's certificate.
    plain = "failed to connect to all addresses; last error: UNAVAILABLE: 1.2.3.4:7: Socket closed"
    assert "the arbiters may expect TLS" in handshake_hint(plain, insecure=True)
    # under TLS it is the arbiter refusing this client's certificate (another CA)
    assert "may not trust this client's certificate" in handshake_hint(plain, insecure=False)
    verify = "Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: CERTIFICATE_VERIFY_FAILED"
    assert "not signed by the CA" in handshake_hint(verify, insecure=False)
    assert handshake_hint(verify, insecure=True) == ""
    assert handshake_hint("Connection refused", insecure=True) == ""
    assert handshake_hint(None, insecure=False) == ""


def test_tls_join_reasons_says_a_hint_common_to_every_arbiter_once() -> None:
    hint = handshake_hint("Socket closed", insecure=True)
    same = {"a:1": "UNAVAILABLE Socket closed" + hint, "a:2": "UNAVAILABLE Socket closed" + hint}
    line = join_reasons(same)
    assert line.count("(the arbiters may expect TLS") == 1 and line.endswith(hint)
    assert line.startswith("a:1: UNAVAILABLE Socket closed; a:2: UNAVAILABLE Socket closed (")
    mixed = {"a:1": "UNAVAILABLE Socket closed" + hint, "a:2": "DEADLINE_EXCEEDED (deadline)"}
    assert join_reasons(mixed) == "; ".join(f"{a}: {r}" for a, r in mixed.items())
    assert join_reasons({}, "no arbiter tried") == "no arbiter tried"


def test_tls_load_names_each_file_as_the_user_gave_it(
    ca: CertificateAuthority, tmp_path: Path
) -> None:
    # A fresh user's trial: MEMBERSHIP_TLS_KEY of another certificate was reported as
    # "--tls-key ... is not the key of --tls-cert ...", a flag they never typed.
    good = ca.issue([identity_uri("c1", "node", "n1")])
    other = ca.issue([identity_uri("c1", "observer", "w")])
    files = _files(tmp_path, "n1", good.cert_pem, good.key_pem, ca.cert_pem())
    wrong_key = tmp_path / "w-key.pem"
    wrong_key.write_bytes(other.key_pem)
    env = {"MEMBERSHIP_TLS_CA": str(files.ca), "MEMBERSHIP_TLS_KEY": str(wrong_key)}
    mixed = resolve(cert=files.cert, env=env)
    assert mixed is not None
    with pytest.raises(InvalidArgument) as e:
        load(mixed)
    assert str(e.value).startswith(
        f"MEMBERSHIP_TLS_KEY={wrong_key} is not the key of --tls-cert {files.cert} "
    ), e.value
    sdk = resolve(ca=files.ca, cert=files.cert, key=wrong_key, env={}, names="config")
    assert sdk is not None
    with pytest.raises(InvalidArgument, match=r"^ClientConfig\(tls_key='.*w-key.pem'\) is not"):
        load(sdk)
    missing = resolve(cert=files.cert, key=files.key, env={"MEMBERSHIP_TLS_CA": "/no/ca.pem"})
    assert missing is not None
    with pytest.raises(InvalidArgument, match=r"^MEMBERSHIP_TLS_CA=/no/ca.pem: no such file$"):
        load(missing)
    # how a file was named takes no part in equality
    assert mixed == TLSFiles(files.ca, files.cert, wrong_key)
