"""A TorchServe archive's handler in its worker process: what backends/python/stub.py loads from a HandlerSpec, and
how one batch of the model's two signatures (handler_messages.py) becomes one call of the handler.

This module is imported by the worker to unpickle the spec: it imports nothing heavy at the top (torch and
TorchServe's `ts` modules load with the handler, in the worker only).
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modelhost.backends.python.user_model import UserCodeError
from modelhost.backends.torchserve.lazy_torch import loaded_torch
from modelhost.backends.torchserve.runtime import HandlerRuntime
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.handler_messages import BODY_INPUT, HANDLER_INPUT, RESPONSE_OUTPUT, HandlerRequest, HandlerResponse

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """One instance of an archive's handler (a worker_code.WorkerSpec): `path` is the unpacked archive, TorchServe's
    model_dir; `threads` the CPU threads its framework may use, unless the server's environment sets them."""

    path: str
    label: str
    model_name: str
    handler: str
    batch_size: int
    threads: int
    decode_input: bool = True
    envelope: str | None = None

    def environment(self) -> dict[str, str]:
        return {name: str(self.threads) for name in THREAD_VARIABLES if name not in os.environ}

    def load(self) -> HandlerWorkerModel:
        try:
            runtime = HandlerRuntime(Path(self.path), self.model_name, self.handler, self.batch_size,
                                     self.decode_input, self.envelope)
        except ModelhostError as exc:
            raise UserCodeError(f"{self.label}: {exc.message}") from None
        except (Exception, SystemExit) as exc:
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            raise UserCodeError(f"{self.label} failed to load: {last}", traceback.format_exc()) from None
        return HandlerWorkerModel(self.label, runtime, self.batch_size)


class HandlerWorkerModel:
    """The loaded handler (a worker_code.WorkerModel). The worker may be sent more requests than the handler's
    batch size (the backend's worker batch): they go to the handler in calls of at most that many, in order. A batch
    of the `handler` signature is answered request by request, failures included; one of the served signature
    (`body` tensors, from KServe V2 or TF Serving) is the handler's bodies, and fails as a whole when the handler
    fails any of its requests. The handler's intermediate answers to `handler` requests go to the server as they
    are sent (`send_partials_to`); tensor APIs get the last answer only."""

    def __init__(self, label: str, runtime: HandlerRuntime, batch_size: int) -> None:
        self._label = label
        self._runtime = runtime
        self._batch_size = batch_size
        self._threads = 0  # as the worker started: OMP_NUM_THREADS
        self._send_partial: Callable[[int, object], None] | None = None

    def send_partials_to(self, send: Callable[[int, object], None]) -> None:
        """`send(index, answer)` takes each intermediate answer to request `index` of the worker's batch."""
        self._send_partial = send

    def set_threads(self, threads: int) -> None:
        """Compute the next batch on `threads` CPU threads, where the handler's framework is torch."""
        torch = loaded_torch()  # a handler that never used torch is not made to import it here
        if torch is not None and threads != self._threads:
            torch.set_num_threads(threads)
            self._threads = threads

    def execute(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        if HANDLER_INPUT in inputs:
            requests = list(inputs[HANDLER_INPUT].reshape(-1))
            if not all(isinstance(request, HandlerRequest) for request in requests):
                raise ModelhostError(ErrorKind.INVALID_INPUT, f"{self._label}: signature 'handler' takes the requests "
                                     "of TorchServe's and SageMaker's APIs; tensor APIs send bytes to input 'body'")
            return {RESPONSE_OUTPUT: _objects(self._run(requests, self._send_partial))}
        bodies = inputs[BODY_INPUT].reshape(-1)
        answers = self._run([HandlerRequest({"body": ("", _bytes(body))}) for body in bodies], None)
        for index, answer in enumerate(answers):
            if answer.error or answer.status >= 400:
                raise ModelhostError(_kind(answer.status), f"{self._label} answered request {index} of the batch "
                                     f"with status {answer.status}: {answer.body[:500].decode(errors='replace')}")
        return {RESPONSE_OUTPUT: _objects([answer.body for answer in answers])}

    def _run(self, requests: list[HandlerRequest],
             send_partial: Callable[[int, object], None] | None) -> list[HandlerResponse]:
        """The requests the worker was sent, in handler calls of at most the handler's batch size, in order."""
        size = self._batch_size
        if len(requests) <= size:
            return self._runtime.run(requests, send_partial)
        answers = []
        for start in range(0, len(requests), size):
            partial = None if send_partial is None else _offset(send_partial, start)
            answers += self._runtime.run(requests[start:start + size], partial)
        return answers

    def finalize(self) -> None:
        """TorchServe calls nothing on a handler at unload: neither does modelhost."""


def _offset(send: Callable[[int, object], None], start: int) -> Callable[[int, HandlerResponse], None]:
    """`send` for a handler call whose first request is request `start` of the worker's batch."""
    return lambda index, answer: send(start + index, answer)


def _bytes(element: object) -> bytes:
    if isinstance(element, (bytes, bytearray, memoryview)):
        return bytes(element)
    if isinstance(element, str):
        return element.encode("utf-8")
    raise ModelhostError(ErrorKind.INVALID_INPUT, f"input 'body' holds a {type(element).__name__}, not bytes")


def _objects(items: list[HandlerResponse] | list[bytes]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


def _kind(status: int) -> ErrorKind:
    if status == 507:
        return ErrorKind.NO_MEMORY
    return ErrorKind.INVALID_INPUT if 400 <= status < 500 else ErrorKind.INTERNAL
