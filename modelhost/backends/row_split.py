"""One batch run as parts at once on cores the rest of the server leaves idle (core/spare_cores.py).

For a model whose rows are independent (it batches: max_batch_size > 0, so its inputs and outputs are
batch-major, as dynamic batching already assumes) and whose runtime may run it from several threads at once
(ONNX Runtime's sessions may): a batch predicted to take at least PART_MIN_NS per part is cut along its rows,
the first part run on the calling thread, the others on the lender's threads, each on the cores the
instance has plus those borrowed, and the outputs joined back in order. An instance computes on its share of
the cores (`InstanceSettings.threads`), so this is what lets one large request use the cores of idle workers
or instances. Measured on the 2-core VM, `rank` x 500 rows, a session of 1 intra-op thread: 3.5-3.9 ms for one
run, 1.9-2.1 ms for two runs of 250 rows at once, 2.0-2.2 ms for one run on a session of 2 threads.

The prediction is the last runs' time per row; a batch never split before runs whole first. Handing a part
to another thread and back costs 0.1-0.45 ms there, hence PART_MIN_NS; the first part, which the calling thread
starts at once, is longer by the rows a helper's measured wake-up is worth, so that the parts end together.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from functools import partial

import numpy as np

from modelhost.backends.base import CoreLender

PART_MIN_NS = 1_000_000
MAX_PARTS = 8
_SMOOTHING = 0.25  # weight of the newest run in the time per row

Feeds = dict[str, np.ndarray]
Run = Callable[[Feeds], list[np.ndarray]]


class RowSplitter:
    def __init__(self, lender: CoreLender, threads: int) -> None:
        """`threads`: the cores one part computes on (the instance's share)."""
        self._lender = lender
        self._threads = threads
        self._ns_per_row = 0.0  # what a row took on the instance's own threads, smoothed
        self._wake_ns = 0.0  # how long a helper took to start its part once handed it, smoothed
        self.enabled = True  # False once an output was seen not to be batch-major

    def run(self, run: Run, feeds: Feeds) -> list[np.ndarray]:
        """`run(feeds)` (the outputs in order, each batch-major), as parts when cores are idle to run them."""
        rows = _rows(feeds)
        wanted = min(MAX_PARTS, rows, int(self._ns_per_row * rows // PART_MIN_NS)) if self.enabled else 0
        borrowed = self._lender.borrow((wanted - 1) * self._threads) if wanted > 1 else 0
        parts = 1 + borrowed // self._threads
        try:
            started = time.monotonic_ns()
            outputs = run(feeds) if parts == 1 else self._run_parts(run, feeds, rows, parts)
            elapsed = time.monotonic_ns() - started
        finally:
            if borrowed:
                self._lender.give_back(borrowed)
        if rows:
            per_row = elapsed * parts / rows  # a part's rows ran on the instance's threads alone
            self._ns_per_row = per_row if not self._ns_per_row else (
                _SMOOTHING * per_row + (1 - _SMOOTHING) * self._ns_per_row)
        return outputs

    def _run_parts(self, run: Run, feeds: Feeds, rows: int, parts: int) -> list[np.ndarray]:
        bounds = self._bounds(rows, parts)
        pieces = [{name: array[bounds[i]:bounds[i + 1]] for name, array in feeds.items()} for i in range(parts)]
        handed = time.monotonic_ns()
        waits: list[int] = []
        helpers: list[Future[list[np.ndarray]]] = [
            self._lender.submit(partial(_started_late, run, piece, handed, waits)) for piece in pieces[1:]]
        try:
            first = run(pieces[0])
        finally:
            wait(helpers)  # none outlives the call, whatever failed
        if waits:
            late = sum(waits) / len(waits)
            self._wake_ns = late if not self._wake_ns else _SMOOTHING * late + (1 - _SMOOTHING) * self._wake_ns
        outputs = [first, *(helper.result() for helper in helpers)]
        for piece, result in zip(pieces, outputs):
            if any(array.ndim == 0 or array.shape[0] != _rows(piece) for array in result):
                self.enabled = False  # an output that is not batch-major cannot be joined: run it whole
                return run(feeds)
        return [np.concatenate([result[index] for result in outputs]) for index in range(len(first))]


    def _bounds(self, rows: int, parts: int) -> list[int]:
        """Where the parts start and end. The calling thread starts at once and a helper only once woken, so
        the first part takes the rows a helper's wake-up is worth more than the others: all end together."""
        lead = self._wake_ns / self._ns_per_row if self._ns_per_row else 0.0
        lead = min(lead, rows / parts)
        first = min(round((rows + (parts - 1) * lead) / parts), rows - (parts - 1))  # every helper a row at least
        rest = np.linspace(first, rows, parts).astype(int).tolist()
        return [0, *rest]


def _started_late(run: Run, piece: Feeds, handed: int, waits: list[int]) -> list[np.ndarray]:
    waits.append(time.monotonic_ns() - handed)  # list.append is atomic: helpers may append at once
    return run(piece)


def _rows(feeds: Feeds) -> int:
    first = next(iter(feeds.values()), None)
    return int(first.shape[0]) if first is not None and first.ndim else 0
