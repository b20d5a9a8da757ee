"""A model's served signature, derived once from its completed config, and request checks against it.

Checks run per request on the hot path, so they compare precomputed tuples only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from modelhost.backends.base import ModelSignature
from modelhost.config.datatypes import v2_datatype
from modelhost.config.model_config_pb2 import ModelConfig
from modelhost.errors import invalid
from modelhost.types import DATATYPE_DTYPES, RequestedOutput, SignatureSpec, TensorSpec, datatype_of, format_shape


@dataclass(frozen=True, slots=True)
class TensorRule:
    name: str
    datatype: str
    dtype: np.dtype
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None
    optional: bool = False


# What a model's one signature is called where its file names none: TensorFlow's default, which TF Serving's API
# selects when a request names no signature.
DEFAULT_SIGNATURE = "serving_default"


@dataclass(frozen=True, slots=True)
class Signature:
    model: str
    max_batch_size: int
    inputs: dict[str, TensorRule]
    outputs: dict[str, TensorRule]

    @classmethod
    def from_config(cls, config: ModelConfig) -> Signature:
        def rule(tensor, optional: bool) -> TensorRule:  # type: ignore[no-untyped-def]
            datatype = v2_datatype(tensor.data_type)
            reshape = tuple(tensor.reshape.shape) if tensor.HasField("reshape") else None
            return TensorRule(tensor.name, datatype, DATATYPE_DTYPES[datatype], tuple(tensor.dims), reshape, optional)

        return cls(
            config.name,
            config.max_batch_size,
            {t.name: rule(t, t.optional) for t in config.input},
            {t.name: rule(t, False) for t in config.output},
        )

    @classmethod
    def from_model(cls, model: str, signature: ModelSignature, max_batch_size: int) -> Signature:
        """A model file's own signature: batched with `max_batch_size` (the model's) when every tensor's first
        dim is variable, otherwise taking whole tensors one request at a time (max_batch_size 0)."""
        tensors = (*signature.inputs, *signature.outputs)
        batched = max_batch_size > 0 and all(spec.shape[:1] == (-1,) for spec in tensors)
        skip = 1 if batched else 0

        def rule(spec: TensorSpec) -> TensorRule:
            return TensorRule(spec.name, spec.datatype, DATATYPE_DTYPES[spec.datatype], spec.shape[skip:], None,
                              spec.optional)

        return cls(model, max_batch_size if batched else 0,
                   {spec.name: rule(spec) for spec in signature.inputs},
                   {spec.name: rule(spec) for spec in signature.outputs})

    def as_model_declares(self) -> Signature:
        """The same signature with each tensor in the shape the model file gives it (its `reshape`), not the
        config's `dims`: Triton's APIs show a [batch]-shaped tensor as [batch, 1], TF Serving's as it is."""
        if all(rule.reshape is None for rule in (*self.inputs.values(), *self.outputs.values())):
            return self

        def native(rule: TensorRule) -> TensorRule:
            return rule if rule.reshape is None else TensorRule(rule.name, rule.datatype, rule.dtype, rule.reshape,
                                                                None, rule.optional)

        return Signature(self.model, self.max_batch_size, {n: native(r) for n, r in self.inputs.items()},
                         {n: native(r) for n, r in self.outputs.items()})

    def specs(self, rules: dict[str, TensorRule]) -> tuple[TensorSpec, ...]:
        batch = (-1,) if self.max_batch_size > 0 else ()
        return tuple(TensorSpec(r.name, r.datatype, batch + r.dims, r.optional) for r in rules.values())

    def check_inputs(self, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
        """Validate request inputs; return them shaped as the backend wants, and the batch size (1 if unbatched)."""
        for name in inputs:
            if name not in self.inputs:
                raise invalid(
                    f"unexpected inference input '{name}' for model '{self.model}'; "
                    f"its inputs are {', '.join(repr(n) for n in self.inputs)}"
                )
        batch = -1
        feeds: dict[str, np.ndarray] = {}
        for rule in self.inputs.values():
            array = inputs.get(rule.name)
            if array is None:
                if rule.optional:
                    continue
                raise invalid(self._missing_inputs(inputs))
            if array.dtype != rule.dtype and not (rule.datatype == "BYTES" and array.dtype.kind in "SUO"):
                raise invalid(
                    f"input '{rule.name}' has datatype {datatype_of(array)}, "
                    f"but model '{self.model}' expects {rule.datatype}"
                )
            shape = array.shape
            if self.max_batch_size > 0:
                batch = self._check_batch(rule, shape, batch)
                body = shape[1:]
            else:
                body = shape
            if len(body) != len(rule.dims) or any(d != -1 and d != s for d, s in zip(rule.dims, body)):
                expected = ((-1,) if self.max_batch_size > 0 else ()) + rule.dims
                raise invalid(
                    f"input '{rule.name}' has shape {format_shape(shape)}, "
                    f"but model '{self.model}' expects {format_shape(expected)}"
                )
            if rule.reshape is not None:
                lead = shape[:1] if self.max_batch_size > 0 else ()
                array = array.reshape(lead + _resolve(body, rule.dims, rule.reshape))
            feeds[rule.name] = array
        return feeds, batch if batch >= 0 else 1

    def _missing_inputs(self, inputs: dict[str, np.ndarray]) -> str:
        """Triton's words, which its clients and QA match: every input given and every required one missing."""
        required = sum(not rule.optional for rule in self.inputs.values())
        expected = (f"{required} inputs" if required == len(self.inputs) else
                    f"number of inputs between {required} and {len(self.inputs)}")
        missing = [name for name, rule in self.inputs.items() if not rule.optional and name not in inputs]
        return (f"expected {expected} but got {len(inputs)} inputs for model '{self.model}'. "
                f"Got input(s) {_names(inputs)}, but missing required input(s) {_names(missing)}. "
                "Please provide all required input(s).")

    def _check_batch(self, rule: TensorRule, shape: tuple[int, ...], batch: int) -> int:
        if not shape:
            raise invalid(f"input '{rule.name}' is a scalar, but model '{self.model}' needs a batch dimension")
        if shape[0] > self.max_batch_size:
            raise invalid(
                f"input '{rule.name}' has batch size {shape[0]}, above max_batch_size "
                f"{self.max_batch_size} of model '{self.model}' (a larger max_batch_size in its config.pbtxt raises "
                "it; for a model without one, --default-max-batch-size)"
            )
        if batch != -1 and shape[0] != batch:
            raise invalid(
                f"input '{rule.name}' has batch size {shape[0]}, but other inputs have {batch}; "
                "all inputs of a request share the batch dimension"
            )
        return int(shape[0])

    def check_outputs(self, requested: Sequence[RequestedOutput] | None) -> list[str]:
        """Names of the outputs to compute, in response order."""
        if not requested:
            return list(self.outputs)
        names: list[str] = []
        for output in requested:
            if output.name not in self.outputs:
                raise invalid(
                    f"unexpected inference output '{output.name}' for model '{self.model}'; "
                    f"its outputs are {', '.join(repr(n) for n in self.outputs)}"
                )
            if output.name in names:
                raise invalid(f"output '{output.name}' already exists in request (requested twice); "  # Triton's words
                              "request each output once")
            names.append(output.name)
        return names

    def shape_outputs(self, results: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        """Outputs in response order, reshaped from the backend's `reshape` to the API's `dims`; those the backend
        did not give (a Triton Python model may answer some) are absent."""
        shaped = {}
        for name in names:
            array = results.get(name)
            if array is None:
                continue
            rule = self.outputs[name]
            if rule.reshape is not None:
                lead = array.shape[:1] if self.max_batch_size > 0 else ()
                array = array.reshape(lead + _resolve(array.shape[len(lead):], rule.reshape, rule.dims))
            shaped[name] = array
        return shaped


@dataclass(frozen=True, slots=True)
class NamedSignature:
    """A signature a request can ask for by name: its checks, the model's call that runs it (`entry` "" is
    `Model.infer`, any other name `Model.infer_signature(entry, ...)`), and what it does (`method`, "" unknown)."""

    signature: Signature
    entry: str = ""
    method: str = ""

    def spec(self) -> SignatureSpec:
        return SignatureSpec(self.signature.specs(self.signature.inputs), self.signature.specs(self.signature.outputs),
                             self.method)


def named_signatures(
    served: Signature, served_name: str, method: str, others: dict[str, ModelSignature]
) -> dict[str, NamedSignature]:
    """Every signature of a model by name: the served one (as the model file shapes it) under `served_name`
    ("" means DEFAULT_SIGNATURE), then the model file's other signatures, batched as the model is where they can."""
    named = {served_name or DEFAULT_SIGNATURE: NamedSignature(served.as_model_declares(), "", method)}
    for name, other in sorted(others.items()):
        if name not in named:
            named[name] = NamedSignature(Signature.from_model(served.model, other, served.max_batch_size), name,
                                         other.method)
    return named


def check_output_bytes(outputs: dict[str, np.ndarray], limit: int) -> None:
    """INVALID_INPUT when the outputs' data (BYTES: their elements' bytes) exceed `limit` bytes together,
    before any protocol serializes them (JSON text takes several times the data's size)."""
    total = 0
    for name, array in outputs.items():
        total += _data_bytes(array, limit - total)
        if total > limit:
            raise invalid(
                f"output '{name}' ({datatype_of(array)}, shape {format_shape(array.shape)}) takes the response's "
                f"outputs past {limit} bytes, the limit (--max-output-bytes); send a smaller batch or request "
                "fewer outputs"
            )


def _data_bytes(array: np.ndarray, room: int) -> int:
    """nbytes; for BYTES, its elements' lengths, counted only until they pass `room`."""
    if array.dtype.kind != "O":
        return array.nbytes
    elements = array.reshape(-1).tolist()
    if set(map(type, elements)) <= {bytes, str}:  # what models answer: counted in C
        return sum(map(len, elements))
    total = 0
    for element in elements:
        total += len(element) if isinstance(element, (bytes, str)) else getattr(element, "nbytes", 0)
        if total > room:
            break
    return total


def _resolve(actual: tuple[int, ...], source: tuple[int, ...], target: tuple[int, ...]) -> tuple[int, ...]:
    """`target` with its k-th -1 replaced by the size of the k-th variable dim of `actual` (laid out as `source`).

    Triton lets dims and reshape share several variable dims (same trunks); numpy takes only one -1.
    """
    sizes = [a for a, d in zip(actual, source) if d == -1]
    if len(sizes) != target.count(-1):
        return target
    variable = iter(sizes)
    return tuple(next(variable) if t == -1 else t for t in target)


def _names(names: Iterable[str]) -> str:
    return "[" + ",".join(f"'{name}'" for name in names) + "]"
