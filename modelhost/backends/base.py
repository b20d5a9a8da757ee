"""The backend contract: a backend loads model files into Model instances that run batches."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modelhost.config.model_config_pb2 import ModelConfig
from modelhost.types import TensorSpec


@dataclass(frozen=True, slots=True)
class ModelSignature:
    """Inputs and outputs as the model file declares them (full shapes, -1 where variable)."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


@dataclass(frozen=True, slots=True)
class InstanceSettings:
    """What the core decides for one instance: its index and the CPU threads it may use."""

    index: int
    threads: int


class Model(abc.ABC):
    """One loaded instance. `infer` is never called concurrently on the same instance."""

    # False for a model whose call may block however cheap it has been (it waits on another process):
    # the scheduler then never runs it on the event loop, where a hang would stall every request.
    runs_inline: bool = True

    @abc.abstractmethod
    def infer(self, inputs: dict[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        """Run one batch; return at least the named outputs."""

    def unload(self) -> None:  # noqa: B027 - optional hook: most models free memory when dropped
        """Free the instance's memory; it is never used again."""

    def signature(self) -> ModelSignature | None:
        """The inputs and outputs this loaded instance declares, if it can tell: spares `describe`."""
        return None


class Backend(abc.ABC):
    """Stateless factory for one model format. Called off the event loop; may be slow."""

    name: str
    platform: str
    default_filename: str

    def warm_up(self) -> None:  # noqa: B027 - optional hook
        """Create the framework's process-wide state (runtime environment, kernel registries) now, so that
        it is not counted against the first model loaded; blocking, called once."""

    def model_path(self, version_dir: Path, filename: str) -> Path:
        """Where a version's model is: `filename` in the version directory, unless the backend knows
        another layout for it."""
        return version_dir / filename

    @abc.abstractmethod
    def describe(self, path: Path) -> ModelSignature:
        """Read the model file's inputs and outputs (for config completion and checks)."""

    @abc.abstractmethod
    def load(self, path: Path, config: ModelConfig, instance: InstanceSettings) -> Model:
        """Load one instance of the model at `path` (the version's model file or directory)."""
