"""pb_utils.ModelConfig: what a Triton model.py's `auto_complete_config(auto_complete_model_config)` staticmethod
gets and returns (triton_autocomplete.py calls it at load, before the config is checked).

The config is Triton's JSON form (config_to_json). The model may add inputs and outputs, raise max_batch_size,
turn on dynamic batching and set the decoupled transaction policy; each method refuses, with a ValueError as
Triton's, what contradicts what config.pbtxt already says. Numpy-free and light: the worker imports it.
"""

from __future__ import annotations

import json
from typing import Any

_INPUT_KEYS = ("name", "data_type", "dims", "optional")
_OUTPUT_KEYS = ("name", "data_type", "dims")


class ModelConfig:
    def __init__(self, model_config: str | dict[str, Any]) -> None:
        config = json.loads(model_config) if isinstance(model_config, str) else model_config
        config.setdefault("input", [])
        config.setdefault("output", [])
        config.setdefault("max_batch_size", 0)
        self._config: dict[str, Any] = config

    def as_dict(self) -> dict[str, Any]:
        return self._config

    def _name(self) -> str:
        return str(self._config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Set max_batch_size; refused when config.pbtxt gives a larger one."""
        current = int(self._config.get("max_batch_size", 0))
        if current > max_batch_size:
            raise ValueError(f"configuration specified max_batch_size {current}, but in auto-complete-config "
                             f"function for model '{self._name()}' specified max_batch_size {max_batch_size}")
        self._config["max_batch_size"] = int(max_batch_size)

    def set_dynamic_batching(self) -> None:
        """Use the dynamic batcher, unless another scheduler is configured (refused then)."""
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._config:
                raise ValueError(f"Configuration specified scheduling_choice as '{other}', but auto-complete-config "
                                 f"function for model '{self._name()}' tries to set scheduling_choice as "
                                 "'dynamic_batching'")
        self._config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:  # noqa: A002 - Triton's parameter name
        self._add("input", input, _INPUT_KEYS)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output, _OUTPUT_KEYS)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        """Set `decoupled`; refused when config.pbtxt says otherwise."""
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(f"model transaction property in auto-complete-config function for model "
                                 f"'{self._name()}' contains property other than 'decoupled'.")
        policy = self._config.setdefault("model_transaction_policy", {})
        if "decoupled" not in transaction_policy_dict:
            return
        wanted = bool(transaction_policy_dict["decoupled"])
        # config_to_json writes every field: an unset decoupled reads False, and a model may still turn it on.
        if policy.get("decoupled") and not wanted:
            raise ValueError(f"trying to change decoupled property in auto-complete-config for model "
                             f"'{self._name()}', which is already set to 'True'.")
        policy["decoupled"] = wanted

    def _add(self, kind: str, tensor: dict[str, Any], keys: tuple[str, ...]) -> None:
        """Add a tensor, or fill in the config's own of that name; refused where the two disagree."""
        if not isinstance(tensor, dict):
            raise ValueError(f"add_{kind} in auto-complete-config function for model '{self._name()}' takes a dict, "
                             f"got {type(tensor).__name__}")
        name = tensor.get("name")
        extra = [key for key in tensor if key not in keys]
        if extra:
            raise ValueError(f"{kind} '{name}' in auto-complete-config function for model '{self._name()}' contains "
                             f"property other than {', '.join(repr(k) for k in keys)}.")
        for required in ("name", "data_type", "dims"):
            if required not in tensor:
                raise ValueError(f"{kind} {'' if name is None else repr(name) + ' '}in auto-complete-config function "
                                 f"for model '{self._name()}' is missing '{required}' property.")
        dims = [int(d) for d in tensor["dims"]]
        for current in self._config[kind]:
            if current.get("name") != name:
                continue
            configured = current.get("data_type", "TYPE_INVALID")
            if configured != "TYPE_INVALID" and configured != tensor["data_type"]:
                raise ValueError(f"unable to load model '{self._name()}', configuration expects datatype "
                                 f"{configured} for {kind} '{name}', model provides {tensor['data_type']}")
            if current.get("dims") and [int(d) for d in current["dims"]] != dims:
                raise ValueError(f"model '{self._name()}', tensor '{name}': the model expects dims {dims} but the "
                                 f"model configuration specifies dims {current['dims']}")
            current.update(tensor, dims=dims)
            return
        self._config[kind].append({**tensor, "dims": dims})
