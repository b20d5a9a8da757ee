"""What a compaction of a table's delta log costs the lookups made meanwhile: in-process, the store alone.

    python benchmarks/embedding_compaction.py [--rows 2000000] [--dim 64] [--cache 0.1] [--zipf 1.0] [--pairs 2]
        [--updated 100000] [--work DIR]

A --rows x --dim float32 table (2,000,000 x 64: 512 MB) written under --work (removed at the end), a cache of
--cache of it (filled from the Zipf ranking's hottest rows, then 8 s of lookups), and one thread of lookups (c = 1)
of ranking requests (500 candidates x 39 fields, ids drawn from Zipf s = --zipf over ranks placed at random rows)
all the run. Periods with a compaction (--updated rows updated first, outside the period, then the log compacted
into a new version at the default pace) alternate with periods as long without one (the order swapped every pair).
Reported per period kind: lookups, p50 / p99 / max ms; per compaction: its seconds, the slowest lookup and the
step it overlapped, the hold (updates held back: the switch; its parts: the tail copied, CURRENT, the cache
moved) and the longest fsync of the compaction's thread.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.embedding_cache_policy import Popularity  # noqa: E402
from benchmarks.embedding_store import feature_ids, request_ids  # noqa: E402
from modelhost.embeddings import compaction  # noqa: E402
from modelhost.embeddings.store import EmbeddingStore, StoreSettings  # noqa: E402
from modelhost.embeddings.table_files import write_version  # noqa: E402


class Recorder:
    """Each lookup's (start, seconds, period); each compaction step's time; the compaction thread's fsyncs."""

    def __init__(self) -> None:
        self.lookups: list[tuple[float, float, str | None]] = []
        self.steps: list[tuple[str, float]] = []
        self.fsyncs: list[tuple[float, float]] = []
        self.period: str | None = None

    def step(self, name: str) -> None:
        self.steps.append((name, time.monotonic()))

    def timed_fsync(self, fsync: object) -> object:
        def wrapper(fd: int) -> None:
            started = time.monotonic()
            fsync(fd)  # type: ignore[operator]
            if threading.current_thread().name != "lookups":
                self.fsyncs.append((started, time.monotonic() - started))
        return wrapper


def write_table(path: Path, rows: int, dim: int) -> np.ndarray:
    ids = feature_ids(rows)
    rng = np.random.default_rng(0)
    write_version(path, ids, rng.standard_normal((rows, dim), dtype=np.float32) * 0.05, "float32")
    return ids


def summary(latencies: list[float]) -> str:
    ms = np.array(latencies) * 1000
    return (f"{len(ms):4d} lookups  p50 {np.percentile(ms, 50):6.1f}  p99 {np.percentile(ms, 99):6.1f}  "
            f"max {ms.max():6.1f} ms")


def run(args: argparse.Namespace, work: Path) -> None:
    path = work / "table"
    ids = write_table(path, args.rows, args.dim)
    cache_bytes = int(args.rows * args.dim * 4 * args.cache)
    store = EmbeddingStore(StoreSettings(cache_bytes=cache_bytes, compact_log_bytes=0))
    handle = store.open(path, "t")
    popularity = Popularity(args.rows, args.zipf, seed=7)
    handle.table.warm(ids[popularity.ranked[: cache_bytes // (args.dim * 4)]])
    recorder = Recorder()
    compaction.crash_point = recorder.step
    os.fsync = recorder.timed_fsync(os.fsync)  # type: ignore[assignment]
    stop = threading.Event()

    def look() -> None:
        while not stop.is_set():
            request = ids[request_ids(popularity)]
            period, started = recorder.period, time.monotonic()
            handle.lookup(request)
            recorder.lookups.append((started, time.monotonic() - started, period))

    looker = threading.Thread(target=look, name="lookups")
    looker.start()
    time.sleep(8)
    rng = np.random.default_rng(1)
    last = 30.0
    try:
        for pair in range(args.pairs):
            for kind in ("with", "without") if pair % 2 == 0 else ("without", "with"):
                if kind == "with":
                    chosen = ids[rng.choice(args.rows, args.updated, replace=False)]
                    for start in range(0, len(chosen), 10_000):
                        part = chosen[start:start + 10_000]
                        handle.update(part, rng.standard_normal((len(part), args.dim), dtype=np.float32) * 0.05)
                    recorder.period, started = "with", time.monotonic()
                    compaction.compact(store, handle.key)
                    last = time.monotonic() - started
                    report_compaction(recorder, started, last)
                else:
                    recorder.period = "without"
                    time.sleep(last)
                recorder.period = None
                time.sleep(0.5)
    finally:
        stop.set()
        looker.join()
        store.close()
    for kind in ("with", "without"):
        print(f"{kind:8}", summary([seconds for _, seconds, period in recorder.lookups if period == kind]))


def report_compaction(recorder: Recorder, started: float, seconds: float) -> None:
    steps = [(name, at) for name, at in recorder.steps if at >= started]
    mine = [(at, took) for at, took, period in recorder.lookups if period == "with" and at >= started]
    at, took = max(mine, key=lambda lookup: lookup[1])
    before = [name for name, reached in steps if reached <= at]
    inside = [name for name, reached in steps if at < reached <= at + took]
    during = "+".join(inside) if inside else f"after {before[-1]}" if before else "write"
    times = dict(steps)
    hold = times.get("served", 0.0) - times.get("opened", 0.0)
    parts = "/".join(f"{(times.get(b, 0.0) - times.get(a, 0.0)) * 1000:.0f}"
                     for a, b in (("opened", "switching"), ("switching", "current"), ("current", "served")))
    fsync = max((took for fsync_at, took in recorder.fsyncs if fsync_at >= started), default=0.0)
    print(f"compaction {seconds:5.1f} s  slowest lookup {took * 1000:6.1f} ms ({during})  hold {hold * 1000:6.1f} ms "
          f"({parts})  longest fsync {fsync * 1000:6.1f} ms  load {os.getloadavg()[0]:.1f}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--cache", type=float, default=0.1)
    parser.add_argument("--zipf", type=float, default=1.0)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--updated", type=int, default=100_000)
    parser.add_argument("--work", type=Path, default=None, help="where a new temporary directory is made")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="embedding-compaction-", dir=args.work))
    try:
        run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
