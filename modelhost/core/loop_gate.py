"""Which batches are cheap enough to run on the event loop itself, learned from measured executions.

Handing a batch to an instance thread and its result back costs two thread wake-ups, in latency
and in the loop's CPU (its own work and the GIL handed back and forth), more than a tiny model's whole
run. A batch predicted to finish within the budget therefore runs on the loop. The default budget is
what a handoff's round trip takes on this machine (core/handoff_cost.py, measured as the server
starts; `use_handoff_cost`), kept within MIN_BUDGET_NS..MAX_BUDGET_NS: a run on the loop then delays
the loop no longer than a handoff would delay the request. The loop's CPU alone, measured the same
way, undercounts: on the 2-core VM it read 13-32 µs per round trip, about the old fixed 20 µs, and a
budget made from it left tiny where the fixed one had it (0.95x the requests/s at concurrency 8, 3
rounds), while the round trip's 114-244 µs gave 1.08x over HTTP and 1.29x over gRPC (4 rounds;
docs/benchmarks.md). A model's `inline_max_microseconds` parameter sets its budget instead (0:
never on the loop).

Cost grows with rows, so the gate learns a row limit: every execution within budget lets the loop
take batches of up to twice its rows, and SLOW_STRIKES executions on the loop in a row over budget
halve the limit below their rows (down to 0: nothing runs on the loop until a fast execution is seen
again). Slow executions on instance threads do not count against the loop: their time includes
waiting for the GIL while the loop is busy, which the loop itself would not pay.
"""

from __future__ import annotations

MAX_ROWS = 1 << 20
SLOW_STRIKES = 2  # one slow execution is as likely a page fault or a preemption as a slow model
# The default budget's bounds: 20 µs, the fixed budget before it was measured, for fast machines; 200 µs
# keeps a machine with slow wake-ups from holding the loop on one execution for longer.
MIN_BUDGET_NS = 20_000
MAX_BUDGET_NS = 200_000
_default_budget_ns = MIN_BUDGET_NS


def use_handoff_cost(round_trip_ns: int) -> int:
    """Make a handoff's measured round trip (bounded) the default budget of gates made from now on;
    returns that budget."""
    global _default_budget_ns
    _default_budget_ns = min(max(round_trip_ns, MIN_BUDGET_NS), MAX_BUDGET_NS)
    return _default_budget_ns


def default_budget_ns() -> int:
    return _default_budget_ns


class LoopGate:
    def __init__(self, budget_ns: int) -> None:
        self.budget_ns = budget_ns
        self.max_rows = 0  # batches of at most this many rows may run on the loop
        self._strikes = 0

    def learn(self, rows: int, elapsed_ns: int, on_loop: bool) -> None:
        if not self.budget_ns:
            return
        if elapsed_ns <= self.budget_ns:
            self.max_rows = min(max(self.max_rows, 2 * rows), MAX_ROWS)
            self._strikes = 0
        elif on_loop and rows <= self.max_rows:
            self._strikes += 1
            if self._strikes >= SLOW_STRIKES:
                self.max_rows = rows // 2
                self._strikes = 0
