"""The public surfaces: every name in a package's ``__all__`` imports, lazily."""

from __future__ import annotations

import importlib
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


ARBITER_PACKAGES = ["arbiter", "arbiter.core", "arbiter.core.detection", "arbiter.server"]


@pytest.mark.parametrize("package", ARBITER_PACKAGES)
def test_public_names_arbiter_packages_export_their_all(package: str) -> None:
    module = importlib.import_module(package)
    assert module.__doc__, package
    assert list(module.__all__) == sorted(set(module.__all__)), package
    ns: dict[str, object] = {}
    exec(f"from {package} import *", ns)
    for name in module.__all__:
        assert ns[name] is getattr(module, name), (package, name)
        assert name in dir(module), (package, name)
        assert ns[name].__module__.startswith("arbiter."), (package, name)  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        module.NoSuchName  # noqa: B018


def test_public_names_arbiter_packages_load_no_grpc_until_a_server_is_asked_for() -> None:
    code = (
        "import sys\n"
        "import arbiter, arbiter.core, arbiter.server\n"
        "print('grpc' in sys.modules, 'asyncio' in sys.modules)\n"
        "from arbiter import ArbiterServer\n"
        "print('grpc' in sys.modules, ArbiterServer.__module__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["False False", "True arbiter.server.app"], out.stdout


# Old module paths of the SDK before it was split into packages (membership._MOVED).
OLD_PATHS = sorted(membership._MOVED.items())


@pytest.mark.parametrize(("old", "new"), OLD_PATHS, ids=[old for old, _ in OLD_PATHS])
def test_public_names_old_module_path_is_the_moved_module_with_a_warning(
    old: str, new: str
) -> None:
    code = (
        "import importlib, sys, warnings\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        f"    old = importlib.import_module({old!r})\n"
        f"new = importlib.import_module({new!r})\n"
        "print(old is new, new.__spec__.name, new.__name__)\n"
        "print([str(w.message) for w in caught if w.category is DeprecationWarning])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert out.returncode == 0, out.stderr
    same, warned = out.stdout.splitlines()
    assert same == f"True {new} {new}"
    assert f"{old} has moved to {new}" in warned


def test_public_names_old_paths_give_the_public_objects() -> None:
    from membership.admin import remove_node  # type: ignore[import-not-found]
    from membership.view import JobRanks, View  # type: ignore[import-not-found]

    assert View is membership.View
    assert JobRanks is membership.JobRanks
    assert callable(remove_node)


def test_public_names_a_path_that_never_existed_is_still_not_found() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("membership.no_such_module")
