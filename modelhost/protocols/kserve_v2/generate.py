"""Triton's generate extension over HTTP: POST .../generate (one JSON answer) and .../generate_stream (each
response a server-sent event, `data: {...}`), for any model and foremost a decoupled one.

A request is a JSON object: each key that names one of the model's inputs is that input's data (a scalar or
a list, nested as the tensor's dims; shape [1] for a scalar, with a batch dim of 1 first when the model
batches), `parameters` and any other key are the request's parameters. A response is {"model_name",
"model_version", then each output: a scalar where it has one element, else its elements as a flat list;
BYTES as text}. A request that fails before its first response is answered with the usual JSON error and
status; an error after that (the model's error response, or a failure mid-stream) is an event
`data: {"error": "..."}` and ends the stream, as Triton does. The client leaving closes the stream: the model
sees its request cancelled.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

import numpy as np
import orjson

from modelhost.access import Api
from modelhost.core.dataplane import DataPlane
from modelhost.core.decoupled import Response
from modelhost.errors import ModelhostError, invalid, public_message
from modelhost.protocols.http.app import HttpRequest, HttpResponse, Route, json_response
from modelhost.protocols.json_body import json_object
from modelhost.types import DATATYPE_DTYPES, ElementBudget, InferRequest, InferResponse, check_json_depth

_MODEL = r"/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[0-9]+))?"
_SSE = b"text/event-stream; charset=utf-8"


def routes(dataplane: DataPlane) -> list[Route]:
    async def generate(request: HttpRequest) -> HttpResponse:
        bodies: list[dict[str, Any]] = []
        async with aclosing(dataplane.stream(_request(dataplane, request))) as answers:
            async for response, _final in answers:
                if isinstance(response, ModelhostError):
                    raise response
                if response.outputs:
                    if bodies:  # stop at the second: the model's stream is closed (cancelled), not collected
                        raise _not_one(request, "more than one response")
                    bodies.append(_body(response))
        if not bodies:
            raise _not_one(request, "no response")
        return json_response(bodies[0])

    async def generate_stream(request: HttpRequest) -> HttpResponse:
        answers = dataplane.stream(_request(dataplane, request))
        try:
            first = await anext(answers, None)  # a failure before the first response is a plain JSON error
        except BaseException:
            await answers.aclose()
            raise
        head = _event(first[0]) if first is not None and _sent(first) else b""
        if first is None or isinstance(first[0], ModelhostError):  # the stream ends with it
            await answers.aclose()
            more = _none()
        else:
            more = _events(answers)
        return HttpResponse(200, [head], [(b"content-type", _SSE), (b"cache-control", b"no-cache")], more=more)

    return [
        Route("POST", _MODEL + "/generate", generate, Api.INFERENCE),
        Route("POST", _MODEL + "/generate_stream", generate_stream, Api.INFERENCE),
    ]


def _not_one(request: HttpRequest, what: str) -> ModelhostError:
    return invalid(f"model '{request.params['model']}' sent {what} to the request; generate answers exactly one "
                   "(generate_stream answers any number)")


def _request(dataplane: DataPlane, request: HttpRequest) -> InferRequest:
    model, version = request.params["model"], request.params.get("version", "")
    document = json_object(request.body, "the inputs by name")
    metadata = dataplane.metadata(model, version)
    parameters = document.pop("parameters", None) or {}
    if not isinstance(parameters, dict):
        raise invalid("generate request field 'parameters' must be a JSON object")
    inputs = {}
    budget = dataplane.limits.budget()
    for spec in metadata.inputs:
        if spec.name in document:
            inputs[spec.name] = _tensor(spec.name, spec.datatype, document.pop(spec.name),
                                        metadata.max_batch_size > 0, budget)
    for key, value in document.items():  # what is not an input is a parameter, as Triton takes it
        if not isinstance(value, str | int | float | bool):
            raise invalid(f"generate request field '{key}' is neither an input of model '{model}' nor a "
                          "parameter (a string, number or boolean)")
        parameters[key] = value
    return InferRequest(model, inputs, version, parameters=parameters, received=request.received)


def _tensor(name: str, datatype: str, value: Any, batching: bool, budget: ElementBudget) -> np.ndarray:
    """An input's JSON value as the model takes it; INVALID_INPUT when it is not of the datatype or over the
    request's element budget."""
    check_json_depth(value, f"input '{name}'", budget.limits.max_json_depth)
    try:
        if datatype == "BYTES":
            array = np.array(value, dtype=np.object_)
            array = np.vectorize(_bytes, otypes=[np.object_])(array) if array.size else array
        else:
            array = np.array(value, dtype=DATATYPE_DTYPES[datatype])
    except (ValueError, TypeError, OverflowError) as exc:
        raise invalid(f"input '{name}' of datatype {datatype}: {exc}") from None
    if array.ndim == 0:
        array = array.reshape(1)
    if batching:
        array = array[np.newaxis]
    budget.take(f"input '{name}'", array.shape)
    return array


def _bytes(item: Any) -> bytes:
    if isinstance(item, str):
        return item.encode()
    raise TypeError(f"a BYTES input takes strings, got {type(item).__name__}")


def _body(response: InferResponse) -> dict[str, Any]:
    body: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    for name, array in response.outputs.items():
        flat = array.reshape(-1)
        values = [v.decode(errors="replace") if isinstance(v, bytes) else v for v in flat.tolist()]
        body[name] = values[0] if len(values) == 1 else values
    return body


def _sent(response: Response) -> bool:
    """Whether a response is an event: an empty final one (the final flag alone) is not."""
    answer, final = response
    return isinstance(answer, ModelhostError) or not (final and not answer.outputs)


def _event(answer: InferResponse | ModelhostError) -> bytes:
    document = {"error": public_message(answer.message)} if isinstance(answer, ModelhostError) else _body(answer)
    return b"data: " + orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n\n"


async def _events(answers: AsyncGenerator[Response, None]) -> AsyncIterator[bytes]:
    try:
        async for response in answers:
            if _sent(response):
                yield _event(response[0])
            if isinstance(response[0], ModelhostError):
                return
    except ModelhostError as exc:
        yield _event(exc)
    finally:
        await answers.aclose()


async def _none() -> AsyncIterator[bytes]:
    return
    yield
