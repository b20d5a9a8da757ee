"""The backend contract: a backend loads model files into Model instances that run batches."""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from modelhost.config.datatypes import config_type_name, v2_datatype
from modelhost.config.model_config_pb2 import ModelConfig
from modelhost.config.overrides import ModelOverrides
from modelhost.config.pbtxt import ConfigError
from modelhost.types import TensorSpec

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ModelSignature:
    """Inputs and outputs as the model file declares them (full shapes, -1 where variable); `method` is what the
    file says the signature does, where it says (a SavedModel's method_name, "tensorflow/serving/classify")."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    method: str = ""


class CoreLender(Protocol):
    """Cores the rest of the server leaves idle now (core/spare_cores.py), for an execution that can use more than
    its instance's threads: `borrow` claims up to `most` of them, `submit` runs work on a thread of the server's
    compute priority, `give_back` returns the cores once the execution is done; `total` is every core the
    server computes on."""

    total: int

    def borrow(self, most: int) -> int: ...

    def submit(self, work: Callable[[], T]) -> Future[T]: ...

    def give_back(self, cores: int) -> None: ...


@dataclass(frozen=True, slots=True)
class InstanceSettings:
    """What the core decides for one instance: its index, the CPU threads it may use, and where it may borrow
    more while they are idle (None: nowhere)."""

    index: int
    threads: int
    lender: CoreLender | None = None
    gpu: int | None = None  # the CUDA device it runs on (a KIND_GPU group's, core/devices.py); None: CPU


class RowUpdates(Protocol):
    """A model's table of rows that takes updates while serving (an embedding table)."""

    @property
    def dim(self) -> int: ...

    def update(self, ids: np.ndarray, vectors: np.ndarray) -> int:
        """Add or replace rows (ids [n] int64, vectors [n, dim] float32), durable when it returns; returns how
        many were new. Raises ValueError for values the table cannot hold. Blocking (it syncs to disk)."""
        ...


class Model(abc.ABC):
    """One loaded instance. `infer` is never called concurrently on the same instance."""

    # False for a model whose call may block however cheap it has been (it waits on another process):
    # the scheduler then never runs it on the event loop, where a hang would stall every request.
    runs_inline: bool = True
    # True for a model with `infer_async`: a batch the scheduler can run from the event loop without blocking it
    # (it waits on another process), sparing a thread's handoff when an instance is free and nothing waits.
    runs_async: bool = False
    # True for a model with `infer_requests`: the scheduler hands it a batch's requests one by one (Triton's Python
    # API gives execute one request object per client request) instead of concatenating them.
    takes_requests: bool = False

    @abc.abstractmethod
    def infer(self, inputs: dict[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        """Run one batch; return at least the named outputs."""

    def infer_requests(self, requests: Sequence[tuple[dict[str, np.ndarray], Any, Any]],
                       outputs: Sequence[Sequence[str]]) -> list[dict[str, np.ndarray] | Exception]:
        """Run one batch of requests, where `takes_requests`: each request's (inputs, where its decoupled responses
        go or None, the client's types.InferRequest or None) and the outputs it asks for, in; each one's outputs or
        its own error, out."""
        raise NotImplementedError(f"{type(self).__name__} does not take requests one by one")

    async def infer_async(self, inputs: dict[str, np.ndarray], outputs: Sequence[str],
                          signature: str = "") -> dict[str, np.ndarray] | None:
        """Run one batch (through the named signature, "" for infer's) from the event loop, where `runs_async`;
        None when it cannot now (the scheduler then queues the batch for the instance's thread)."""
        raise NotImplementedError(f"{type(self).__name__} does not run from the event loop")

    def unload(self) -> None:  # noqa: B027 - optional hook: most models free memory when dropped
        """Free the instance's memory; it is never used again."""

    def sibling(self, instance: InstanceSettings) -> Model | None:
        """Another instance, `instance`, that runs on this one's loaded weights, for a model whose runs may go on at
        once on one copy (TensorFlow's signature functions, as TF Serving's batch threads share a session; an ONNX
        session its config shares); None: the core loads that instance from the model file."""
        return None

    def signature(self) -> ModelSignature | None:
        """The inputs and outputs this loaded instance declares, if it can tell: spares `describe`."""
        return None

    def process_id(self) -> int | None:
        """The process the instance runs in when it is not the server's (a worker process), if it runs now."""
        return None

    def row_updates(self) -> RowUpdates | None:
        """The table this model serves that takes row updates while serving (an embedding table), if any."""
        return None

    def signature_name(self) -> str:
        """The name the model file gives the signature `infer` runs ("" where it names none)."""
        return ""

    def signatures(self) -> Mapping[str, ModelSignature]:
        """The model file's other named signatures, which `infer_signature` runs (a SavedModel has several)."""
        return {}

    def infer_signature(
        self, signature: str, inputs: dict[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """Run one batch through the named signature, one of `signatures()`."""
        raise NotImplementedError(f"{type(self).__name__} has no signature '{signature}'")


class Backend(abc.ABC):
    """Stateless factory for one model format. Called off the event loop; may be slow."""

    name: str
    platform: str
    default_filename: str
    # Each instance starts a thread pool of its own (InstanceSettings.threads) at its load and joins it at its unload.
    pool_per_instance = False

    def warm_up(self) -> None:  # noqa: B027 - optional hook
        """Create the framework's process-wide state (runtime environment, kernel registries) now, so that
        it is not counted against the first model loaded; blocking, called once."""

    def code_in(self, filename: str) -> str | None:
        """What Python code loading the model file `filename` runs, in words for an error ("model.py"), or
        None when it runs none; core/code_policy.py decides whether it may (--user-code)."""
        return None

    def model_path(self, version_dir: Path, filename: str) -> Path:
        """Where a version's model is: `filename` in the version directory, unless the backend knows
        another layout for it."""
        return version_dir / filename

    def configure(self, path: Path, config: ModelConfig, overrides: ModelOverrides) -> None:  # noqa: B027
        """Set, in `config`, what the model file at `path` says about serving it where the config leaves it unset
        (a TorchServe archive's batch size, workers and timeouts); `overrides` (the endpoint's, applied after this)
        for what the backend must decide now. Called once per load of the model, with its newest version to load,
        before overrides and defaults are applied; raises ConfigError. Optional."""

    def gpu_devices(self) -> tuple[int, str]:
        """How many GPUs this backend can run instances on here, and why none when 0; asked (blocking) only for a
        config with a KIND_GPU group on a host with GPUs."""
        return 0, f"the {self.name} backend runs models on CPU only"

    @abc.abstractmethod
    def describe(self, path: Path) -> ModelSignature:
        """Read the model file's inputs and outputs (for config completion and checks)."""

    @abc.abstractmethod
    def load(self, path: Path, config: ModelConfig, instance: InstanceSettings) -> Model:
        """Load one instance of the model at `path` (the version's model file or directory)."""


def config_signature(
    config: ModelConfig, where: str, supported: Sequence[str] = (), backend: str = ""
) -> ModelSignature:
    """The config's tensors as full shapes, for a backend whose model file declares none: the batch dim (-1)
    first when max_batch_size > 0, then `reshape` where given (the shape the backend sees), else `dims`.

    Raises ConfigError naming the tensor when one has no data_type, or one not in `supported` (when given,
    with the `backend`'s name); `where` names the config in the message.
    """
    batch = (-1,) if config.max_batch_size > 0 else ()

    def spec(kind: str, tensor, optional: bool) -> TensorSpec:  # type: ignore[no-untyped-def]
        if not tensor.data_type:
            raise ConfigError(f"{where} {kind} '{tensor.name}' has no data_type")
        datatype = v2_datatype(tensor.data_type)
        if supported and datatype not in supported:
            raise ConfigError(f"{where} {kind} '{tensor.name}' has data_type {config_type_name(tensor.data_type)}, "
                             f"which the {backend} backend does not support "
                             f"(supported: {', '.join(supported)})")
        body = tuple(tensor.reshape.shape) if tensor.HasField("reshape") else tuple(tensor.dims)
        return TensorSpec(tensor.name, datatype, batch + body, optional)

    return ModelSignature(
        inputs=tuple(spec("input", t, t.optional) for t in config.input),
        outputs=tuple(spec("output", t, False) for t in config.output),
    )
