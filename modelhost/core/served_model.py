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
from typing import TYPE_CHECKING

import numpy as np

from modelhost.client_log import client_log
from modelhost.config.model_config_pb2 import ModelConfig
from modelhost.core.model_hold import Pins
from modelhost.core.signature import Signature, check_output_bytes
from modelhost.core.statistics import ModelStatistics
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.types import RequestedOutput

if TYPE_CHECKING:
    from modelhost.core.ensemble import EnsembleScheduler
    from modelhost.core.scheduler import Scheduler

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

    async def run(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[RequestedOutput] | None, priority: int = 0,
        timeout_us: int = 0, max_output_bytes: int | None = None,
    ) -> Outputs:
        """The requested outputs (all, in model order, when `outputs` is None or empty), in request order.

        Raises INVALID_INPUT for inputs or outputs the signature refuses and for outputs over
        `max_output_bytes`; the scheduler's errors as they are; anything else the model raises as INTERNAL,
        logged once. The caller holds the version (ModelManager.hold or acquire) until this returns.
        """
        started = time.monotonic_ns()
        ok = False
        try:
            result = await self._run(inputs, outputs, priority, timeout_us, max_output_bytes)
            ok = True
            return result
        finally:
            self.statistics.record_request(ok, time.monotonic_ns() - started)

    async def _run(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[RequestedOutput] | None, priority: int,
        timeout_us: int, max_output_bytes: int | None,
    ) -> Outputs:
        signature = self.signature
        feeds, rows = signature.check_inputs(inputs)
        names = signature.check_outputs(outputs)
        try:
            results = await self.scheduler.submit(feeds, names, rows, priority, timeout_us)
        except ModelhostError:
            raise
        except Exception as exc:
            client_log(log, logging.ERROR, "model-failed", "model %s version %d failed", self.name, self.version,
                       exc_info=exc)
            raise ModelhostError(ErrorKind.INTERNAL, f"model '{self.name}' failed: {exc}") from exc
        shaped = signature.shape_outputs(results, names)
        if max_output_bytes is not None:
            check_output_bytes(shaped, max_output_bytes)
        return shaped
