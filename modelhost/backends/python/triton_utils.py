"""modelhost's own `triton_python_backend_utils`: the API a Triton Python-backend `model.py` imports as pb_utils.

`install()` registers this module in sys.modules under Triton's name just before the Python backend imports a
model.py (in the server, or in an isolated model's worker): nothing else in modelhost imports it by that name,
and there is no real package of that name to shadow (Triton ships it inside its own stub process only).

What the model sees: `InferenceRequest` (its inputs as `Tensor`s, id, requested outputs, response sender,
cancellation; or, made by the model, a BLS call to another model: `exec`/`async_exec`), `InferenceResponse`
(output tensors, or an error), `TritonError`, and the config helpers. A BLS call goes to whatever `connect`
registered (backends/python/triton_bls.py in the server, triton_worker.py in an isolated model's worker).
Light on purpose: numpy only, as the worker imports it.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from modelhost.backends.python.triton_helpers import (
    Logger,
    TritonModelException,
    deserialize_bytes_tensor,
    get_input_config_by_name,
    get_output_config_by_name,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
    using_decoupled_model_transaction_policy,
)
from modelhost.backends.python.triton_metrics import Metric, MetricFamily
from modelhost.backends.python.triton_model_config import ModelConfig

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
MODULE_NAME = "triton_python_backend_utils"

def install() -> None:
    """Make `import triton_python_backend_utils` find this module (idempotent)."""
    sys.modules.setdefault(MODULE_NAME, sys.modules[__name__])


class TritonError(Exception):
    """An error a model reports for one request (InferenceResponse(error=...)) or raises; `code` as Triton's."""

    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, msg: str, code: int = 1) -> None:
        super().__init__(msg)
        self._message = str(msg)
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class Tensor:
    """A named numpy array (BYTES: an object array of bytes). On the CPU always: modelhost has no GPU memory."""

    def __init__(self, name: str, array: Any) -> None:
        if not isinstance(array, np.ndarray):
            raise TritonError(f"tensor '{name}': expected a numpy array, got {type(array).__name__}")
        if array.dtype.kind in "SU":
            array = array.astype(np.object_)
        self._name = name
        self._array: np.ndarray = array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule sharing the tensor's memory. A read-only tensor (a request's input) goes out as DLPack
        1.0's versioned capsule, which carries the read-only flag the older one cannot (torch reads both)."""
        if self._array.flags.writeable:
            return self._array.__dlpack__()
        return self._array.__dlpack__(max_version=(1, 0))

    @classmethod
    def from_dlpack(cls, name: str, capsule: Any) -> Tensor:
        """From a DLPack capsule (torch.utils.dlpack.to_dlpack(t), as Triton's examples pass) or an object with
        __dlpack__ (a torch tensor, a numpy array), sharing its memory; a CPU tensor only."""
        source = capsule if hasattr(capsule, "__dlpack__") else _CpuCapsule(capsule)
        try:
            return cls(name, np.from_dlpack(source))
        except (TypeError, ValueError, RuntimeError, BufferError) as exc:
            raise TritonError(f"tensor '{name}': from_dlpack cannot read it as a CPU tensor: {exc}") from None


class _CpuCapsule:
    """A bare DLPack capsule as numpy reads one: through __dlpack__, on the CPU (numpy then checks the capsule's own
    device, and refuses a GPU one)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return 1, 0  # kDLCPU, device 0


class InferenceResponse:
    def __init__(self, output_tensors: Sequence[Tensor] = (), error: TritonError | None = None,
                 parameters: dict[str, Any] | str | None = None) -> None:
        self._outputs = list(output_tensors)
        self._error = error
        self._parameters = parameters if isinstance(parameters, str) else json.dumps(parameters or {})

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters


class InferenceResponseSender:
    """Sends one request's responses, for a decoupled model: any number, from any thread, then one with
    TRITONSERVER_RESPONSE_COMPLETE_FINAL (the response may be None then)."""

    def __init__(self, deliver: Callable[[InferenceResponse | None, bool], None],
                 cancelled: Callable[[], bool]) -> None:
        self._deliver = deliver
        self._cancelled = cancelled
        self._closed = False
        self._lock = threading.Lock()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        final = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        with self._lock:
            if self._closed:
                raise TritonError("Unable to send response. Response sender has been closed.")
            if response is None and not final:
                raise TritonError("a response sender sends None only with TRITONSERVER_RESPONSE_COMPLETE_FINAL")
            self._closed = final
        self._deliver(response, final)

    def is_cancelled(self) -> bool:
        return self._cancelled()

    @property
    def closed(self) -> bool:
        return self._closed


def _never() -> bool:
    return False


class InferenceRequest:
    """A client's request as the model's execute gets it, or one the model makes for a BLS call."""

    def __init__(self, model_name: str = "", requested_output_names: Sequence[str] = (),
                 inputs: Sequence[Tensor] = (), request_id: str = "", correlation_id: int | str = 0,
                 model_version: int = -1, flags: int = 0, timeout: int = 0,
                 parameters: dict[str, Any] | str | None = None, **_ignored: Any) -> None:
        self.model_name = model_name
        self.model_version = model_version
        self._outputs = list(requested_output_names)
        self._inputs = list(inputs)
        self._id = request_id
        self._correlation_id = correlation_id
        self._flags = flags
        self._timeout = timeout
        self._parameters = parameters if isinstance(parameters, str) else json.dumps(parameters or {})
        self._sender: InferenceResponseSender | None = None
        self._cancelled: Callable[[], bool] = _never

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return self._parameters

    def requested_output_names(self) -> list[str]:
        return self._outputs

    def is_cancelled(self) -> bool:
        """Whether the client went away (its stream closed): the model may stop working on the request."""
        return self._cancelled()

    def set_release_flags(self, flags: int) -> None:
        if flags & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            raise TritonError("modelhost does not reschedule requests (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)",
                              TritonError.UNSUPPORTED)

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            raise TritonError("only a decoupled model's requests have a response sender "
                              "(model_transaction_policy { decoupled: true })")
        return self._sender

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on the model it names (BLS): its InferenceResponse (its error set where it failed),
        or with decoupled=True an iterator over a decoupled model's responses."""
        return _host.call(self, decoupled)

    def async_exec(self, decoupled: bool = False) -> Any:
        """`exec` as an awaitable, for an `async def execute`."""
        return _host.call_async(self, decoupled)


class BlsHost:
    """Where BLS calls go (set by `connect`); the base answers every call with an error."""

    def call(self, request: InferenceRequest, decoupled: bool) -> InferenceResponse | Iterator[InferenceResponse]:
        return _no_bls()

    async def call_async(self, request: InferenceRequest,
                         decoupled: bool) -> InferenceResponse | Iterator[InferenceResponse]:
        return _no_bls()

    def control(self, action: str, name: str, *args: Any) -> Any:
        """The model loading API: ("load", name, config, files), ("unload", name, unload_dependents) or
        ("ready", name, version); raises TritonModelException when it fails."""
        raise TritonModelException("the model loading API is not available here: no server runs it")


def _no_bls() -> InferenceResponse:
    return InferenceResponse(error=TritonError("BLS calls are not available here: no server runs them",
                                               TritonError.UNSUPPORTED))


_host: BlsHost = BlsHost()


def connect(host: BlsHost) -> None:
    global _host
    _host = host


def bls_host() -> BlsHost:
    return _host


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) a model of the server, as a client's load request (explicit model control mode only)."""
    _host.control("load", model_name, config, dict(files or {}))


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    _host.control("unload", model_name, unload_dependents)


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    return bool(_host.control("ready", model_name, str(model_version)))


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return next((tensor for tensor in request.inputs() if tensor.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((tensor for tensor in response.output_tensors() if tensor.name() == name), None)


__all__ = [  # what a model.py finds in pb_utils
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TritonError",
    "TritonModelException",
    "Tensor",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "ModelConfig",
    "MetricFamily",
    "Metric",
    "get_input_tensor_by_name",
    "load_model",
    "unload_model",
    "is_model_ready",
    "get_output_tensor_by_name",
    "Logger",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_output_config_by_name",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "using_decoupled_model_transaction_policy",
]
