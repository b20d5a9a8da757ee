"""What handing work to an instance thread and back costs a request, measured on this machine.

A request that runs on an instance thread waits for a queue put, the wake-up of the thread, and the
wake-up of the loop when the thread's `call_soon_threadsafe` comes back. How long that takes depends
on the machine far more than on Python: about 0.1 ms on the 2-core VM the scheduler was first measured
on, 0.2-0.45 ms on a later one (a virtual machine whose wake-ups are slow), tens of µs on bare metal.
core/loop_gate.py runs a cheap model on the loop when its execution takes less than that, so the
server measures it once as it starts instead of assuming one machine's figure.

`measure` does ROUNDS round trips through a thread started for it (lowered like an instance thread,
core/compute_threads.py) and returns `HandoffCost`: the median over GROUPS groups of the wall time
per round trip, and of the loop thread's CPU time per round trip (for the log: what the loop itself
spends, the rest being wake-ups).
"""

from __future__ import annotations

import asyncio
import queue
import statistics
import threading
import time
from dataclasses import dataclass

from modelhost.core import compute_threads

ROUNDS = 200
GROUPS = 5


@dataclass(frozen=True, slots=True)
class HandoffCost:
    wall_ns: int  # one round trip, as a request waits for it
    loop_cpu_ns: int  # the loop thread's CPU time in it


async def measure(rounds: int = ROUNDS, groups: int = GROUPS) -> HandoffCost:
    """The median round trip through a thread, over `groups` groups of `rounds` / `groups`."""
    loop = asyncio.get_running_loop()
    work: queue.SimpleQueue[asyncio.Future[None] | None] = queue.SimpleQueue()
    thread = threading.Thread(target=_answer, args=(loop, work), name="modelhost-handoff-probe", daemon=True)
    thread.start()
    per_group = max(1, rounds // groups)
    walls, cpus = [], []
    try:
        for _ in range(groups):
            started, cpu_started = time.perf_counter_ns(), time.thread_time_ns()
            for _ in range(per_group):
                future: asyncio.Future[None] = loop.create_future()
                work.put(future)
                await future
            walls.append((time.perf_counter_ns() - started) // per_group)
            cpus.append((time.thread_time_ns() - cpu_started) // per_group)
    finally:
        work.put(None)
    return HandoffCost(int(statistics.median(walls)), int(statistics.median(cpus)))


def _answer(loop: asyncio.AbstractEventLoop, work: queue.SimpleQueue[asyncio.Future[None] | None]) -> None:
    compute_threads.enter()
    while (future := work.get()) is not None:
        loop.call_soon_threadsafe(future.set_result, None)
