"""Command line of the simulator.

    python -m tests.sim --seed N [--seconds S] [--mutant X] --trace
    python -m tests.sim --seeds 20000 [--start K] [--seconds S]

A sweep prints progress and every failing seed with the command that
replays it; it exits 1 if any seed failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from tests.sim.mutants import MUTANTS
from tests.sim.run import replay_command, run_seed


def main(argv: list[str] | None = None) -> int:
    """Runs one seed or a sweep; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__.split("\n")[0])
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--seed", type=int, help="run this one seed")
    which.add_argument("--seeds", type=int, help="run this many seeds, from --start")
    p.add_argument("--start", type=int, default=0, help="first seed of a sweep (default 0)")
    p.add_argument("--seconds", type=float, default=60.0, help="simulated seconds per seed")
    p.add_argument("--mutant", choices=MUTANTS, help="run with a deliberate breakage")
    p.add_argument("--trace", action="store_true", help="print the trace of --seed")
    p.add_argument("--stop", action="store_true", help="stop a sweep at its first failure")
    args = p.parse_args(argv)

    if args.seed is not None:
        r = run_seed(args.seed, args.seconds, mutant=args.mutant, echo=args.trace)
        status = "ok" if r.ok else f"FAILED: {r.error}"
        print(f"seed {r.seed} ({r.shape}): {status}")
        print(f"digest {r.digest}, {r.events} events, {r.wall:.2f}s")
        return 0 if r.ok else 1

    failures = 0
    start = time.perf_counter()
    last = start
    for i, seed in enumerate(range(args.start, args.start + args.seeds), 1):
        r = run_seed(seed, args.seconds, mutant=args.mutant)
        if not r.ok:
            failures += 1
            print(f"FAIL seed {seed}: {r.error}", flush=True)
            print(f"  replay: {replay_command(seed, args.seconds, args.mutant)}", flush=True)
            if args.stop:
                break
        now = time.perf_counter()
        if now - last >= 10 or i == args.seeds:
            last = now
            print(f"{i}/{args.seeds} seeds, {failures} failed, {now - start:.0f}s", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # ``--trace | head``: the reader went away
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
