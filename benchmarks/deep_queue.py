"""Forming batches from a deep queue (an overloaded model without max_queue_size): an instance thread's take().

    python benchmarks/deep_queue.py [--depths 100,1000,4000]

In-process, no server: a RequestQueue of a model with max_batch_size 1024 and a dynamic batcher, filled with
requests of 500 rows (two fill 1,000 rows, and no third fits) or of 3 rows (341 fill 1,023), drained by take();
µs per take and per request taken (perf_counter; the queue's lock is held for all of it, the event loop's puts
waiting meanwhile).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from modelhost.config.pbtxt import parse_config  # noqa: E402
from modelhost.core.policy import SchedulingPolicy  # noqa: E402
from modelhost.core.request_queue import Pending, RequestQueue  # noqa: E402

CONFIG = """
name: "rank"
max_batch_size: 1024
input [ { name: "features" data_type: TYPE_FP32 dims: [ 1000 ] } ]
output [ { name: "score" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 0 }
"""


def per_take(depth: int, rows: int) -> tuple[float, float]:
    policy = SchedulingPolicy.from_config(parse_config(CONFIG))
    queue = RequestQueue(policy)
    loop = asyncio.new_event_loop()
    try:
        for _ in range(depth):
            queue.put(Pending({}, ("score",), rows, "key", 0, loop.create_future()), "rank")
        started, takes = time.perf_counter(), 0
        while queue.depth():
            queue.take()
            takes += 1
        elapsed = time.perf_counter() - started
        return elapsed / takes, elapsed / depth
    finally:
        loop.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", default="100,1000,4000")
    args = parser.parse_args()
    print("| requests queued | 500-row requests: µs a take, a request | 3-row requests: µs a take, a request |\n"
          "|---|---|---|")
    for depth in (int(d) for d in args.depths.split(",")):
        cells = [per_take(depth, rows) for rows in (500, 3)]
        row = " | ".join(f"{take * 1e6:.1f}, {one * 1e6:.2f}" for take, one in cells)
        print(f"| {depth} | {row} |", flush=True)


if __name__ == "__main__":
    main()
