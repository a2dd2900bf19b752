"""The CI seeds of the simulator, run ahead in a niced background process.

The simulator is pure CPU and deterministic (virtual time), while the
integration and chaos tests that pytest runs before it mostly wait on real
time. So when the CI seed tests are collected, ``tests/conftest.py`` starts
this module as a process at the lowest priority (nice 19) at the start of the
session: it runs the seeds on the core the other tests leave idle and yields
it whenever they need it (the kernel gives a nice-19 process about 1.5 % of
a contended core against a nice-0 one), so it neither slows them nor changes
any result. ``test_sim_ci_seeds_hold_every_invariant`` then reads each seed's
result from the file, waiting for the seeds not yet done; without a
background process (the test run alone, or the process gone) it runs its
seeds itself.

Under pytest-xdist (the README's ``-n 2``) the controller starts the process
once the first worker has collected (``tests/conftest.py``) and the workers
*attach* to it (:meth:`SeedRuns.attach`, by its pid file): a seed test there
takes the seeds already done and runs the rest itself at once rather than
wait, since its worker is a CPU the other tests need.

Run as ``python -m tests.sim.background OUT FIRST COUNT SECONDS``: one JSON
line per seed in OUT, ``{"seed": 7, "error": null, "replay": "..."}``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SeedRuns", "main"]

ROOT = Path(__file__).parents[2]
NICE = ("nice", "-n", "19")  # coreutils' nice: no preexec_fn in a process gRPC may use


@dataclass(slots=True)
class SeedRuns:
    """A background process running seeds ``first .. first + count - 1`` into ``out``.

    Args:
        out: the JSON-lines file it writes, one line per finished seed.
        proc: the process (None in a process that attached to it).
        pid: its pid (also in ``out``.pid).
        patience: seconds a seed test waits for its seeds before it runs the rest itself.
    """

    out: Path
    proc: subprocess.Popen[bytes] | None
    pid: int
    patience: float = 60.0

    @classmethod
    def start(cls, out: Path, first: int, count: int, seconds: float) -> SeedRuns:
        """Starts the process at nice 19, its output to ``out`` (and ``out``.err)."""
        args = (str(out), str(first), str(count), repr(seconds))
        err = open(out.with_suffix(".err"), "wb")  # noqa: SIM115 (the child holds it)
        try:
            proc = subprocess.Popen(
                [*NICE, sys.executable, "-m", "tests.sim.background", *args],
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        finally:
            err.close()
        out.with_suffix(".pid").write_text(str(proc.pid))
        return cls(out=out, proc=proc, pid=proc.pid)

    @classmethod
    def attach(cls, out: Path) -> SeedRuns | None:
        """The run another process started into ``out`` (its pid file), waiting for
        nothing (``patience`` 0); None when no run was started there."""
        try:
            pid = int(out.with_suffix(".pid").read_text())
        except (OSError, ValueError):
            return None
        return cls(out=out, proc=None, pid=pid, patience=0.0)

    def running(self) -> bool:
        """Whether the process still runs (a zombie has ended)."""
        if self.proc is not None:
            return self.proc.poll() is None
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return os.path.exists(f"/proc/{self.pid}")  # no procfs: assume it runs
        return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")

    def results(self) -> dict[int, str | None]:
        """Seed -> its error (None: every invariant held), for the seeds finished so far."""
        done: dict[int, str | None] = {}
        if not self.out.exists():
            return done
        for line in self.out.read_text().splitlines():
            if line.endswith("}"):  # a line being written is not read
                rec = json.loads(line)
                done[rec["seed"]] = rec["error"]
        return done

    def wait_for(self, seeds: range, timeout: float) -> dict[int, str | None]:
        """Waits until every seed of ``seeds`` is finished, the process ended, or ``timeout``
        seconds passed; the errors of the seeds finished by then (the caller runs the rest)."""
        deadline = time.monotonic() + timeout
        while True:
            done = self.results()
            if all(s in done for s in seeds) or not self.running() or time.monotonic() >= deadline:
                return {s: done[s] for s in seeds if s in done}
            time.sleep(0.05)

    def stop(self) -> None:
        """Ends the process (kill), if it still runs, and reaps it (only its starter can)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def main(argv: list[str]) -> int:
    """Runs the seeds named by ``argv`` (OUT FIRST COUNT SECONDS), one line per seed."""
    from tests.sim.run import replay_command, run_seed

    out, first, count, seconds = Path(argv[0]), int(argv[1]), int(argv[2]), float(argv[3])
    with out.open("a") as f:
        for seed in range(first, first + count):
            r = run_seed(seed, seconds)
            rec = {"seed": seed, "error": r.error, "replay": replay_command(seed, seconds)}
            f.write(json.dumps(rec) + "\n")
            f.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
