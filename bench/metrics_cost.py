"""What the Prometheus metrics cost a replica: CPU per heartbeat with and without them.

Two measurements, each against a baseline measured in the same run, so every
figure is a ratio on the same (noisy, shared) machine:

1. **CPU per heartbeat, end to end**: a local 3-replica cluster (plaintext)
   and ``--nodes`` generator nodes (200) streaming real heartbeats to every
   replica at ``--interval`` seconds (0.6), as in ``bench/tls_cost.py``.
   Baseline: the replicas without ``--metrics-listen``. Metrics: the same
   with ``--metrics-listen`` and every replica scraped every ``--scrape``
   seconds (1 s, fifteen times Prometheus's default 15 s). Over a steady
   ``--window`` (15 s) the replicas' CPU (utime + stime from /proc) is
   divided by the acks they sent. Rounds alternate baseline and metrics
   (``--rounds``, 2) and the ratio of the medians is printed.
2. **The hot path's bookkeeping**, in this process: per heartbeat the
   servicer adds 1 to two integers and observes one inter-arrival in a
   :class:`arbiter.server.ops.metrics.Buckets` (one bisect). Timed against the
   same bookkeeping done with prometheus-client's own ``Counter`` and
   ``Histogram`` (labelled children), and as a share of the replica CPU per
   heartbeat measured in 1.

Usage: python bench/metrics_cost.py [--nodes 200] [--window 15] [--rounds 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import threading
import time
import timeit
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tls_cost import Credentials, Generator, _wait, _wait_listening, cpu_seconds

from membership.testing.localcluster import LocalCluster, free_ports


class Scraper:
    """Scrapes every ``http://ADDRESS/metrics`` every ``period`` seconds from a thread."""

    def __init__(self, addresses: list[str], period: float) -> None:
        self.addresses = addresses
        self.period = period
        self.scrapes = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            for a in self.addresses:
                try:
                    with urllib.request.urlopen(f"http://{a}/metrics", timeout=5) as r:
                        r.read()
                    self.scrapes += 1
                except OSError:
                    self.failures += 1


async def run_cluster(
    tmp: Path,
    *,
    metrics: bool,
    nodes: int,
    interval: float,
    window: float,
    scrape: float,
    settle: float = 5.0,
) -> dict[str, float]:
    """Replica CPU per heartbeat, with or without metrics served and scraped; ``window``
    seconds measured after ``settle`` (at least 5 ``interval``s) of heartbeats."""
    cluster = LocalCluster(tmp, merge_output=True)
    ports = free_ports(6)
    cluster.arbiters = {f"a{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(ports[:3])}
    endpoints = {rid: f"127.0.0.1:{p}" for rid, p in zip(cluster.arbiters, ports[3:], strict=True)}
    for rid in cluster.arbiters:
        extra = ["--insecure"] + (["--metrics-listen", endpoints[rid]] if metrics else [])
        cluster.start_arbiter(rid, *extra)
    gen: Generator | None = None
    scraper: Scraper | None = None
    try:
        await _wait_listening(cluster)  # prints the replicas' logs if they do not come up
        gen = Generator(
            [f"n{i}" for i in range(nodes)],
            cluster.addresses,
            interval,
            Credentials(),
            random.Random(1),
        )
        gen.start()
        await _wait(
            lambda: all(s.first_ack_at is not None for s in gen.stats.values()),
            120,
            f"{len(gen.stats)} streams acked",
        )
        if metrics:
            scraper = Scraper(list(endpoints.values()), scrape)
            scraper.start()
        await asyncio.sleep(max(settle, 5 * interval))  # the adaptive interval settles
        pids = [c.pid for c in cluster.children.values()]
        before = sum(cpu_seconds(p) for p in pids)
        acked0 = sum(s.acked for s in gen.stats.values())
        t0 = time.monotonic()
        await asyncio.sleep(window)
        elapsed = time.monotonic() - t0
        cpu = sum(cpu_seconds(p) for p in pids) - before
        acked = sum(s.acked for s in gen.stats.values()) - acked0
        return {
            "cpu_us_per_heartbeat": cpu / max(1, acked) * 1e6,
            "acks_per_s": acked / elapsed,
            "asked_per_s": nodes * 3 / interval,
            "scrapes": float(scraper.scrapes if scraper else 0),
            "scrape_failures": float(scraper.failures if scraper else 0),
        }
    finally:
        if scraper is not None:
            scraper.stop()
        if gen is not None:
            await gen.stop()
        cluster.stop_all()


def bookkeeping_ns(n: int = 200_000) -> dict[str, float]:
    """Nanoseconds per heartbeat of the servicer's metrics bookkeeping: ours, prometheus-client."""
    from prometheus_client import CollectorRegistry, Counter, Histogram

    from arbiter.server.consensus.counters import INTERARRIVAL_BUCKETS, Counters

    c = Counters()

    def ours() -> None:
        c.heartbeats += 1
        c.interarrival.observe(0.15)
        c.acks += 1

    reg = CollectorRegistry()
    hb = Counter("hb", "", ["arbiter"], registry=reg).labels("a1")
    acks = Counter("acks", "", ["arbiter"], registry=reg).labels("a1")
    hist = Histogram("ia_seconds", "", ["arbiter"], buckets=INTERARRIVAL_BUCKETS, registry=reg)
    ia = hist.labels("a1")

    def library() -> None:
        hb.inc()
        ia.observe(0.15)
        acks.inc()

    def nothing() -> None:
        pass

    best = {}
    for name, fn in (("empty_call", nothing), ("ours", ours), ("prometheus_client", library)):
        best[name] = min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e9
    return {
        "ours_ns": best["ours"] - best["empty_call"],
        "prometheus_client_ns": best["prometheus_client"] - best["empty_call"],
    }


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--interval", type=float, default=0.6)
    ap.add_argument("--window", type=float, default=15.0)
    ap.add_argument("--scrape", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--settle",
        type=float,
        default=5.0,
        help="seconds of heartbeats before measuring (at least 5 intervals; default 5)",
    )
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"baseline": [], "metrics": []}
    with tempfile.TemporaryDirectory(prefix="metrics-cost-") as d:
        for r in range(args.rounds):
            for kind in ("baseline", "metrics"):
                tmp = Path(d) / f"{kind}-{r}"
                tmp.mkdir()
                res = await run_cluster(
                    tmp,
                    metrics=kind == "metrics",
                    nodes=args.nodes,
                    interval=args.interval,
                    window=args.window,
                    scrape=args.scrape,
                    settle=args.settle,
                )
                runs[kind].append(res)
                print(
                    f"round {r} {kind:8}: {res['cpu_us_per_heartbeat']:.1f} us CPU per heartbeat "
                    f"({res['acks_per_s']:.0f} acks/s of {res['asked_per_s']:.0f} asked; "
                    f"{res['scrapes']:.0f} scrapes, {res['scrape_failures']:.0f} failed)",
                    flush=True,
                )
    med = {k: statistics.median(x["cpu_us_per_heartbeat"] for x in v) for k, v in runs.items()}
    book = bookkeeping_ns()
    figures = {
        "nodes": args.nodes,
        "interval_s": args.interval,
        "scrape_every_s": args.scrape,
        "baseline_cpu_us_per_heartbeat": med["baseline"],
        "metrics_cpu_us_per_heartbeat": med["metrics"],
        "metrics_over_baseline": med["metrics"] / med["baseline"],
        "bookkeeping_ns_ours": book["ours_ns"],
        "bookkeeping_ns_prometheus_client": book["prometheus_client_ns"],
        "prometheus_client_over_ours": book["prometheus_client_ns"] / book["ours_ns"],
        "ours_share_of_heartbeat_cpu": book["ours_ns"] / (med["baseline"] * 1000),
    }
    print(
        f"\nreplica CPU per heartbeat, metrics served and scraped every {args.scrape:g}s over "
        f"none: {figures['metrics_over_baseline']:.3f} "
        f"({med['metrics']:.1f} / {med['baseline']:.1f} us, medians of {args.rounds} rounds)\n"
        f"hot-path bookkeeping per heartbeat: ours {book['ours_ns']:.0f} ns, prometheus-client "
        f"{book['prometheus_client_ns']:.0f} ns (x{figures['prometheus_client_over_ours']:.1f}); "
        f"ours is {figures['ours_share_of_heartbeat_cpu']:.2%} of a heartbeat's replica CPU"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
