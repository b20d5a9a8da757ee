"""An isolated Triton Python model instance (parameter isolation: process): its worker process runs the
TritonPythonModel (backends/python/triton_worker.py), and the server hands it a batch's requests one by one
with where each streamed request's responses go, as an in-process TritonModel gets them.

BLS calls are not available in the worker (exec answers an error response saying so).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from modelhost.backends.python.isolated import IsolatedModel
from modelhost.errors import ErrorKind, ModelhostError

Outputs = dict[str, np.ndarray]


class IsolatedTritonModel(IsolatedModel):
    takes_requests = True
    runs_async = False  # a lone request also goes to the instance thread, with its stream

    def infer_requests(self, requests: Sequence[tuple[Outputs, Any]],
                       outputs: Sequence[str]) -> list[Outputs | Exception]:
        worker = self._ready_worker()
        streams = [responses for _, responses in requests]

        def partial(index: int, answer: tuple[Any, bool]) -> None:
            item, final = answer
            if 0 <= index < len(streams) and streams[index] is not None:
                response = _local(item)
                size = sum(a.nbytes for a in response.values()) if isinstance(response, dict) else 0
                streams[index].put((response, final), size, final)

        message = ("requests", [inputs for inputs, _ in requests], list(outputs), [s is not None for s in streams])
        reply = self.exchange(worker, message, self._options.execute_timeout_s, partial)
        if reply[0] != "ok":
            self._answer(worker, reply)  # raises its error
        return [_local(result) or {} for result in reply[1]]

    def infer(self, inputs: Outputs, outputs: Sequence[str]) -> Outputs:
        result = self.infer_requests([(inputs, None)], outputs)[0]
        if isinstance(result, Exception):
            raise result
        return result


def _local(item: Any) -> Any:
    """A response from the worker: its outputs, None, or its error (sent as (ErrorKind value, message))."""
    if isinstance(item, tuple):
        return ModelhostError(ErrorKind(item[0]), item[1])
    return item
