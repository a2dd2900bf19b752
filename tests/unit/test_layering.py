"""Who may import whom (DESIGN.md section 4), checked on the source's import statements."""

from __future__ import annotations

import ast
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


def test_layering_importing_view_does_not_load_grpc() -> None:
    import subprocess
    import sys

    code = "import sys, arbiter.core.state, membership.view; print('grpc' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr


def test_layering_arbiter_errors_imports_nothing() -> None:
    # The core raises ArbiterError subclasses: the root must stay importable
    # from anywhere without pulling in a single other module.
    tree = ast.parse((ROOT / "arbiter" / "errors.py").read_text())
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert not imports, [ast.unparse(n) for n in imports]
