"""The tiered server's RSS over a fixed amount of work, which the machine's speed does not change: for each Zipf s,
a server with its cache warm-started from the table's hot-id list, then `--requests` new ranking requests at c = 8;
RSS sampled every 0.2 s (its peak) and after. Builds alternate within each Zipf s (base, then the working tree).

    python benchmarks/embedding_rss.py --table-dir DIR [--base REVISION] [--requests 300]

DIR is benchmarks/embedding_store.py's --table-dir (its tiered repository, 10,000,000 x 64 float32); the table
gets DIR/hot_ids_zipf.npy as its hot_ids.npy (the ids of the most popular Zipf ranks, hottest first, as many as
the cache holds; made here if absent). The delta log is removed before each server starts.
"""

from __future__ import annotations

import argparse
import http.client
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.builds import base_tree, remove_tree  # noqa: E402
from benchmarks.embedding_cache_policy import Popularity  # noqa: E402
from benchmarks.embedding_store import CANDIDATES, FIELDS, feature_ids, request_ids, rss_mb, v2_body  # noqa: E402
from tests.server import ServerProcess  # noqa: E402

ROWS, CACHE_BYTES = 10_000_000, 256_000_000


def send(port: int, bodies: list[tuple[bytes, int]], concurrency: int, pid: int) -> tuple[float, float, float]:
    """Send every body once over `concurrency` connections; (seconds, p50 ms, peak RSS MB)."""
    pending = iter(bodies)
    lock = threading.Lock()
    latencies: list[float] = []

    def worker() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        while True:
            with lock:
                body = next(pending, None)
            if body is None:
                return
            started = time.perf_counter()
            connection.request("POST", "/v2/models/ranker/infer", body[0],
                               {"Inference-Header-Content-Length": str(body[1])})
            response = connection.getresponse()
            response.read()
            assert response.status == 200, response.status
            latencies.append(time.perf_counter() - started)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    started = time.time()
    for thread in threads:
        thread.start()
    peak = 0.0
    while any(thread.is_alive() for thread in threads):
        time.sleep(0.2)
        peak = max(peak, rss_mb(pid))
    return time.time() - started, float(np.median(latencies)) * 1000, peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table-dir", type=Path, required=True)
    parser.add_argument("--base", default="main", help="git revision measured against the working tree")
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    repository = args.table_dir / "tiered_repository"
    table = repository / "emb" / "1" / "table"
    ids = feature_ids(ROWS)
    hot = args.table_dir / "hot_ids_zipf.npy"
    if not hot.exists():
        np.save(hot, ids[Popularity(ROWS, 1.0, seed=7).ranked[: CACHE_BYTES // 256]])
    if not (table / "hot_ids.npy").exists():
        (table / "hot_ids.npy").symlink_to(hot)
    values = np.random.default_rng(2).random((CANDIDATES, FIELDS), dtype=np.float32)
    base = base_tree(args.base, Path(os.environ.get("TMPDIR", "/tmp")))
    try:
        for zipf in (1.0, 1.2):
            popularity = Popularity(ROWS, zipf, seed=7)
            bodies = [v2_body({"feat_ids": ids[request_ids(popularity)], "feat_vals": values})
                      for _ in range(args.requests)]
            for label, tree in (("base", base), ("new", ROOT)):
                for log in table.glob("v*/delta.log"):
                    log.unlink()
                server = ServerProcess(repository, "--embedding-cache-bytes", str(CACHE_BYTES),
                                       env={"PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1"})
                try:
                    server.wait_ready(timeout=900)
                    pid = server.process.pid
                    ready = rss_mb(pid)
                    seconds, p50, peak = send(server.port, bodies, 8, pid)
                    print(f"{label:4} zipf {zipf}: ready {ready:.0f} MB; {args.requests} requests at c=8 in "
                          f"{seconds:.0f} s (p50 {p50:.0f} ms); peak {peak:.0f} MB, after {rss_mb(pid):.0f} MB; "
                          f"load {os.getloadavg()[0]:.1f}", flush=True)
                finally:
                    server.stop()
    finally:
        remove_tree(base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
