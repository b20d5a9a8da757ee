"""handoff_cost.measure: the event loop's CPU per round trip through a thread, on a real loop and thread."""

from __future__ import annotations

import asyncio
import threading

import uvloop

from modelhost.core import handoff_cost


def test_a_round_trip_takes_time_and_loop_cpu_and_the_probe_thread_ends() -> None:
    cost = uvloop.run(handoff_cost.measure(rounds=40, groups=4))
    assert 0 < cost.loop_cpu_ns <= cost.wall_ns < 50_000_000  # some CPU, within the round trip, not a stall

    async def probe_gone() -> None:
        for _ in range(200):
            if not any(t.name == "modelhost-handoff-probe" for t in threading.enumerate()):
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the probe thread is still running")

    asyncio.run(probe_gone())

