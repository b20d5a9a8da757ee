"""One loaded, ready version of a model, and the one way a request runs on it.

`ServedModel.run` is the request pipeline every caller uses: the data plane for a client's request and
each ensemble step for its composing model. It checks the inputs and requested outputs against the
signature, submits to the scheduler, shapes the outputs and counts the request in the version's
statistics, success or failure, in one place.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from modelhost.client_log import client_log
from modelhost.config.model_config_pb2 import ModelConfig
from modelhost.core.classification import Labels, check_classifiable, class_counts, classified
from modelhost.core.model_hold import Pins
from modelhost.core.signature import NamedSignature, Signature, check_output_bytes
from modelhost.core.statistics import ModelStatistics
from modelhost.errors import ErrorKind, ModelhostError, invalid
from modelhost.types import RequestedOutput, SignatureSpec

if TYPE_CHECKING:
    from modelhost.core.ensemble import EnsembleScheduler
    from modelhost.core.scheduler import Scheduler
    from modelhost.core.sequence_controls import SequenceFlags
    from modelhost.core.sequences import SequenceBatcher
    from modelhost.core.trace import Trace

log = logging.getLogger("modelhost.served_model")

Outputs = dict[str, np.ndarray]


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str
    version: int
    config: ModelConfig
    signature: Signature
    scheduler: Scheduler | EnsembleScheduler
    statistics: ModelStatistics
    pins: Pins = field(default_factory=Pins)  # requests holding this version (ModelManager.acquire)
    # Its signatures by name, for APIs whose requests name one (TF Serving's); `signature` is the config's view.
    named: dict[str, NamedSignature] = field(default_factory=dict)
    sequences: SequenceBatcher | None = None  # a sequence model's batcher (config sequence_batching)
    # Outputs' class labels (their config's label_filename), read at load, for the classification extension.
    labels: Labels = field(default_factory=dict)

    signature_specs: dict[str, SignatureSpec] = field(init=False)
    # Its requests are answered by a stream of responses (model_transaction_policy { decoupled: true }).
    decoupled: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "signature_specs", {name: named.spec() for name, named in self.named.items()})
        object.__setattr__(self, "decoupled", self.config.model_transaction_policy.decoupled)

    def named_signature(self, name: str) -> NamedSignature:
        """INVALID_INPUT naming the model's signatures when it has none of that name."""
        found = self.named.get(name)
        if found is None:
            have = ", ".join(f"'{n}'" for n in self.named) or "none"
            raise invalid(f"model '{self.name}' has no signature '{name}'; its signatures: {have}")
        return found

    async def run(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[RequestedOutput] | None, priority: int = 0,
        timeout_us: int = 0, max_output_bytes: int | None = None, signature: str | None = None,
        spent_s: float = 0.0, trace: Trace | None = None, sequence: SequenceFlags | None = None,
        responses: Any = None, origin: Any = None,
    ) -> Outputs:
        """The requested outputs (all, in model order, when `outputs` is None or empty), in request order.

        `signature` names one of `named` (None: the config's signature, `signature`). `spent_s`: how long the
        server has had the request already (a latency target counts it). `trace`: the request's, when it is traced.
        `sequence`: the request's sequence parameters, which a sequence model needs and any other model refuses
        (the caller checks that). `responses`: where a decoupled model sends its responses
        (core/partial_answers.py; its outputs here are then empty). `origin`: the client's request (its id and
        parameters), for a model that takes requests one by one (Triton's Python API).

        Raises INVALID_INPUT for inputs or outputs the signature refuses and for outputs over
        `max_output_bytes`; the scheduler's errors as they are; anything else the model raises as INTERNAL,
        logged once. The caller holds the version (ModelManager.hold or acquire) until this returns.
        """
        started = time.monotonic_ns()
        ok = False
        try:
            result = await self._run(inputs, outputs, priority, timeout_us, max_output_bytes, signature, spent_s,
                                     trace, sequence, responses, origin)
            ok = True
            return result
        finally:
            self.statistics.record_request(ok, time.monotonic_ns() - started)

    async def _run(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[RequestedOutput] | None, priority: int,
        timeout_us: int, max_output_bytes: int | None, signature_name: str | None, spent_s: float = 0.0,
        trace: Trace | None = None, sequence: SequenceFlags | None = None, responses: Any = None,
        origin: Any = None,
    ) -> Outputs:
        if signature_name is None:
            signature, entry = self.signature, ""
        else:
            named = self.named_signature(signature_name)
            signature, entry = named.signature, named.entry
        names = signature.check_outputs(outputs)  # first, as Triton (its qa/L0_output_name)
        feeds, rows = signature.check_inputs(inputs)
        batchable = signature.max_batch_size > 0
        counts = class_counts(outputs) if outputs else None
        if counts:
            check_classifiable(counts, {name: rule.datatype for name, rule in signature.outputs.items()})
        try:
            if self.sequences is None:
                results = await self.scheduler.submit(feeds, names, rows, priority, timeout_us, entry, batchable,
                                                      spent_s, trace, responses=responses, origin=origin)
            else:
                submit = partial(self.scheduler.submit, rows=rows, priority=priority, timeout_us=timeout_us,
                                 entry=entry, batchable=batchable, spent_s=spent_s, trace=trace,
                                 responses=responses, origin=origin)
                results = await self.sequences.run(sequence, dict(feeds), names, rows, submit)
        except ModelhostError:
            raise
        except Exception as exc:
            client_log(log, logging.ERROR, "model-failed", "model %s version %d failed", self.name, self.version,
                       exc_info=exc)
            raise ModelhostError(ErrorKind.INTERNAL, f"model '{self.name}' failed: {exc}") from exc
        if responses is not None:
            return results  # a decoupled model's outputs go to `responses`
        shaped = signature.shape_outputs(results, names)
        if counts:
            shaped = classified(shaped, counts, self.labels, signature.max_batch_size > 0)
        if max_output_bytes is not None:
            check_output_bytes(shaped, max_output_bytes)
        return shaped
