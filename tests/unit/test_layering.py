"""Who may import whom (docs/architecture.md, "Layers"), checked on the source's imports.

The rules:

1. Nothing in ``membership/`` imports ``arbiter``.
2. ``arbiter/`` takes from the client side only the shared layer:
   ``membership.shared`` and the generated ``membership.v1`` (``arbiter/__main__.py``,
   the ``python -m arbiter`` front door, runs the ``membership`` command and
   is the one exception). ``membership.shared`` itself imports nothing of the
   SDK, so importing any arbiter module, in a fresh interpreter, loads no
   module of the SDK's client, node agent or command line.
3. The sans-I/O cores import no I/O, and importing them loads none.
4. No import circle anywhere: every import counts, also one made inside a
   function or under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE_FORBIDDEN = {
    "time",
    "asyncio",
    "grpc",
    "random",
    "socket",
    "logging",
    "threading",
    "subprocess",
    "os",
    "tenacity",
    "sqlite3",
    "datetime",
}
# The client-side modules an arbiter module may import (rule 2).
SHARED = ("membership.shared", "membership.v1")


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _files(pkg: str) -> list[Path]:
    return sorted(p for p in (ROOT / pkg).rglob("*.py") if "v1" not in p.parts)


def _imported(path: Path) -> Iterator[tuple[str, tuple[str, ...]]]:
    """Every import of ``path``, anywhere in the file: (module, names taken from it).

    ``import a.b`` is ``("a.b", ())``; ``from a import b, c`` is ``("a", ("b", "c"))``,
    relative imports made absolute.
    """
    me = _module(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, ()
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            yield base, tuple(a.name for a in node.names)


def _imports(path: Path) -> set[str]:
    """The module names ``path`` imports, and ``module.name`` for each name taken
    (which may be a submodule)."""
    names: set[str] = set()
    for module, taken in _imported(path):
        names.add(module)
        names |= {f"{module}.{t}" for t in taken}
    return names


def _within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


@pytest.mark.parametrize("path", _files("membership"), ids=lambda p: str(p.relative_to(ROOT)))
def test_layering_membership_never_imports_arbiter(path: Path) -> None:
    bad = {m for m in _imports(path) if _within(m, ("arbiter",))}
    assert not bad, f"{path} imports {bad}"


def _sdk_imports(path: Path) -> set[str]:
    """The modules of ``membership`` outside the shared layer that ``path`` imports."""
    names = {m for m in _imports(path) if _within(m, ("membership",))}
    # ``from membership.shared import errors`` also names the bare package path.
    return {m for m in names if m != "membership" and not _within(m, SHARED)}


FRONT_DOOR = ROOT / "arbiter" / "__main__.py"


@pytest.mark.parametrize(
    "path",
    [p for p in _files("arbiter") if p != FRONT_DOOR],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_layering_arbiter_imports_only_the_shared_layer(path: Path) -> None:
    bad = _sdk_imports(path)
    assert not bad, f"{path} imports {bad}: the server takes only {SHARED} from the client side"


@pytest.mark.parametrize(
    "path", _files("membership/shared"), ids=lambda p: str(p.relative_to(ROOT))
)
def test_layering_the_shared_layer_imports_nothing_of_the_sdk(path: Path) -> None:
    bad = _sdk_imports(path)
    assert not bad, f"{path} imports {bad}"


def test_layering_importing_every_arbiter_module_loads_no_sdk_module() -> None:
    # A fresh interpreter: this one has loaded everything already.
    modules = [_module(p) for p in _files("arbiter") if p.name != "__main__.py"]
    code = (
        "import importlib, sys\n"
        f"shared = {SHARED!r}\n"
        "for name in sys.argv[1:]:\n"
        "    importlib.import_module(name)\n"
        "sdk = sorted(m for m in sys.modules if m.startswith('membership.')\n"
        "             and not any(m == s or m.startswith(s + '.') for s in shared))\n"
        "print(' '.join(sdk))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *modules],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"importing arbiter loads {out.stdout.strip()}"


CORE = (
    _files("arbiter/core")
    + [ROOT / "arbiter" / "errors.py"]
    + [
        ROOT / "membership" / f
        for f in (
            "_node/session.py",
            "_node/linkrules.py",
            "_watch/feed.py",
            "_arbiters/arbiterset.py",
            "_arbiters/identity.py",
            "shared/view.py",
            "shared/errors.py",
        )
    ]
)


@pytest.mark.parametrize("path", CORE, ids=lambda p: str(p.relative_to(ROOT)))
def test_layering_core_imports_no_io(path: Path) -> None:
    bad = {m for m in _imports(path) if m.split(".")[0] in CORE_FORBIDDEN}
    bad |= {m for m in _imports(path) if _within(m, ("arbiter.server", "membership._client"))}
    assert not bad, f"{path} imports {bad}"


# Modules the pure side must not load, not even through a package __init__.
IO_MODULES = ("threading", "logging", "grpc", "asyncio", "psutil")
PURE_IMPORTS = sorted({_module(p) for p in CORE} | {"membership.shared"})


def test_layering_importing_the_core_loads_no_io_module() -> None:
    # A fresh interpreter. Names the module that pulled each offender in, via
    # the first import that loads it.
    code = (
        "import importlib, sys\n"
        f"bad = {IO_MODULES!r}\n"
        "for name in sys.argv[1:]:\n"
        "    importlib.import_module(name)\n"
        "    loaded = [m for m in bad if m in sys.modules]\n"
        "    if loaded:\n"
        "        print(name, 'loads', ' '.join(loaded))\n"
        "        break\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *PURE_IMPORTS],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "", out.stdout


def _graph() -> dict[str, set[str]]:
    """Module -> the modules of this tree it imports (rule 4's arrows)."""
    files = {_module(p): p for p in _files("membership") + _files("arbiter")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        targets: set[str] = set()
        for module, taken in _imported(path):
            # ``from pkg import x`` imports the module pkg.x when there is one,
            # else takes x from pkg. (Either runs pkg's __init__.py first: that
            # is no arrow of its own, or every package would be a circle.)
            for target in [f"{module}.{t}" for t in taken] or [module]:
                if target not in files:
                    target = module
                if target in files and target != name:
                    targets.add(target)
        graph[name] = targets
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, 1972)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_layering_no_import_circle() -> None:
    assert _circles(_graph()) == []


def test_layering_circles_are_found() -> None:
    # The check above could pass by finding nothing: a circle drawn by hand is found.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]


def test_layering_arbiter_errors_imports_nothing() -> None:
    # The core raises ArbiterError subclasses: the root must stay importable
    # from anywhere without pulling in a single other module.
    tree = ast.parse((ROOT / "arbiter" / "errors.py").read_text())
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert not imports, [ast.unparse(n) for n in imports]
