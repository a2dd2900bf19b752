"""Who may import whom (docs/architecture.md, "Layers"), checked on the source's imports."""

from __future__ import annotations

import ast
import subprocess
import sys
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


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _files(pkg: str) -> list[Path]:
    return sorted(p for p in (ROOT / pkg).rglob("*.py") if "/v1/" not in str(p))


@pytest.mark.parametrize("path", _files("membership"), ids=lambda p: str(p.relative_to(ROOT)))
def test_layering_membership_never_imports_arbiter(path: Path) -> None:
    bad = {m for m in _imports(path) if m == "arbiter" or m.startswith("arbiter.")}
    assert not bad, f"{path} imports {bad}"


CORE = (
    _files("arbiter/core")
    + [ROOT / "arbiter" / "errors.py"]
    + [ROOT / "membership" / f for f in ("session.py", "view.py")]
)


@pytest.mark.parametrize("path", CORE, ids=lambda p: str(p.relative_to(ROOT)))
def test_layering_core_imports_no_io(path: Path) -> None:
    bad = {m for m in _imports(path) if m.split(".")[0] in CORE_FORBIDDEN}
    bad |= {m for m in _imports(path) if m.startswith("arbiter.server") or m == "membership.client"}
    assert not bad, f"{path} imports {bad}"


# Modules the pure side must not load, not even through a package __init__.
IO_MODULES = ("threading", "logging", "grpc", "asyncio", "psutil")
PURE_IMPORTS = [
    "arbiter.core.tally",
    "arbiter.core.replica",
    "membership.view",
    "membership.session",
    *sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in _files("arbiter/core")
    ),
]


def test_layering_importing_the_core_loads_no_io_module() -> None:
    # A fresh interpreter: this one has loaded everything already. Names the
    # module that pulled each offender in, via the first import that loads it.
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


MAX_LINES = 500


def _long_modules() -> dict[str, int]:
    lengths = {
        str(p.relative_to(ROOT)): len(p.read_text().splitlines())
        for p in _files("arbiter") + _files("membership")
    }
    return {path: n for path, n in sorted(lengths.items()) if n > MAX_LINES}


def test_layering_no_module_over_500_lines() -> None:
    # One concept per module; past about 400-500 lines, split by concept.
    assert not _long_modules(), f"modules over {MAX_LINES} lines: {_long_modules()}"


def test_layering_arbiter_errors_imports_nothing() -> None:
    # The core raises ArbiterError subclasses: the root must stay importable
    # from anywhere without pulling in a single other module.
    tree = ast.parse((ROOT / "arbiter" / "errors.py").read_text())
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert not imports, [ast.unparse(n) for n in imports]
