"""An isolated Triton Python model instance (parameter isolation: process): its worker process runs the
TritonPythonModel (backends/python/triton_worker.py), and the server hands it a batch's requests one by one
with where each streamed request's responses go, as an in-process TritonModel gets them.

The worker's BLS calls come to the instance thread while it waits for the batch's reply, which runs each
through the server's BLS host (triton_bls.py) and sends its responses back; so does its question whether a
streamed request is cancelled (its client gone), answered from the request's PartialAnswers.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from modelhost.backends.python import triton_utils as pb
from modelhost.backends.python.isolated import IsolatedModel
from modelhost.backends.python.triton_model import identity
from modelhost.backends.python.triton_worker import response_to_wire
from modelhost.errors import ErrorKind, ModelhostError

log = logging.getLogger("modelhost.backends.python.triton_isolated")
Outputs = dict[str, np.ndarray]


class IsolatedTritonModel(IsolatedModel):
    takes_requests = True
    runs_async = False  # a lone request also goes to the instance thread, with its stream

    def infer_requests(self, requests: Sequence[tuple[Outputs, Any, Any]],
                       outputs: Sequence[Sequence[str]]) -> list[Outputs | Exception]:
        worker = self._ready_worker()
        streams = [responses for _, responses, _ in requests]

        def partial(index: int, answer: tuple[Any, bool]) -> None:
            item, final = answer
            if 0 <= index < len(streams) and streams[index] is not None:
                response = _local(item)
                size = sum(a.nbytes for a in response.values()) if isinstance(response, dict) else 0
                streams[index].put((response, final), size, final)

        message = ("requests", [inputs for inputs, _, _ in requests], [list(names) for names in outputs],
                   [s is not None for s in streams], [identity(origin) for _, _, origin in requests])
        def on_call(what: tuple[Any, ...]) -> Any:
            if what[0] == "cancelled":  # is_cancelled() of a streamed request, in the worker
                index = what[1]
                return 0 <= index < len(streams) and streams[index] is not None and bool(streams[index].cancelled)
            if what[0] == "control":  # the model loading API
                return _control(what[1:])
            return _bls_call(what[1])

        reply = self.exchange(worker, message, self._options.execute_timeout_s, partial, on_call)
        if reply[0] != "ok":
            self._answer(worker, reply)  # raises its error
        return [_local(result) or {} for result in reply[1]]

    def infer(self, inputs: Outputs, outputs: Sequence[str]) -> Outputs:
        result = self.infer_requests([(inputs, None, None)], [outputs])[0]
        if isinstance(result, Exception):
            raise result
        return result


def _bls_call(wire: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """A worker's BLS call, run by this process's BLS host: its responses, as they travel back."""
    model_name, version, request_id, names, inputs, decoupled, parameters = wire
    request = pb.InferenceRequest(model_name, names, [pb.Tensor(name, array) for name, array in inputs.items()],
                                  request_id, model_version=version, parameters=parameters)
    try:
        answer = pb.bls_host().call(request, decoupled)
    except Exception as exc:  # noqa: BLE001 - the worker waits for an answer: it gets the error as one
        log.exception("a BLS call from an isolated worker failed")
        answer = pb.InferenceResponse(error=pb.TritonError(f"the BLS call failed: {type(exc).__name__}"))
    responses = [answer] if isinstance(answer, pb.InferenceResponse) else list(answer)
    return [response_to_wire(response) for response in responses]


def _control(what: tuple[Any, ...]) -> tuple[str, Any]:
    """A worker's load_model, unload_model or is_model_ready, run by this process's BLS host."""
    try:
        return "ok", pb.bls_host().control(*what)
    except pb.TritonModelException as exc:
        return "error", str(exc)
    except Exception as exc:  # noqa: BLE001 - the worker waits for an answer: it gets the error as one
        log.exception("a model loading call from an isolated worker failed")
        return "error", f"the call failed: {type(exc).__name__}"


def _local(item: Any) -> Any:
    """A response from the worker: its outputs, None, or its error (sent as (ErrorKind value, message))."""
    if isinstance(item, tuple):
        return ModelhostError(ErrorKind(item[0]), item[1])
    return item
