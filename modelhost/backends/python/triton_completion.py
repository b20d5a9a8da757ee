"""The server's side of Triton's auto-complete for a Python model (PythonBackend.configure): run the model's
auto_complete_config (triton_autocomplete.py) in this process, or in a worker of its own when the model is
isolated, and make its answer the model's config. Called only once the code policy let the model's code run.
"""

from __future__ import annotations

import itertools
import logging
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from modelhost.backends.python.channel import ChannelClosed
from modelhost.backends.python.triton_autocomplete import (
    CompletionSpec,
    auto_complete,
    completed_by_worker,
    completion_message,
    mentions_hook,
)
from modelhost.backends.python.user_model import UserCodeError
from modelhost.backends.python.worker_process import IsolationOptions, WorkerProcess
from modelhost.config.model_config_pb2 import ModelConfig
from modelhost.config.pbtxt import ConfigError, config_to_json

log = logging.getLogger("modelhost.backends.python.backend")
_runs = itertools.count()  # tells apart the modules of successive completions


def complete_from_model(path: Path, config: ModelConfig, isolated: bool, options: IsolationOptions) -> None:
    """Let model.py's TritonPythonModel.auto_complete_config complete `config` in place; nothing when model.py never
    names the hook. Raises ConfigError (the hook raised, refused a change, or made a config that does not parse)."""
    if not path.is_file() or not mentions_hook(path):
        return
    document = config_to_json(config)
    name = document["name"] = config.name or path.parent.parent.name
    spec = CompletionSpec(path=str(path), module_name=f"modelhost_python_autocomplete_{next(_runs)}",
                          label=f"Python model '{name}'", args={"model_config": document}, outputs=(),
                          batching=False)
    try:
        completed = _in_worker(spec, options) if isolated else auto_complete(spec, document)
    except UserCodeError as exc:
        if exc.details:
            log.error("%s\n%s", exc.message, exc.details)
        raise ConfigError(exc.message) from None
    if completed is None:
        return
    parsed = ModelConfig()
    try:
        json_format.ParseDict(completed, parsed)
    except (json_format.ParseError, TypeError, ValueError) as exc:
        raise ConfigError(f"model '{name}': auto_complete_config made a config that is not valid: {exc}") from None
    config.CopyFrom(parsed)


def _in_worker(spec: CompletionSpec, options: IsolationOptions) -> dict[str, Any] | None:
    """Run auto_complete_config in a worker of its own (the model's code never runs in the server)."""
    worker = WorkerProcess(spec, options)
    try:
        reply = worker.call(completion_message(), options.initialize_timeout_s)
    except (TimeoutError, ChannelClosed):
        worker.kill()
        raise UserCodeError(f"{spec.label}: its worker did not complete the config within "
                            f"{options.initialize_timeout_s:g} s (initialize_timeout_seconds)") from None
    worker.stop(options.initialize_timeout_s)
    if reply[0] != "ok":
        raise UserCodeError(reply[2], reply[3])
    return completed_by_worker(reply[1])
