"""The server's side of an isolated Python model instance: its worker process, restarted when it fails.

Each instance runs its model.py (or what else a worker_code.WorkerSpec loads) in a worker process of its own
(backends/python/stub.py), started at load with subprocess (never fork: the server has threads and an event
loop). What the model does there cannot take the server down: when the worker crashes (exits, or dies of a
signal), does not answer within execute_timeout_seconds (it is killed), or after a batch is found above
worker_max_rss_bytes, the instance logs it and starts a new worker (which runs initialize again). A batch the
worker did not answer fails with a ModelhostError naming the model, the instance and what happened; one that was
answered is delivered.

Concurrency: the scheduler calls infer one batch at a time, then unload once. A restart runs on a thread
of its own so that the failed batch's error goes back at once; the next infer (or unload) waits for it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from modelhost.backends.base import CoreLender, Model, ModelSignature
from modelhost.backends.python.channel import ChannelClosed
from modelhost.backends.python.user_model import UserCodeError
from modelhost.backends.python.worker_code import WorkerSpec
from modelhost.backends.python.worker_process import IsolationOptions, Partial, WorkerProcess, timed_out
from modelhost.client_log import client_log
from modelhost.errors import ErrorKind, ModelhostError

log = logging.getLogger("modelhost.backends.python.backend")

class IsolatedModel(Model):
    """A Python model instance whose code runs in a worker process; see the module docstring."""

    runs_inline = False  # a hung worker must stall one instance thread, never the event loop
    runs_async = True  # its batches can be sent from the loop (infer_async), which a hang does not stall

    def __init__(self, spec: WorkerSpec, options: IsolationOptions, signature: ModelSignature,
                 threads: int | None = None, lender: CoreLender | None = None,
                 worker: WorkerProcess | None = None) -> None:
        """`threads`: the CPU threads the worker computes on, sent with each batch with the cores `lender` lends
        it while the rest of the server is idle (None: the worker is told nothing). `worker`: its first worker,
        already started (None: started here)."""
        self._threads = threads
        self._lender = lender
        self._spec = spec
        self._options = options
        self._signature = signature
        self._worker: WorkerProcess | None = worker or WorkerProcess(spec, options)  # raises UserCodeError
        self._restarting: threading.Thread | None = None
        log.info("%s runs in worker process %d", spec.label, self._worker.pid)

    def infer(self, inputs: dict[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        return self.execute(inputs, outputs, self.timeout_for(inputs))

    def execute(self, inputs: dict[str, np.ndarray], outputs: Sequence[str], timeout: float) -> dict[str, np.ndarray]:
        """One batch in the worker, which has `timeout` seconds (0: no limit) to answer."""
        worker = self._ready_worker()
        lent = self._borrow()
        try:
            reply = self.exchange(worker, ("execute", inputs, list(outputs), self._batch_threads(lent)), timeout,
                                  self._partials_of(inputs))
        finally:
            self._give_back(lent)
        return self._answer(worker, reply)

    def exchange(self, worker: WorkerProcess, message: tuple[Any, ...], timeout: float,
                 partial: Partial | None, on_call: Callable[[Any], Any] | None = None) -> tuple[Any, ...]:
        """The worker's reply to one batch's message; a worker that times out or dies fails it, and restarts."""
        try:
            return worker.call(message, timeout, partial, on_call)
        except TimeoutError:
            raise self._fail(worker, timed_out(timeout), ErrorKind.TIMEOUT) from None
        except ChannelClosed:
            raise self._fail(worker, f"{worker.exit_reason()} while running this batch", ErrorKind.INTERNAL) from None

    async def infer_async(self, inputs: dict[str, np.ndarray], outputs: Sequence[str],
                          signature: str = "") -> dict[str, np.ndarray] | None:
        """The batch run from the event loop, without a thread: the worker is sent it and answers while the loop
        goes on. None when the worker is not ready now (it restarts, or died between batches): the caller queues
        the batch for the instance's thread, which waits for it."""
        worker = self._worker
        if self._restarting is not None or worker is None or worker.process.poll() is not None:
            return None
        timeout = self.timeout_for(inputs)
        try:
            lent = self._borrow()
            try:
                reply = await worker.call_async(("execute", inputs, list(outputs), self._batch_threads(lent)),
                                                timeout, self._partials_of(inputs))
            finally:
                self._give_back(lent)
        except TimeoutError:
            raise self._fail(worker, timed_out(timeout), ErrorKind.TIMEOUT) from None
        except ChannelClosed:
            reason = await asyncio.to_thread(worker.exit_reason)
            raise self._fail(worker, f"{reason} while running this batch", ErrorKind.INTERNAL) from None
        return self._answer(worker, reply)

    def _partials_of(self, inputs: dict[str, np.ndarray]) -> Partial | None:
        """Where the worker's partial answers to this batch's requests go (a model that sends some says)."""
        return None

    def _borrow(self) -> int:
        if self._lender is None or self._threads is None:
            return 0
        return self._lender.borrow(self._lender.total - self._threads)

    def _give_back(self, lent: int) -> None:
        if lent and self._lender is not None:
            self._lender.give_back(lent)

    def _batch_threads(self, lent: int) -> int | None:
        return None if self._threads is None else self._threads + lent

    def timeout_for(self, inputs: dict[str, np.ndarray]) -> float:
        """How long the worker has for a batch of these inputs (execute_timeout_seconds)."""
        return self._options.execute_timeout_s

    def _answer(self, worker: WorkerProcess, reply: tuple[Any, ...]) -> dict[str, np.ndarray]:
        """The outputs of the worker's reply, or the error it reports."""
        if reply[0] != "ok":
            error = ModelhostError(ErrorKind(reply[1]), reply[2])
            if error.kind is ErrorKind.INTERNAL:  # the model's bug, not the caller's: the operator should see it
                client_log(log, logging.ERROR, "python-model-failed", "%s%s", error.message,
                           f"\n{reply[3]}" if reply[3] else "")
            raise error
        self._check_memory(worker)
        result: dict[str, np.ndarray] = reply[1]
        return result

    def signature(self) -> ModelSignature | None:
        return self._signature

    def process_id(self) -> int | None:
        worker = self._worker  # never waits for a restart: None while one runs
        return worker.pid if worker is not None and worker.process.poll() is None else None

    def worker_pid(self) -> int | None:
        """The pid of the current worker (None while it restarts or after unload): for tests and logs."""
        self._join_restart()
        return self._worker.pid if self._worker is not None else None

    def unload(self) -> None:
        self._join_restart()
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop(self._options.execute_timeout_s)

    def _ready_worker(self) -> WorkerProcess:
        self._join_restart()
        if self._worker is not None and self._worker.process.poll() is not None:
            # It died between batches (a thread of the model's, a signal from outside): no batch was lost.
            log.error("%s: its worker process (pid %d) %s between batches; restarting it",
                      self._spec.label, self._worker.pid, self._worker.exit_reason())
            self._worker.kill()
            self._worker = None
        if self._worker is None:  # died, or the last restart failed: start one for this batch
            try:
                self._worker = WorkerProcess(self._spec, self._options)
            except UserCodeError as exc:
                if exc.details:
                    log.error("%s\n%s", exc.message, exc.details)
                raise ModelhostError(ErrorKind.UNAVAILABLE,
                                     f"{self._spec.label}: its worker process cannot start: {exc.message}") from None
        return self._worker

    def _fail(self, worker: WorkerProcess, problem: str, kind: ErrorKind) -> ModelhostError:
        message = f"{self._spec.label}: its worker process (pid {worker.pid}) {problem}; the worker is restarting"
        log.error("%s", message)
        self._restart(worker, graceful=False)
        return ModelhostError(kind, message)

    def _check_memory(self, worker: WorkerProcess) -> None:
        limit = self._options.max_rss_bytes
        if not limit:
            return
        rss = worker.rss_bytes()
        if rss > limit:
            log.warning("%s: its worker process (pid %d) holds %d bytes, above worker_max_rss_bytes %d; "
                        "restarting it after this batch", self._spec.label, worker.pid, rss, limit)
            self._restart(worker, graceful=True)

    def _restart(self, old: WorkerProcess, graceful: bool) -> None:
        self._worker = None
        self._restarting = threading.Thread(
            target=self._replace, args=(old, graceful), name=f"{self._spec.label} restart", daemon=True
        )
        self._restarting.start()

    def _replace(self, old: WorkerProcess, graceful: bool) -> None:
        if graceful:
            old.stop(self._options.execute_timeout_s)
        else:
            old.kill()
        try:
            self._worker = WorkerProcess(self._spec, self._options)
        except UserCodeError as exc:  # the next batch tries again, and fails with this reason if it must
            log.error("%s: its worker process cannot restart: %s\n%s", self._spec.label, exc.message, exc.details)
            return
        log.info("%s restarted in worker process %d", self._spec.label, self._worker.pid)

    def _join_restart(self) -> None:
        if self._restarting is not None:
            self._restarting.join()
            self._restarting = None
