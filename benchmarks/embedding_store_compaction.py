"""embedding_store.py --compaction: a compaction of the tiered table's delta log through the server, at the
default pace, against the same traffic without one.

The tiered repository is linked, not copied, into a directory of its own under --work (the version's files are
hard links: a compaction only reads them and writes a new version beside them; the one it makes current and any
later removal stay in that directory, so the benchmark's table is never changed). The server runs with updates
on and `--embedding-compact-log-bytes` (default 64MiB); the traffic (the first of --traffic, at the first of
--concurrency) runs all along: --duration measured without a compaction ("before"), then updates of 10,000 rows
posted back to back until the log passes the limit (not measured), then "during" until the server's metrics count
the compaction, then --duration "after". The server's RSS is sampled every 0.5 s.
"""

from __future__ import annotations

import http.client
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.embedding_store import Load, metrics, post_update, rss_mb, v2_body
from tests.server import ServerProcess


def linked_repository(tiered: Path, work: Path) -> Path:
    """A copy of `tiered` whose table version's files are hard links to the originals."""
    copy = Path(tempfile.mkdtemp(prefix="compaction-repository-", dir=work))
    shutil.copytree(tiered, copy, copy_function=os.link, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("delta.log", ".compacting-*"))
    return copy


def fill_log(port: int, ids: np.ndarray, dim: int, log_bytes: int) -> int:
    """Post 10,000-row updates until the table's log holds more than `log_bytes`; the rows posted."""
    rng = np.random.default_rng(5)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    posted = 0
    while posted * (dim * 4 + 8) <= log_bytes:
        body, header = v2_body({"ids": ids[rng.choice(len(ids), 10_000, replace=False)],
                                "vectors": rng.standard_normal((10_000, dim), dtype=np.float32) * 0.05})
        post_update(connection, body, header)
        posted += 10_000
    return posted


def _sample(server: ServerProcess, load: Load, phase: str, until: Any, marks: dict[str, float]) -> dict[str, float]:
    """Run `phase` until `until(seconds)`: its seconds, the server's highest RSS sample (and its anonymous part
    then), the cache's hit ratio, the load average at its end."""
    before = metrics(server)
    load.phase, started, peak, anon = phase, time.perf_counter(), 0.0, 0.0
    marks[phase] = started
    while not until(time.perf_counter() - started):
        time.sleep(0.5)
        if (rss := rss_mb(server.process.pid)) > peak:
            peak, anon = rss, rss_mb(server.process.pid, "RssAnon")
    load.phase = None
    after = metrics(server)
    hits, misses = (after.get(f"modelhost_embedding_cache_{name}_total", 0)
                    - before.get(f"modelhost_embedding_cache_{name}_total", 0) for name in ("hits", "misses"))
    marks[f"{phase} end"] = time.perf_counter()
    return {"seconds": time.perf_counter() - started, "peak": peak, "anon": anon,
            "hit": hits / (hits + misses) if hits + misses > 0 else float("nan"), "load": os.getloadavg()[0]}


def compaction_run(tiered: Path, work: Path, ids: np.ndarray, dim: int, bodies: list[Any], flags: list[str],
                   concurrency: int, warmup: float, duration: float, log_bytes: int) -> None:
    repository = linked_repository(tiered, work)
    server = ServerProcess(repository, *flags, "--embedding-compact-log-bytes", str(log_bytes))
    try:
        server.wait_ready(timeout=600)
        load = Load(server.port, "/v2/models/ranker/infer", bodies, concurrency)
        timeline: list[tuple[float, float]] = []
        marks: dict[str, float] = {}
        load.timeline = timeline
        with load:
            time.sleep(warmup)
            seconds = {"before": _sample(server, load, "before", lambda t: t >= duration, marks)}
            posted = fill_log(server.port, ids, dim, log_bytes)

            def compacted(elapsed: float) -> bool:
                return metrics(server).get("modelhost_embedding_compactions_total", 0) >= 1 or elapsed > 900

            seconds["during"] = _sample(server, load, "during", compacted, marks)
            seconds["after"] = _sample(server, load, "after", lambda t: t >= duration, marks)
        took = metrics(server).get("modelhost_embedding_compaction_seconds_total", float("nan"))
        print(f"compaction through the server: {posted:,} rows updated, log limit {log_bytes / 2**20:.0f} MiB, "
              f"compaction {took:.1f} s, c={concurrency}, load {os.getloadavg()[0]:.1f}", flush=True)
        for phase, seen in seconds.items():
            latencies = sorted(load.by_phase.get(phase, [])) or [float("nan")]
            p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
            print(f"  {phase:6} {seen['seconds']:6.1f} s  {len(latencies):5d} requests  p50 "
                  f"{statistics.median(latencies) * 1000:7.1f}  p99 {p99 * 1000:7.1f}  max "
                  f"{latencies[-1] * 1000:7.1f} ms  hit {seen['hit']:.3f}  RSS peak {seen['peak']:5.0f} MB "
                  f"(anon {seen['anon']:.0f})  load {seen['load']:.1f}", flush=True)
        start = marks["during"]
        slowest = sorted(timeline, key=lambda request: -request[1])[:8]
        print("  slowest requests (s after the compaction began, ms): " + ", ".join(
            f"{at - start:.1f}: {took * 1000:.0f}" for at, took in sorted(slowest)) +
            f"; the compaction was counted {marks['during end'] - start:.1f} s after it began", flush=True)
    finally:
        server.stop()
        shutil.rmtree(repository, ignore_errors=True)
