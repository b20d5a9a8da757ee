"""An ensemble's steps as a checked DAG: which step writes each tensor, which steps wait on which.

Checked as Triton does: from the config alone at load (`EnsemblePlan.from_config`), and against the
composing models' signatures once they are loaded (`EnsemblePlan.check_models`). Both raise
ConfigError naming the ensemble, the step (counted from 1 in config order) and the tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from modelhost.config.model_config_pb2 import ModelConfig, ModelEnsembling
from modelhost.config.pbtxt import ConfigError
from modelhost.core.ensemble_batch_dims import dims_agree
from modelhost.core.signature import Signature, TensorRule
from modelhost.errors import ModelhostError
from modelhost.types import RequestedOutput, format_shape

if TYPE_CHECKING:
    from modelhost.core.model_hold import ModelHold
    from modelhost.core.served_model import ServedModel

# (model name, version "" for the latest) -> the ready model; raises ModelhostError when there is none.
Resolve = Callable[[str, str], "ServedModel"]
# The same lookup, held while a step uses the model (ModelManager.acquire).
Acquire = Callable[[str, str], "ModelHold"]

LATEST = -1
PLATFORM = "ensemble"


@dataclass(frozen=True, slots=True)
class EnsembleStep:
    position: int  # 1-based, in config order: what messages call the step
    model_name: str
    model_version: int  # LATEST or a version number
    input_map: dict[str, str]  # composing model input -> ensemble tensor
    output_map: dict[str, str]  # composing model output -> ensemble tensor
    requested: tuple[RequestedOutput, ...] = field(init=False)  # the outputs the step asks its model for

    def __post_init__(self) -> None:
        object.__setattr__(self, "requested", tuple(RequestedOutput(name) for name in self.output_map))

    @property
    def version(self) -> str:
        """The version as Resolve takes it: "" for the latest."""
        return "" if self.model_version == LATEST else str(self.model_version)

    def describe(self) -> str:
        version = f" version {self.model_version}" if self.model_version != LATEST else ""
        return f"step {self.position} (model '{self.model_name}'{version})"


@dataclass(frozen=True, slots=True)
class EnsemblePlan:
    """The validated DAG of an ensemble config; immutable, shared by every request of the ensemble."""

    name: str
    signature: Signature  # the ensemble's own inputs and outputs
    steps: tuple[EnsembleStep, ...]
    writers: dict[str, int]  # ensemble tensor -> index of the step that writes it
    needs: tuple[frozenset[int], ...]  # per step: indices of the steps that write its inputs

    @classmethod
    def from_config(cls, config: ModelConfig) -> EnsemblePlan:
        """Check the DAG of `config` (platform "ensemble"); raises ConfigError naming the step and tensor."""
        name = config.name
        if config.platform != PLATFORM:
            raise ConfigError(f"ensemble '{name}': platform must be '{PLATFORM}', got '{config.platform}'")
        if config.WhichOneof("scheduling_choice") != "ensemble_scheduling" or not config.ensemble_scheduling.step:
            raise ConfigError(f"ensemble '{name}': ensemble_scheduling must list at least one step")
        try:
            signature = Signature.from_config(config)
        except KeyError:
            raise ConfigError(f"ensemble '{name}': every input and output needs a supported data_type") from None
        steps = tuple(_step(name, n, s) for n, s in enumerate(config.ensemble_scheduling.step, start=1))
        writers = _writers(name, steps, signature)
        for step in steps:
            for tensor in step.input_map.values():
                if tensor not in signature.inputs and tensor not in writers:
                    raise ConfigError(
                        f"ensemble '{name}' {step.describe()} reads tensor '{tensor}', which is neither an "
                        "ensemble input nor written by any step"
                    )
        _check_all_used(name, steps, signature, writers)
        needs = tuple(frozenset(writers[t] for t in s.input_map.values() if t in writers) for s in steps)
        _check_acyclic(name, steps, needs)
        return cls(name, signature, steps, writers, needs)

    def composing_models(self) -> list[tuple[str, int]]:
        """(model name, version; LATEST = -1) of every step, each once, in step order."""
        return list(dict.fromkeys((s.model_name, s.model_version) for s in self.steps))

    def steps_for(self, outputs: Iterable[str]) -> frozenset[int]:
        """Indices of the steps that `outputs` (ensemble outputs) need, directly or through other steps."""
        pending = [self.writers[name] for name in outputs]
        needed: set[int] = set()
        while pending:
            index = pending.pop()
            if index not in needed:
                needed.add(index)
                pending.extend(self.needs[index])
        return frozenset(needed)

    def check_models(self, resolve: Resolve) -> None:
        """Check each step against its composing model, as `resolve` finds it now: the mapped names exist,
        every required input is mapped, each tensor has one datatype and compatible shapes everywhere, and
        the composing models batch at least as much as the ensemble. Raises ConfigError."""
        seen: dict[str, tuple[str, str, TensorRule, bool]] = {}  # tensor -> (where, datatype, rule, batching)
        own = self.signature
        for rules, kind in ((own.inputs, "input"), (own.outputs, "output")):
            for rule in rules.values():
                self._agree(seen, rule.name, f"ensemble {kind}", own_view(rule), own.max_batch_size)
        for step in self.steps:
            try:
                model = resolve(step.model_name, step.version).signature
            except ModelhostError as exc:
                raise ConfigError(f"ensemble '{self.name}' {step.describe()}: {exc.message}") from None
            self._check_step(seen, step, model)

    def inherited_labels(self, resolve: Resolve,
                         labels: dict[str, tuple[bytes, ...]]) -> dict[str, tuple[bytes, ...]]:
        """`labels` (the ensemble's own, by its outputs' label_filename), and for each output without them the
        labels of the step output that makes it, as Triton's ensembles take them."""
        found = dict(labels)
        for step in self.steps:
            for name, tensor in step.output_map.items():
                if tensor in self.signature.outputs and tensor not in found:
                    try:
                        inherited = resolve(step.model_name, step.version).labels.get(name)
                    except ModelhostError:
                        continue  # the step fails on its own when it runs
                    if inherited:
                        found[tensor] = inherited
        return found

    def _check_step(
        self, seen: dict[str, tuple[str, str, TensorRule, bool]], step: EnsembleStep, model: Signature
    ) -> None:
        where = f"ensemble '{self.name}' {step.describe()}"
        # As Triton: a step whose model does not batch takes the ensemble's batch whole (core/ensemble_batch_dims.py).
        if model.max_batch_size and self.signature.max_batch_size > model.max_batch_size:
            raise ConfigError(
                f"{where}: the ensemble's max_batch_size {self.signature.max_batch_size} is above the model's "
                f"max_batch_size {model.max_batch_size}"
            )
        sides = (("input", step.input_map, model.inputs), ("output", step.output_map, model.outputs))
        for kind, mapping, rules in sides:
            for name, tensor in mapping.items():
                if name not in rules:
                    known = ", ".join(repr(n) for n in rules)
                    raise ConfigError(f"{where} maps {kind} '{name}', but the model's {kind}s are {known}")
                self._agree(seen, tensor, f"{kind} '{name}' of {step.describe()}", rules[name], model.max_batch_size)
        unmapped = [r.name for r in model.inputs.values() if not r.optional and r.name not in step.input_map]
        if unmapped:
            raise ConfigError(f"{where}: input_map leaves the model's required input(s) {unmapped} unmapped")

    def _agree(
        self, seen: dict[str, tuple[str, str, TensorRule, bool]], tensor: str, where: str, rule: TensorRule,
        max_batch_size: int,
    ) -> None:
        """As Triton: a tensor's places agree on its datatype, and on its dims or its full shapes (a place that
        batches and one that does not: core/ensemble_batch_dims.py moves the batch dim between them)."""
        batching = max_batch_size > 0
        if tensor not in seen:
            seen[tensor] = (where, rule.datatype, rule, batching)
            return
        first, datatype, first_rule, first_batching = seen[tensor]
        first_shape, shape = _full(first_rule.dims, first_batching), _full(rule.dims, batching)
        if datatype != rule.datatype or not (dims_agree(first_rule.dims, rule.dims)
                                             or dims_agree(first_shape, shape)):
            raise ConfigError(
                f"ensemble '{self.name}': tensor '{tensor}' is {datatype} {format_shape(first_shape)} as {first}, "
                f"but {rule.datatype} {format_shape(shape)} as {where}"
            )


def own_view(rule: TensorRule) -> TensorRule:
    """An ensemble's own input or output as its steps see it: its `reshape`, where it has one (as Triton checks)."""
    return rule if rule.reshape is None else replace(rule, dims=rule.reshape)


def _full(dims: tuple[int, ...], batching: bool) -> tuple[int, ...]:
    return ((-1,) if batching else ()) + dims


def _step(ensemble: str, position: int, step: ModelEnsembling.Step) -> EnsembleStep:
    where = f"ensemble '{ensemble}' step {position}"
    if not step.model_name:
        raise ConfigError(f"{where} has no model_name")
    if step.model_version < LATEST:
        raise ConfigError(f"{where}: model_version must be -1 (the latest) or a version, got {step.model_version}")
    described = f"{where} (model '{step.model_name}')"
    if not step.input_map:
        raise ConfigError(f"{described} has no input_map")
    if not step.output_map:
        raise ConfigError(f"{described} has no output_map")
    # Version 0 cannot exist (version directories starting with 0 are ignored): an unset version means latest.
    version = step.model_version if step.model_version > 0 else LATEST
    return EnsembleStep(position, step.model_name, version, dict(step.input_map), dict(step.output_map))


def _writers(ensemble: str, steps: Sequence[EnsembleStep], signature: Signature) -> dict[str, int]:
    """Ensemble tensor -> index of the one step that writes it."""
    writers: dict[str, int] = {}
    for index, step in enumerate(steps):
        for tensor in step.output_map.values():
            where = f"ensemble '{ensemble}' {step.describe()} writes tensor '{tensor}'"
            if tensor in signature.inputs:
                raise ConfigError(f"{where}, which is an ensemble input")
            if writers.get(tensor) == index:
                raise ConfigError(f"{where} from two of its outputs")
            if tensor in writers:
                raise ConfigError(f"{where}, which {steps[writers[tensor]].describe()} writes too")
            writers[tensor] = index
    return writers


def _check_all_used(
    ensemble: str, steps: Sequence[EnsembleStep], signature: Signature, writers: dict[str, int]
) -> None:
    """Every output written; as Triton, no input or step output that nothing reads (usually a misspelt name)."""
    for output in signature.outputs:
        if output not in writers:
            raise ConfigError(f"ensemble '{ensemble}': output '{output}' is not written by any step")
    read = {tensor for step in steps for tensor in step.input_map.values()}
    for tensor in signature.inputs:
        if tensor not in read:
            raise ConfigError(f"ensemble '{ensemble}': input '{tensor}' is not read by any step")
    for tensor, index in writers.items():
        if tensor not in read and tensor not in signature.outputs:
            raise ConfigError(
                f"ensemble '{ensemble}' {steps[index].describe()} writes tensor '{tensor}', which no step "
                "reads and is not an ensemble output"
            )


def _check_acyclic(ensemble: str, steps: Sequence[EnsembleStep], needs: Sequence[frozenset[int]]) -> None:
    """Raise ConfigError naming the steps of a cycle, if there is one (Kahn's algorithm, then a walk back)."""
    left = set(range(len(steps)))
    ready = [i for i in left if not needs[i]]
    while ready:
        left.discard(ready.pop())
        ready.extend(i for i in left if i not in ready and not needs[i] & left)
    if not left:
        return
    # Every step left waits on another step left: walking back from any of them must come round.
    path: list[int] = []
    index = min(left)
    while index not in path:
        path.append(index)
        index = min(needs[index] & left)
    cycle = path[path.index(index):] + [index]
    raise ConfigError(
        f"ensemble '{ensemble}': steps form a cycle: {' -> '.join(steps[i].describe() for i in reversed(cycle))}"
    )
