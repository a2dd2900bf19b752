"""Runs the examples of a Markdown page: every ``sh`` and ``python`` block, in order.

The conventions the docs are written to (``docs/testing.md``, "The docs are tested"):

1. A fenced block whose language is ``sh`` or ``python`` is an example and is
   run; a block of any other language (``text``, ``json``, ``yaml``, none) is
   output or a file's contents, and is not.
2. A page's blocks run in order, in one bash session (``set -e -o pipefail``:
   a command that fails fails the page), in a folder of the page's own that
   looks like a checkout: ``.venv`` is the virtualenv running the tests, and
   ``bench/``, ``deploy/``, ``tests/``, ``examples/``, ``protos/`` and the other
   files of the repository are links to the real ones (``bench/results/`` is
   a fresh folder, so a benchmark never overwrites the committed figures).
   What a page writes (``./certs``, ``./data``) stays in its folder, which is
   removed afterwards.
3. Ports: every ``127.0.0.1:PORT`` and ``localhost:PORT`` with PORT in
   7000-7099 or 9100-9199 is replaced by a free port, the same one for the
   same number throughout the page, so a page can start a cluster in one block
   and use it in the next.
4. A command ending in ``&`` runs in the background until the page ends; then
   every process the page started gets SIGTERM (SIGKILL 10 s later).
5. A ``python`` block is written to a file and run with the virtualenv's
   python, in the page's shell (so what the page exported applies).
6. Directives, in HTML comments on the lines just before a block's fence
   (``<!-- doctest: NAME: VALUE -->``; several lines for several):

   - ``skip: REASON, covered by tests/PATH.py::test_NAME``: not run here
     (a Docker engine, a Kubernetes cluster, a test run inside the tests);
     the test named must exist, and is where the block's commands are
     checked.
   - ``replace: OLD => NEW``: the block runs with OLD replaced by NEW (a
     benchmark run small).
   - ``wait: COMMAND``: after the block, COMMAND is run every 0.2 s in the
     page's shell until it succeeds (at most ``timeout`` seconds): the
     condition the next block relies on (a node ALIVE, a death committed).
   - ``interrupt after: TEXT``: the block's last command runs until
     interrupted, as ``membership watch`` does: once its output holds TEXT it
     gets SIGINT, and it must exit 0.
   - ``timeout: SECONDS``: for the block and its wait (default 120).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = ("sh", "python")
DEFAULT_TIMEOUT = 120.0
_DIRECTIVE = re.compile(r"^<!--\s*doctest:\s*([a-z ]+?)\s*:\s*(.*?)\s*-->\s*$")
_PORT = re.compile(r"\b(127\.0\.0\.1|localhost):(70\d\d|91\d\d)\b")
# Runs its arguments with SIGINT at its default (rule 6, "interrupt after").
_SIGINT_DEFAULT = (
    f"{sys.executable} -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execvp(sys.argv[1], sys.argv[1:])'"
)
_COVER = re.compile(r"covered by (tests/[\w/]+\.py)::(test_\w+)")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: where it starts (1-based line of its fence),
    its language, its text and its directives (name -> values, in order)."""

    page: Path
    line: int
    lang: str
    text: str
    directives: dict[str, list[str]] = field(default_factory=dict)

    @property
    def where(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page}:{self.line}"

    def one(self, name: str) -> str | None:
        values = self.directives.get(name)
        return values[-1] if values else None


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page`` (run or not), with its directives.

    Raises:
        ValueError: an unclosed fence, or a directive that names no rule of
            this module's docstring.
    """
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = re.match(r"^(\s*)(`{3,})(\S*)", lines[i])
        if not fence:
            i += 1
            continue
        indent, ticks, lang = fence.groups()
        directives: dict[str, list[str]] = {}
        j = i - 1
        while j >= 0 and (m := _DIRECTIVE.match(lines[j].strip())):
            name, value = m.groups()
            if name not in ("skip", "replace", "wait", "interrupt after", "timeout"):
                raise ValueError(f"{page}:{j + 1}: unknown doctest directive {name!r}")
            directives.setdefault(name, []).insert(0, value)
            j -= 1
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(ticks):
            end += 1
        if end == len(lines):
            raise ValueError(f"{page}:{i + 1}: a fence that is never closed")
        body = [
            line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : end]
        ]
        found.append(Block(page, i + 1, lang, "\n".join(body) + "\n", directives))
        i = end + 1
    return found


def covering_test(block: Block) -> tuple[Path, str] | None:
    """The test a skipped block names (``covered by tests/X.py::test_Y``), or None."""
    reason = block.one("skip")
    m = _COVER.search(reason or "")
    return (ROOT / m.group(1), m.group(2)) if m else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _logical_lines(script: str) -> list[str]:
    """Shell lines with their backslash continuations joined."""
    out: list[str] = []
    buf = ""
    for line in script.splitlines():
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        out.append(buf + line)
        buf = ""
    if buf:
        out.append(buf)
    return out


class PageFailed(AssertionError):
    """A block failed: the message names it and holds its output."""


class PageRun:
    """One page's bash session in its own folder (module rules 2 to 5).

    Args:
        page: the Markdown file.
        workdir: an empty folder, the page's.
        env: the environment of the session (PATH gets the virtualenv first).
    """

    def __init__(self, page: Path, workdir: Path, env: dict[str, str] | None = None) -> None:
        self.page = page
        self.dir = workdir
        self.ports: dict[str, int] = {}
        self._seen_ports: set[int] = set()
        self._n = 0
        self._mirror_checkout()
        environ = dict(os.environ if env is None else env)
        environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environ.get('PATH', '')}"
        environ["PYTHONUNBUFFERED"] = "1"
        self._log = open(self.dir / "session.log", "ab")  # noqa: SIM115 - closed in close()
        self.shell = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.dir,
            env=environ,
            start_new_session=True,
            text=True,
        )
        self._send("set -e -o pipefail")

    def _mirror_checkout(self) -> None:
        self._mirror_venv(Path(sys.prefix), self.dir / ".venv")
        for entry in ROOT.iterdir():
            if entry.name in {".venv", ".git", "bench"} or (self.dir / entry.name).exists():
                continue
            (self.dir / entry.name).symlink_to(entry)
        # A copy, not links: the scripts find bench/results/ from their own path.
        shutil.copytree(
            ROOT / "bench",
            self.dir / "bench",
            ignore=shutil.ignore_patterns("results", "__pycache__", ".build"),
        )
        (self.dir / "bench" / "results").mkdir()

    @staticmethod
    def _mirror_venv(venv: Path, mirror: Path) -> None:
        """``mirror`` as the virtualenv ``venv`` (module rule 2), whose ``pip``
        is ``tests/docs_pip.py``: ``pip install -e '.[bench]'`` run in the page's
        folder would otherwise point the tests' own install at that folder, which
        is removed when the page ends, and reinstalling the checkout while other
        tests start ``membership`` races them (they saw its entry points twice)."""
        mirror.mkdir()
        for entry in venv.iterdir():
            if entry.name != "bin":
                (mirror / entry.name).symlink_to(entry)
        (mirror / "bin").mkdir()
        for tool in (venv / "bin").iterdir():
            if tool.name in {"pip", "pip3", f"pip3.{sys.version_info.minor}"}:
                continue
            (mirror / "bin" / tool.name).symlink_to(tool)
        script = str(ROOT / "tests" / "docs_pip.py")
        shim = (
            f"#!{venv / 'bin' / 'python'}\n"
            f"import runpy\nrunpy.run_path({script!r}, run_name='__main__')\n"
        )
        for name in ("pip", "pip3", f"pip3.{sys.version_info.minor}"):
            (mirror / "bin" / name).write_text(shim)
            (mirror / "bin" / name).chmod(0o755)

    def substitute(self, text: str) -> str:
        """``text`` with the page's ports (module rule 3)."""

        def port(m: re.Match[str]) -> str:
            number = m.group(2)
            if number not in self.ports:
                new = free_port()
                while new in self._seen_ports:
                    new = free_port()
                self._seen_ports.add(new)
                self.ports[number] = new
            return f"{m.group(1)}:{self.ports[number]}"

        return _PORT.sub(port, text)

    def _send(self, line: str) -> None:
        assert self.shell.stdin is not None
        self.shell.stdin.write(line + "\n")
        self.shell.stdin.flush()

    def _wait_file(self, path: Path, deadline: float, what: str, block: Block) -> None:
        while not path.exists():
            if self.shell.poll() is not None:
                raise PageFailed(self._report(block, f"the page's shell exited ({what})"))
            if time.monotonic() > deadline:
                raise PageFailed(self._report(block, f"timed out ({what})"))
            time.sleep(0.05)

    def _report(self, block: Block, why: str) -> str:
        out = self.dir / f"out-{self._n}.txt"
        text = out.read_text(errors="replace") if out.exists() else ""
        log = (self.dir / "session.log").read_text(errors="replace")
        return (
            f"{block.where}: {why}\n--- the block as run:\n{self._last_script}\n"
            f"--- its output (last 4000 characters):\n{text[-4000:]}\n"
            f"--- the shell's own output:\n{log[-2000:]}"
        )

    def run(self, block: Block) -> str:
        """Runs ``block`` (its directives applied) and returns its output.

        Raises:
            PageFailed: a command failed, a wait or the block timed out, or an
                interrupted command did not exit 0.
        """
        self._n += 1
        n = self._n
        timeout = float(block.one("timeout") or DEFAULT_TIMEOUT)
        text = block.text
        for spec in block.directives.get("replace", []):
            old, sep, new = spec.partition(" => ")
            if not sep or old not in text:
                raise PageFailed(f"{block.where}: replace {spec!r}: {old!r} is not in the block")
            text = text.replace(old, new)
        text = self.substitute(text)
        if block.lang == "python":
            script_file = self.dir / f"doc-{n}.py"
            script_file.write_text(text)
            script = f"python {script_file.name}\n"
        else:
            script = text
        until = block.one("interrupt after")
        if until is not None:
            lines = [line for line in _logical_lines(script) if line.strip()]
            last = lines[-1]
            # A background command of a non-interactive bash ignores SIGINT:
            # it starts with SIGINT at its default, as from a terminal.
            script = (
                "\n".join(lines[:-1])
                + f"\n{_SIGINT_DEFAULT} {last} > last-{n}.txt 2>&1 &\n__doc_pid=$!\n"
            )
        self._last_script = script
        (self.dir / f"block-{n}.sh").write_text(script)
        out = self.dir / f"out-{n}.txt"
        done = self.dir / f"done-{n}"
        deadline = time.monotonic() + timeout
        self._send(f"source block-{n}.sh > {out.name} 2>&1; touch {done.name}")
        self._wait_file(done, deadline, "the block", block)
        if until is not None:
            last_out = self.dir / f"last-{n}.txt"
            while until not in (last_out.read_text(errors="replace") if last_out.exists() else ""):
                if self.shell.poll() is not None or time.monotonic() > deadline:
                    shown = last_out.read_text(errors="replace") if last_out.exists() else ""
                    raise PageFailed(
                        self._report(block, f"{until!r} never came; the command printed:\n{shown}")
                    )
                time.sleep(0.05)
            stopped = self.dir / f"stopped-{n}"
            self._send(f'kill -INT "$__doc_pid"; wait "$__doc_pid"; touch {stopped.name}')
            self._wait_file(stopped, deadline, "the interrupted command's exit", block)
            with contextlib.suppress(FileNotFoundError), out.open("a") as f:
                f.write((self.dir / f"last-{n}.txt").read_text(errors="replace"))
        condition = block.one("wait")
        if condition is not None:
            waited = self.dir / f"waited-{n}"
            cmd = self.substitute(condition)
            self._send(
                f"until {{ {cmd} ; }} >/dev/null 2>&1; do sleep 0.2; done; touch {waited.name}"
            )
            self._wait_file(waited, deadline, f"waiting for: {cmd}", block)
        return out.read_text(errors="replace")

    def close(self) -> None:
        """Ends the session: every process of the page gets SIGTERM, then SIGKILL."""
        with contextlib.suppress(OSError, ValueError):
            assert self.shell.stdin is not None
            self.shell.stdin.close()
        for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.shell.pid, sig)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and _group_alive(self.shell.pid):
                time.sleep(0.05)
            if not _group_alive(self.shell.pid):
                break
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.shell.wait(timeout=5)
        self._log.close()


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies do not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state != "Z":
            return True
    return False


def run_page(page: Path, workdir: Path, env: dict[str, str] | None = None) -> list[str]:
    """Runs every example of ``page`` in order; returns each run block's output.

    Raises:
        PageFailed: as :meth:`PageRun.run`.
    """
    session = PageRun(page, workdir, env)
    outputs: list[str] = []
    try:
        for block in blocks(page):
            if block.lang in RUN and block.one("skip") is None:
                started = time.monotonic()
                outputs.append(session.run(block))
                # Shown by pytest with the test's output: where a page's time goes.
                print(f"{block.where}: {time.monotonic() - started:.1f} s")
    finally:
        session.close()
    return outputs


__all__ = ["RUN", "Block", "PageFailed", "PageRun", "blocks", "covering_test", "run_page"]
