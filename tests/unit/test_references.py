"""The code's references point into the repository: docs/architecture.md, not documents it lacks.

Docstrings, comments and tests name a failure class or a section of
docs/architecture.md; each name must be there. Codes of an internal list of
failure cases (C01, C22, ...) and documents the repository does not hold are
not references anyone can follow.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
SKIP_DIRS = {".venv", ".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
SUFFIXES = {".py", ".md", ".txt", ".toml", ".yml", ".yaml", ".proto"}
ELSEWHERE = re.compile(r"\bC\d\d\b|DESIGN\.md|FIELD-REPORTS|STYLE\.md")


def _sources() -> list[Path]:
    return sorted(
        p
        for p in ROOT.rglob("*")
        if p.is_file()
        and p.suffix in SUFFIXES
        and not SKIP_DIRS.intersection(p.relative_to(ROOT).parts)
        and not p.relative_to(ROOT).parts[0].endswith(".egg-info")
        and "/v1/" not in str(p)  # generated
    )


def _flat(text: str) -> str:
    """The text with line breaks (and comment markers after them) as single spaces."""
    return re.sub(r"\s*\n\s*(?:#\s*)?", " ", text)


def _doc_names() -> tuple[set[str], set[str]]:
    """The document's section titles and failure class names (items "- **Name.** ...")."""
    text = DOC.read_text()
    sections = {m.lower() for m in re.findall(r"^##+ (.+)$", text, re.MULTILINE)}
    classes = {m.lower() for m in re.findall(r"^- \*\*([^*]+?)\.\*\*", text, re.MULTILINE)}
    return sections, classes


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def test_references_no_codes_or_documents_the_repository_lacks() -> None:
    hits = [
        f"{_rel(p)}:{n}: {m.group(0)}"
        for p in _sources()
        if p != Path(__file__)
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        for m in ELSEWHERE.finditer(line)
    ]
    assert not hits, "\n".join(hits)


def test_references_failure_classes_named_in_code_are_in_the_document() -> None:
    _, classes = _doc_names()
    assert len(classes) >= 15, classes
    named: list[tuple[str, str]] = []
    for p in _sources():
        flat = _flat(p.read_text(errors="replace"))
        for m in re.finditer(r'failure class(?:es)? ((?:"[^"]+"(?:,? (?:and )?)?)+)', flat):
            named += [(_rel(p), name) for name in re.findall(r'"([^"]+)"', m.group(1))]
    assert named, "no failure class is named anywhere: is the pattern still right?"
    missing = [f"{path}: {name!r}" for path, name in named if name.lower() not in classes]
    assert not missing, f"not in {_rel(DOC)}'s failure classes: {missing}"


def test_references_sections_named_in_code_are_in_the_document() -> None:
    sections, _ = _doc_names()
    named = [
        (_rel(p), m.group(1))
        for p in _sources()
        for m in re.finditer(
            r'docs/architecture\.md(?:``)?,? \(?"([^"]+)"', _flat(p.read_text(errors="replace"))
        )
    ]
    assert named
    missing = [f"{path}: {name!r}" for path, name in named if name.lower() not in sections]
    assert not missing, f"not a section of {_rel(DOC)}: {missing}"


_DOC_PATHS = re.findall(r"`((?:arbiter|membership|tests|bench|protos)/[\w/.]+)`", DOC.read_text())


@pytest.mark.parametrize("path", sorted(set(_DOC_PATHS)))
def test_references_paths_in_the_document_exist(path: str) -> None:
    assert (ROOT / path.rstrip("/")).exists(), path
