"""The sequence batcher's idle release under a churn of abandoned sequences: the event loop's CPU per release.

    python benchmarks/sequence_idle.py [--open 1000,2000,4000]

In-process, no server: a SequenceBatcher (tests/core/test_sequences.py's accumulator config, one instance, a slot
per sequence) on a hand-moved clock (tests/fakes.py ManualClock). N sequences open one after another, 1/N s apart,
and are never used again, as when N clients go away without sending END; the clock then moves on in steps of 1/N s
past their idle time (1 s), so the sweep releases them one at a time, each when it falls due. Printed: the loop's
CPU (thread time) over those steps, per release. The clock's own bookkeeping is in the figure, the same for every
build.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.core.test_sequences import Accumulator, batcher, send  # noqa: E402
from tests.fakes import ManualClock  # noqa: E402


class MovingClock(ManualClock):
    """A timer is due no sooner than a nanosecond on: as on the real clock, which has moved on by the time the loop
    runs a timer set for a delay rounded to nothing, a sweep that re-arms for such a delay runs once more, not for
    ever within one `advance`."""

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> Any:
        return super().call_later(max(delay, 2e-9), callback, *args)


async def releases(count: int) -> float:
    """CPU seconds per release of `count` abandoned sequences."""
    clock = MovingClock()
    sequences, model = batcher(max_batch_size=count, idle_us=1_000_000, clock=clock), Accumulator()
    for sequence_id in range(1, count + 1):
        await send(sequences, model, 1, sequence_id, start=True)
        clock.advance(1 / count)
    started = time.thread_time()
    for _ in range(count + 2):
        clock.advance(1 / count)
    spent = time.thread_time() - started
    assert sequences.idled_out == count and sequences.open_sequences() == 0
    return spent / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--open", default="1000,2000,4000", help="how many sequences are abandoned at once")
    args = parser.parse_args()
    print("| open sequences | loop CPU µs a release |\n|---|---|")
    for count in (int(n) for n in args.open.split(",")):
        print(f"| {count} | {asyncio.run(releases(count)) * 1e6:.1f} |", flush=True)


if __name__ == "__main__":
    main()
