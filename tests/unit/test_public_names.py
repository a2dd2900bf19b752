"""The public surface of ``membership``: every name in ``__all__`` imports, lazily."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import membership

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", membership.__all__)
def test_public_names_each_imports_from_membership(name: str) -> None:
    ns: dict[str, object] = {}
    exec(f"from membership import {name}", ns)
    value = ns[name]
    assert value is getattr(membership, name)
    if isinstance(value, type):  # classes, not the event unions
        assert value.__module__.startswith("membership."), value
        assert getattr(sys.modules[value.__module__], name) is value


def test_public_names_all_is_sorted_and_unique() -> None:
    assert list(membership.__all__) == sorted(set(membership.__all__))


def test_public_names_star_import_gives_every_name_in_a_fresh_interpreter() -> None:
    code = (
        "ns = {}\n"
        "exec('from membership import *', ns)\n"
        "import membership\n"
        "print(sorted(set(membership.__all__) - set(ns)))\n"
        "print(sorted(set(membership.__all__) - set(dir(membership))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "[]"], out.stdout


def test_public_names_unknown_name_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        membership.NoSuchName  # noqa: B018
    with pytest.raises(ImportError):
        exec("from membership import NoSuchName", {})
