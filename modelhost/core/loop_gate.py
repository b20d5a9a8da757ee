"""Which batches are cheap enough to run on the event loop itself, learned from measured executions.

Handing a batch to an instance thread and its result back costs two thread wake-ups, more than a tiny
model's whole run. A batch predicted to finish within the budget therefore runs on the loop.

The budget: a model's `inline_max_microseconds` parameter (0: never on the loop), or else what a
handoff actually takes, learned from the model's own requests (`adaptive`): the scheduler reports the
round trip of each request that went to an idle instance thread (`learn_handoff`: enqueue to answer on
the loop, less the execution), and the budget is the median of the last HANDOFF_SAMPLES, kept within
MIN_BUDGET_NS..MAX_BUDGET_NS. So that the figure stays current while requests run on the loop, every
PROBE_EVERY-th request the loop could take goes to a thread instead (`should_probe`). A handoff's cost is
the machine's and its load's more than Python's: on the 2-core VM this was measured on, a round trip
took about 20 µs at one moment and 110-450 µs at others, where a fixed 20 µs budget had tiny's 14-30 µs
executions closing the gate and every request paying the handoff (docs/benchmarks.md).

Cost grows with size, so the gate learns a size limit, in input elements (every input's, all dims: a
request of one row and a long sequence is not the cheap one-row request that opened the gate, nor, on
the loop, a way for a client to stall every other one): every execution within budget lets the loop
take batches of up to twice its size, and SLOW_STRIKES executions on the loop in a row over budget
halve the limit below their size (down to 0: nothing runs on the loop until a fast execution is seen
again). Slow executions on instance threads do not count against the loop: their time includes waiting
for the GIL while the loop is busy, which the loop itself would not pay. A model whose run time depends
on its inputs' values rather than their sizes can mislead the gate: give it `inline_max_microseconds` 0.

A request alone in the server (the only one received and not answered, over every front-end) has nobody
to hold up on the loop, and the handoff is then most of what the server adds to a large request's
latency (`rank` x 500, 2 ms: two wake-ups of 0.1-0.45 ms each on the 2-core VM). With a learned budget,
the gate therefore also learns `lone_max_size`: the largest size seen to execute within the lone budget
(the process's, `configure`: --lone-request-max-us; no extrapolation, unlike the handoff limit), halved
below the size of SLOW_STRIKES lone executions in a row over it. The budget is what a request arriving
meanwhile (another model's, a health check, a gRPC call) can wait for the loop.
"""

from __future__ import annotations

import collections
import statistics

MAX_SIZE = 1 << 30
SLOW_STRIKES = 2  # one slow execution is as likely a page fault or a preemption as a slow model
# The learned budget's bounds: 20 µs, the fixed budget before it was learned, for fast machines; 200 µs
# keeps a machine with slow wake-ups from holding the loop on one execution for longer.
MIN_BUDGET_NS = 20_000
MAX_BUDGET_NS = 200_000
HANDOFF_SAMPLES = 16
PROBE_EVERY = 64  # one request in this many that could run on the loop measures a handoff instead
LONE_BUDGET_NS = 5_000_000  # the default lone budget
_lone_budget_ns = LONE_BUDGET_NS


def configure(lone_budget_ns: int) -> None:
    """The process's lone budget, for the gates made after it (Server sets it from --lone-request-max-us; 0: none)."""
    global _lone_budget_ns
    _lone_budget_ns = lone_budget_ns


class LoopGate:
    def __init__(self, budget_ns: int | None) -> None:
        """`budget_ns`: fixed (0 keeps everything off the loop), or None to learn it from handoffs."""
        self.adaptive = budget_ns is None
        self.budget_ns = MIN_BUDGET_NS if budget_ns is None else budget_ns
        # Batches of at most this many input elements may run on the loop (-1: none, not even an empty one).
        self.max_size = -1 if budget_ns == 0 else 0
        self._strikes = 0
        self._handoffs: collections.deque[int] = collections.deque(maxlen=HANDOFF_SAMPLES)
        self._until_probe = PROBE_EVERY
        # Batches of at most this many input elements may run on the loop when alone in the server (-1: none).
        self._lone_budget_ns = _lone_budget_ns if self.adaptive else 0
        self.lone_max_size = 0 if self._lone_budget_ns else -1
        self._lone_strikes = 0

    def learn(self, size: int, elapsed_ns: int, on_loop: bool) -> None:
        """One execution of a batch of `size` input elements that took `elapsed_ns`."""
        if not self.budget_ns:
            return
        if self._lone_budget_ns:
            self._learn_lone(size, elapsed_ns, on_loop)
        if elapsed_ns <= self.budget_ns:
            self.max_size = min(max(self.max_size, 2 * size), MAX_SIZE)
            self._strikes = 0
        elif on_loop and size <= self.max_size:
            self._strikes += 1
            if self._strikes >= SLOW_STRIKES:
                self.max_size = size // 2
                self._strikes = 0

    def _learn_lone(self, size: int, elapsed_ns: int, on_loop: bool) -> None:
        if elapsed_ns <= self._lone_budget_ns:
            self.lone_max_size = max(self.lone_max_size, size)
            self._lone_strikes = 0
        elif on_loop and size <= self.lone_max_size:
            self._lone_strikes += 1
            if self._lone_strikes >= SLOW_STRIKES:
                self.lone_max_size = size // 2
                self._lone_strikes = 0

    def learn_handoff(self, round_trip_ns: int) -> None:
        """One request's round trip through an idle instance thread, its execution left out."""
        if not self.adaptive:
            return
        self._handoffs.append(round_trip_ns)
        self.budget_ns = min(max(int(statistics.median(self._handoffs)), MIN_BUDGET_NS), MAX_BUDGET_NS)

    def should_probe(self) -> bool:
        """Asked for each request that may run on the loop: True for the one in PROBE_EVERY that should
        take a thread, to measure the handoff (never with a fixed budget)."""
        if not self.adaptive:
            return False
        self._until_probe -= 1
        if self._until_probe:
            return False
        self._until_probe = PROBE_EVERY
        return True
