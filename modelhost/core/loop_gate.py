"""Which batches are cheap enough to run on the event loop itself, learned from measured executions.

Handing a batch to an instance thread and its result back costs two thread wake-ups: about 0.1 ms
of latency and 25 µs of the loop's time per execution on a 2-core VM (benchmarks/inprocess.py), more
than a tiny model's whole run. A batch predicted to finish within the budget therefore runs on the
loop. The default budget (20 µs, policy.py) stays under those 25 µs, so a run on the loop never costs
the loop more than the handoff it saves.

Cost grows with rows, so the gate learns a row limit: every execution within budget lets the loop
take batches of up to twice its rows, and SLOW_STRIKES executions on the loop in a row over budget
halve the limit below their rows (down to 0: nothing runs on the loop until a fast execution is seen
again). Slow executions on instance threads do not count against the loop: their time includes
waiting for the GIL while the loop is busy, which the loop itself would not pay.
"""

from __future__ import annotations

MAX_ROWS = 1 << 20
SLOW_STRIKES = 2  # one slow execution is as likely a page fault or a preemption as a slow model


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
