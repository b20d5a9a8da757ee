"""BLS in the server: a Triton Python model's `pb_utils.InferenceRequest(...).exec()` / `async_exec()` runs the
request it made on another model through the data plane, as a client's request would run (checks, queues,
statistics), and answers an InferenceResponse: its outputs, or its error (the call itself never raises).

The model calls from its instance thread (a TritonModel never runs on the event loop: runs_inline is False);
the request runs on the loop (asyncio.run_coroutine_threadsafe) and the thread waits for it. `exec` from the
loop's own thread would wait on itself forever, so it answers an error instead. `exec(decoupled=True)` answers
an iterator over the model's responses, the final (possibly empty) one included, gathered as they come.

The model loading API (pb_utils.load_model, unload_model, is_model_ready) goes to the server's Control as a
client's load and unload requests do: explicit model control mode only, and files it uploads are code the
--user-code policy judges as a client's uploads.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Coroutine, Iterator
from typing import Any

from modelhost.backends.python import triton_utils as pb
from modelhost.core.control import Control
from modelhost.core.dataplane import DataPlane
from modelhost.core.load_request import LoadRequest
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.types import InferRequest, InferResponse, RequestedOutput

TRITON_CODES = {
    ErrorKind.INVALID_INPUT: pb.TritonError.INVALID_ARG, ErrorKind.NOT_FOUND: pb.TritonError.NOT_FOUND,
    ErrorKind.UNAVAILABLE: pb.TritonError.UNAVAILABLE, ErrorKind.OVERLOADED: pb.TritonError.UNAVAILABLE,
    ErrorKind.UNSUPPORTED: pb.TritonError.UNSUPPORTED, ErrorKind.ALREADY_EXISTS: pb.TritonError.ALREADY_EXISTS,
}
Answer = pb.InferenceResponse | Iterator[pb.InferenceResponse]


def connect(dataplane: DataPlane, control: Control | None = None) -> None:
    """Serve the BLS calls of this process's Triton Python models through `dataplane`, and their model loading API
    through `control` (its model control mode's rules); on the event loop."""
    pb.connect(ServerBls(dataplane, asyncio.get_running_loop(), control))


class ServerBls(pb.BlsHost):
    def __init__(self, dataplane: DataPlane, loop: asyncio.AbstractEventLoop, control: Control | None = None) -> None:
        self._dataplane = dataplane
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._control = control

    def control(self, action: str, name: str, *args: Any) -> Any:
        """load_model, unload_model (as a client's load and unload requests: explicit mode only, --user-code for
        uploaded files) and is_model_ready; from a model's thread, never the event loop's."""
        if action == "ready":
            return self._dataplane.model_ready(name, args[0])
        if self._control is None or threading.get_ident() == self._loop_thread:
            raise pb.TritonModelException(f"cannot {action} model '{name}' from here (the server's event loop, or "
                                          "a process without model control)")
        if action == "load":
            config, files = args
            work = self._control.load(name, LoadRequest(config or None, _file_parameters(files)))
        else:
            work = self._control.unload(name, bool(args[0]))
        try:
            asyncio.run_coroutine_threadsafe(work, self._loop).result()
        except ModelhostError as exc:
            raise pb.TritonModelException(exc.message) from None

    def call(self, request: pb.InferenceRequest, decoupled: bool) -> Answer:
        if threading.get_ident() == self._loop_thread:
            return _error(ModelhostError(ErrorKind.UNSUPPORTED, "a BLS exec() cannot run on the server's event "
                                         "loop (it would wait on itself)"))
        return asyncio.run_coroutine_threadsafe(self._call(request, decoupled), self._loop).result()

    async def call_async(self, request: pb.InferenceRequest, decoupled: bool) -> Answer:
        call: Coroutine[Any, Any, Answer] = self._call(request, decoupled)
        if asyncio.get_running_loop() is self._loop:
            return await call
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call, self._loop))

    async def _call(self, request: pb.InferenceRequest, decoupled: bool) -> Answer:
        try:
            infer = _infer_request(request)
            if not decoupled:
                return _response(await self._dataplane.infer(infer))
            answers = []
            async for response, _final in self._dataplane.stream(infer):
                answers.append(_error(response) if isinstance(response, ModelhostError) else _response(response))
            return iter(answers)
        except ModelhostError as exc:
            return _error(exc) if not decoupled else iter([_error(exc)])


def _file_parameters(files: Any) -> dict[str, bytes]:
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, bytes) for k, v in files.items()):
        raise pb.TritonModelException("load_model files must map 'file:<version>/<path>' to the file's bytes")
    return files


def _infer_request(request: pb.InferenceRequest) -> InferRequest:
    if not request.model_name:
        raise ModelhostError(ErrorKind.INVALID_INPUT, "a BLS InferenceRequest needs a model_name")
    version = "" if request.model_version < 0 else str(request.model_version)
    names = request.requested_output_names()
    return InferRequest(request.model_name, {tensor.name(): tensor.as_numpy() for tensor in request.inputs()},
                        version, request.request_id(), [RequestedOutput(name) for name in names] or None,
                        json.loads(request.parameters()))


def _response(response: InferResponse) -> pb.InferenceResponse:
    return pb.InferenceResponse([pb.Tensor(name, array) for name, array in response.outputs.items()])


def _error(error: ModelhostError) -> pb.InferenceResponse:
    return pb.InferenceResponse(error=pb.TritonError(error.message, TRITON_CODES.get(error.kind,
                                                                                       pb.TritonError.INTERNAL)))
