"""A Triton Python-backend model.py (`class TritonPythonModel`) run as it runs under Triton.

Its execute gets one pb_utils.InferenceRequest per client request of the batch (the scheduler passes them
separately: Model.takes_requests) and returns one InferenceResponse per request, in order; an error response
fails its own request only. A decoupled model (model_transaction_policy { decoupled: true }) returns None and
sends each request's responses through the request's response sender, from any thread and after execute has
returned if it likes, ending with TRITONSERVER_RESPONSE_COMPLETE_FINAL; they go to the request's `responses`
(core/partial_answers.py PartialAnswers) as (outputs or error, final). `async def execute` runs on an event
loop of the instance's own, where BLS `async_exec` calls are awaited.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from modelhost.backends.python import triton_utils as pb
from modelhost.backends.python.user_model import UserCodeSpec, call_user, check_outputs, execute_error
from modelhost.client_log import client_log
from modelhost.core.request_parameters import model_parameters
from modelhost.errors import ErrorKind, ModelhostError

log = logging.getLogger("modelhost.backends.python.triton_model")

Outputs = dict[str, np.ndarray]
# A TritonError's code -> the request's error, with Triton's HTTP statuses: INTERNAL 500, NOT_FOUND 404,
# UNAVAILABLE 503, UNSUPPORTED 501, the others 400 (gRPC: INVALID_ARGUMENT where Triton says UNKNOWN or CANCELLED).
ERROR_KINDS = {
    pb.TritonError.UNKNOWN: ErrorKind.INVALID_INPUT, pb.TritonError.INTERNAL: ErrorKind.INTERNAL,
    pb.TritonError.NOT_FOUND: ErrorKind.NOT_FOUND, pb.TritonError.INVALID_ARG: ErrorKind.INVALID_INPUT,
    pb.TritonError.UNAVAILABLE: ErrorKind.UNAVAILABLE, pb.TritonError.UNSUPPORTED: ErrorKind.UNSUPPORTED,
    pb.TritonError.ALREADY_EXISTS: ErrorKind.ALREADY_EXISTS, pb.TritonError.CANCELLED: ErrorKind.INVALID_INPUT,
}


class Responses(Protocol):
    """Where one request's decoupled responses go (core/partial_answers.py PartialAnswers)."""

    @property
    def cancelled(self) -> bool: ...

    def put(self, answer: Any, size: int, last: bool = False) -> None: ...


@dataclass(frozen=True, slots=True)
class RequestIdentity:
    """What a Triton model's InferenceRequest tells of the client's request beyond its tensors."""

    request_id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    correlation_id: int | str = 0  # the sequence's id, for a sequence request
    flags: int = 0  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END
    timeout: int = 0  # µs, the request's `timeout` parameter


# One request of a batch: its inputs, where its responses go (decoupled) or None, and who sent it.
Call = tuple[Outputs, "Responses | None", RequestIdentity]


def identity(origin: Any) -> RequestIdentity:
    """What the model sees of the client's request (a types.InferRequest), or nothing."""
    if origin is None:
        return RequestIdentity()
    parameters = origin.parameters
    if not parameters:
        return RequestIdentity(origin.id)
    flags = ((pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START if parameters.get("sequence_start") is True else 0)
             | (pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END if parameters.get("sequence_end") is True else 0))
    correlation_id = parameters.get("sequence_id", 0)
    timeout = parameters.get("timeout", 0)
    return RequestIdentity(origin.id, model_parameters(parameters),
                           correlation_id if isinstance(correlation_id, (int, str)) else 0, flags,
                           timeout if isinstance(timeout, int) and not isinstance(timeout, bool) else 0)


def triton_args(spec: UserCodeSpec) -> dict[str, str]:
    """initialize's argument as Triton gives it: strings, the config as a JSON string."""
    args = spec.args
    return {
        "model_config": json.dumps(args["model_config"]),
        "model_instance_kind": "CPU",
        "model_instance_name": f"{args['model_name']}_0_{args['model_instance_index']}",
        "model_instance_device_id": "0",
        "model_repository": args["model_directory"],
        "model_version": str(args["model_version"]),
        "model_name": args["model_name"],
    }


class TritonUserModel:
    """One loaded instance of a TritonPythonModel; not thread-safe (one batch at a time)."""

    kind = "triton"  # what an isolated worker tells the server it loaded

    def __init__(self, spec: UserCodeSpec, instance: Any) -> None:
        self._spec = spec
        self._instance = instance
        self._rules = {rule.name: rule for rule in spec.outputs}
        self.decoupled = pb.using_decoupled_model_transaction_policy(spec.args["model_config"])
        self._loop: asyncio.AbstractEventLoop | None = None

    def execute(self, inputs: Outputs, outputs: list[str]) -> Outputs:
        """One request (an isolated worker's whole batch, or a lone request); raises its error."""
        result = self.execute_requests([(inputs, None, RequestIdentity())], [outputs])[0]
        if isinstance(result, ModelhostError):
            raise result
        return result

    def execute_requests(self, calls: Sequence[Call], outputs: Sequence[list[str]]) -> list[Outputs | ModelhostError]:
        """Run execute on a batch of requests (each with the outputs it asks for): each one's outputs, or its
        error."""
        results: list[Outputs | ModelhostError] = [{} for _ in calls]
        requests, indices = [], []
        for index, ((inputs, responses, who), names) in enumerate(zip(calls, outputs, strict=True)):
            if self.decoupled and responses is None:
                results[index] = ModelhostError(ErrorKind.UNSUPPORTED, (
                    f"model '{self._spec.args['model_name']}' is decoupled (model_transaction_policy decoupled): "
                    "it answers through a stream only (gRPC ModelStreamInfer, HTTP generate_stream)"))
                continue
            requests.append(self._request(inputs, responses, names, who))
            indices.append(index)
        if not requests:
            return results
        answers = self._run(requests)
        if self.decoupled:
            if answers is not None:
                client_log(log, logging.WARNING, "python-model-failed", "%s: a decoupled model's execute "
                           "returned %s, not None: ignored", self._spec.label, type(answers).__name__)
            return results
        if not isinstance(answers, list | tuple) or len(answers) != len(requests):
            count = len(answers) if isinstance(answers, list | tuple) else type(answers).__name__
            raise ModelhostError(ErrorKind.INTERNAL, f"{self._spec.label}: execute returned {count} responses for "
                                 f"{len(requests)} requests: it must return one InferenceResponse per request")
        for index, answer in zip(indices, answers, strict=True):
            results[index] = self._outputs(answer, outputs[index])
        return results

    def finalize(self) -> None:
        try:
            finalize = getattr(self._instance, "finalize", None)
            if finalize is not None:
                call_user(self._spec, "finalize", finalize)
        finally:
            self._instance = None
            sys.modules.pop(self._spec.module_name, None)
            if self._loop is not None:
                self._loop.close()

    def _run(self, requests: list[pb.InferenceRequest]) -> Any:
        try:
            answers = self._instance.execute(requests)
            if inspect.iscoroutine(answers):
                if self._loop is None:
                    self._loop = asyncio.new_event_loop()
                answers = self._loop.run_until_complete(answers)
            return answers
        except ModelhostError:
            raise
        except pb.TritonError as exc:
            raise ModelhostError(ERROR_KINDS.get(exc.code(), ErrorKind.INTERNAL), exc.message()) from None
        except (Exception, SystemExit) as exc:
            raise execute_error(self._spec, exc) from exc

    def _request(self, inputs: Outputs, responses: Responses | None, outputs: list[str],
                 who: RequestIdentity) -> pb.InferenceRequest:
        request = pb.InferenceRequest(self._spec.args["model_name"], outputs,
                                      [pb.Tensor(name, array) for name, array in inputs.items()], who.request_id,
                                      correlation_id=who.correlation_id, flags=who.flags, timeout=who.timeout,
                                      parameters=who.parameters)
        if responses is not None:

            def deliver(response: pb.InferenceResponse | None, final: bool) -> None:
                item = None if response is None else self._outputs(response, outputs)
                size = sum(a.nbytes for a in item.values()) if isinstance(item, dict) else 0
                responses.put((item, final), size, final)

            def cancelled() -> bool:
                return responses.cancelled

            request._sender = pb.InferenceResponseSender(deliver, cancelled)
            request._cancelled = cancelled
        return request

    def _outputs(self, response: Any, outputs: list[str]) -> Outputs | ModelhostError:
        """A response's requested outputs, checked against the config, or its error."""
        if not isinstance(response, pb.InferenceResponse):
            return ModelhostError(ErrorKind.INTERNAL, f"{self._spec.label}: execute returned a "
                                  f"{type(response).__name__} where an InferenceResponse belongs")
        error = response.error()
        if error is not None:
            return ModelhostError(ERROR_KINDS.get(error.code(), ErrorKind.INTERNAL), error.message())
        arrays = {tensor.name(): tensor.as_numpy() for tensor in response.output_tensors()}
        try:
            # As Triton: a response may hold some of the outputs; the others are absent from the answer (and from an
            # ensemble's later steps, which take them as missing optional inputs).
            # A response is its request's alone, so its shape is not checked against the request's or the config's:
            # Triton passes it as the model gives it (its qa/python_models/init_args answers [1] to a [2, 2] request
            # of a model whose output is [-1, -1]).
            return check_outputs(self._spec.label, self._rules, arrays, outputs, None, partial=True, shapes=False)
        except ModelhostError as exc:  # the model's bug, not the client's: the operator should see it
            client_log(log, logging.ERROR, "python-model-failed", "%s", exc.message)
            return exc


def load_triton_model(spec: UserCodeSpec, model_class: type) -> TritonUserModel:
    """Construct the TritonPythonModel and run initialize with Triton's args; raises UserCodeError."""
    instance = call_user(spec, "TritonPythonModel()", model_class)
    initialize = getattr(instance, "initialize", None)
    if initialize is not None:
        call_user(spec, "initialize", initialize, triton_args(spec))
    return TritonUserModel(spec, instance)

