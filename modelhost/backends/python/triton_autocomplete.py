"""Triton's auto-complete for a Python model: `TritonPythonModel.auto_complete_config(config)` fills in the config
(inputs, outputs, max_batch_size, dynamic batching, decoupled) before it is checked and the model loads.

It runs the model's code, so the backend calls it only from `configure`, which model loading calls after the
code policy let the model's code run (core/code_policy.py). A model.py whose text never names
auto_complete_config is not imported for it (an ordinary model pays nothing); an isolated model's runs in a
worker of its own (stub.py), which answers one "execute" with the completed config and stops.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from modelhost.backends.python.triton_model_config import ModelConfig
from modelhost.backends.python.user_model import UserCodeError, UserCodeSpec, call_user, import_model

HOOK = "auto_complete_config"
_OUTPUT = "config"


def mentions_hook(path: Path) -> bool:
    """Whether model.py may define auto_complete_config (its text names it); False when it cannot be read."""
    try:
        return HOOK.encode() in path.read_bytes()
    except OSError:
        return False


def auto_complete(spec: UserCodeSpec, config: dict[str, Any]) -> dict[str, Any] | None:
    """Import model.py (in this process) and run its TritonPythonModel.auto_complete_config on `config`: the
    completed config, or None when the model has no such hook. Raises UserCodeError."""
    try:
        module = import_model(spec)
        model_class = getattr(module, "TritonPythonModel", None)
        hook = getattr(model_class, HOOK, None) if isinstance(model_class, type) else None
        if isinstance(getattr(module, "Model", None), type) or hook is None:
            return None  # a modelhost Model (or no hook): nothing to complete
        result = call_user(spec, HOOK, hook, ModelConfig(json.loads(json.dumps(config))))
    finally:
        sys.modules.pop(spec.module_name, None)
    if not isinstance(result, ModelConfig):
        raise UserCodeError(f"{spec.label}: {HOOK} returned a {type(result).__name__}, not the "
                            "pb_utils.ModelConfig it was given")
    return result.as_dict()


@dataclass(frozen=True, slots=True)
class CompletionSpec(UserCodeSpec):
    """What an isolated model's completion worker loads: model.py, whose hook it runs on `args["model_config"]`."""

    def load(self) -> Any:
        return _Completion(auto_complete(self, self.args["model_config"]))


class _Completion:
    """The completion worker's model: execute answers the completed config, as JSON (null: no hook)."""

    def __init__(self, config: dict[str, Any] | None) -> None:
        self._json = json.dumps(config)

    def execute(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        return {_OUTPUT: np.array([self._json], dtype=np.object_)}

    def finalize(self) -> None:
        pass


def completed_by_worker(reply: dict[str, np.ndarray]) -> dict[str, Any] | None:
    """The completed config from a completion worker's execute reply."""
    document: dict[str, Any] | None = json.loads(str(reply[_OUTPUT][0]))
    return document


def completion_message() -> tuple[Any, ...]:
    return ("execute", {}, [_OUTPUT])
