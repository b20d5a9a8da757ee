"""An isolated Triton Python model's side of a batch, in its worker process (stub.py): the batch's requests one
by one, and a decoupled model's responses sent to the server as they come.

Each streamed request's responses go over the channel as ("partial", index, (response, final)), from whichever
thread the model sends them; the batch's reply follows once every streamed request's final response is sent,
so that no response of a batch arrives after its reply (the instance is busy until then: a decoupled model that
sends after execute returns keeps its worker until its last response, within execute_timeout_seconds).

A BLS call (`exec`, `async_exec`) goes to the server as ("call", ("bls", request)) while the batch runs; the server
runs it through its data plane and sends ("answer", responses) back (worker_process.WorkerProcess.call). A streamed
request's `is_cancelled()` asks the same way, ("call", ("cancelled", index)), until the server says yes (at most
once per CANCEL_POLL_S: a round trip costs far more than the in-process flag's read, and models poll it in loops),
and so does the model loading API, ("call", ("control", action, name, ...)), answered ("ok", value) or ("error",
message). One call at a time per worker; `async_exec` waits for its answer as `exec` does.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from modelhost.backends.python import triton_utils as pb
from modelhost.backends.python.channel import Channel
from modelhost.errors import ModelhostError

if TYPE_CHECKING:
    from modelhost.backends.python.triton_model import RequestIdentity

Outputs = dict[str, np.ndarray]
CANCEL_POLL_S = 0.005  # how stale a worker's "not cancelled" may be


def portable(item: Outputs | ModelhostError | None) -> Any:
    """A response, or an error, as it pickles: an error as (ErrorKind value, message)."""
    return (item.kind.value, item.message) if isinstance(item, ModelhostError) else item


class _Stream:
    """One streamed request's responses, sent to the server (`PartialAnswers`'s part the model uses), and whether
    its client went away (asked of the server, until it says yes)."""

    def __init__(self, channel: Channel, lock: threading.Lock, index: int, server: WorkerBls) -> None:
        self._channel = channel
        self._lock = lock
        self._index = index
        self._server = server
        self._cancelled = False
        self._next_ask = 0.0
        self.done = threading.Event()

    @property
    def cancelled(self) -> bool:
        # A round trip costs about 130 µs: a model that polls in a tight loop asks once per CANCEL_POLL_S.
        if not self._cancelled and not self.done.is_set() and time.monotonic() >= self._next_ask:
            self._cancelled = bool(self._server.ask(("cancelled", self._index)))
            self._next_ask = time.monotonic() + CANCEL_POLL_S
        return self._cancelled

    def put(self, answer: tuple[Outputs | ModelhostError | None, bool], size: int, last: bool = False) -> None:
        item, final = answer
        with self._lock:
            self._channel.send(("partial", self._index, (portable(item), final)))
        if last:
            self.done.set()


class WorkerBls(pb.BlsHost):
    """BLS calls from a worker, answered by the server."""

    def __init__(self, channel: Channel, send_lock: threading.Lock) -> None:
        self._channel = channel
        self._send_lock = send_lock
        self._call_lock = threading.Lock()

    def call(self, request: pb.InferenceRequest, decoupled: bool) -> Any:
        wire = (request.model_name, request.model_version, request.request_id(), request.requested_output_names(),
                {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}, decoupled, request.parameters())
        responses = [response_from_wire(answer) for answer in self.ask(("bls", wire))]
        return iter(responses) if decoupled else responses[0]

    async def call_async(self, request: pb.InferenceRequest, decoupled: bool) -> Any:
        return self.call(request, decoupled)

    def control(self, action: str, name: str, *args: Any) -> Any:
        """The model loading API, run by the server: its answer, or its error raised here."""
        status, value = self.ask(("control", action, name, *args))
        if status != "ok":
            raise pb.TritonModelException(value)
        return value

    def ask(self, what: tuple[Any, ...]) -> Any:
        """Ask the server (a BLS call, or whether a request is cancelled) while the batch runs: its answer."""
        with self._call_lock:
            with self._send_lock:
                self._channel.send(("call", what))
            kind, answer = self._channel.receive()
        assert kind == "answer", f"expected the server's answer, got {kind!r}"
        return answer


def response_to_wire(response: pb.InferenceResponse) -> tuple[Any, ...]:
    error = response.error()
    if error is not None:
        return "error", error.code(), error.message()
    return "ok", {tensor.name(): tensor.as_numpy() for tensor in response.output_tensors()}


def response_from_wire(wire: tuple[Any, ...]) -> pb.InferenceResponse:
    if wire[0] == "error":
        return pb.InferenceResponse(error=pb.TritonError(wire[2], wire[1]))
    return pb.InferenceResponse([pb.Tensor(name, array) for name, array in wire[1].items()])


def execute_requests(model: Any, channel: Channel, inputs: list[Outputs], outputs: list[list[str]],
                     streams: list[bool], identities: list[RequestIdentity]) -> tuple[Any, ...]:
    """Run a "requests" message on a TritonUserModel: ("ok", each request's outputs or portable error)."""
    lock = threading.Lock()
    server = WorkerBls(channel, lock)
    pb.connect(server)
    senders = [_Stream(channel, lock, index, server) if streamed else None for index, streamed in enumerate(streams)]
    try:
        calls = [(request, sender, who) for request, sender, who in zip(inputs, senders, identities, strict=True)]
        results = model.execute_requests(calls, outputs)
    except ModelhostError as exc:
        return "error", exc.kind.value, exc.message, getattr(exc, "details", "")
    for sender, result in zip(senders, results, strict=True):
        if sender is not None and not isinstance(result, ModelhostError):
            sender.done.wait()
    return "ok", [portable(result) for result in results]
