"""What counting costs a request: statistics and metrics bookkeeping on the hot path, one run.

    python benchmarks/counting.py

Times ModelStatistics.record_request plus record_execution for a batch of one (what a 1-row request
on the event loop pays; metrics add nothing per request, they are read at scrape time) and sets it
against the whole per-request cost of the server measured by benchmarks/inprocess.py.
"""

from __future__ import annotations

import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from modelhost.core.statistics import ExecutionTiming, ModelStatistics  # noqa: E402


def per_call_ns(statement: str, setup: dict, number: int = 200_000) -> float:
    return min(timeit.repeat(statement, globals=setup, number=number, repeat=5)) / number * 1e9


def main() -> None:
    stats = ModelStatistics()
    timing = ExecutionTiming([1500], 0, 4200, 0)
    setup = {"stats": stats, "timing": timing}
    request_ns = per_call_ns("stats.record_request(True, 180_000)", setup)
    execution_ns = per_call_ns("stats.record_execution(1, 1, timing)", setup)
    print(f"record_request: {request_ns:.0f} ns")
    print(f"record_execution (batch of 1): {execution_ns:.0f} ns")
    print(f"per 1-row request: {request_ns + execution_ns:.0f} ns")


if __name__ == "__main__":
    main()
