"""The only object protocol front-ends call for health, metadata and inference."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any, TypeVar

from modelhost.config.pbtxt import config_to_json
from modelhost.core.decoupled import Response, responses
from modelhost.core.manager import IndexEntry, ModelManager
from modelhost.core.model_record import for_clients
from modelhost.core.request_parameters import check_reserved
from modelhost.core.row_updates import apply_rows, checked_rows
from modelhost.core.scheduler import Scheduler
from modelhost.core.sequence_controls import SequenceFlags, refuse_sequence, sequence_flags
from modelhost.core.served_model import ServedModel
from modelhost.core.shared_memory import SharedMemory
from modelhost.core.trace import INFER_RESPONSE_COMPLETE, REQUEST_END, REQUEST_START, Trace, Tracer
from modelhost.core.trace_config import TraceStartup
from modelhost.core.worker_statistics import StatisticsPeers, merge
from modelhost.errors import ErrorKind, ModelhostError, client_value, invalid
from modelhost.types import DEFAULT_LIMITS, InferRequest, InferResponse, ModelMetadata, RequestLimits

T = TypeVar("T")
# The model's metadata -> the request decoded against it, and what the front-end keeps for its answer.
Decode = Callable[[ModelMetadata], tuple[InferRequest, T]]

SERVER_NAME = "modelhost"
# Triton's list, in its order, but cuda_shared_memory (its routes answer that there is no GPU support here).
EXTENSIONS = ("classification", "sequence", "model_repository", "model_repository(unload_dependents)",
              "schedule_policy", "model_configuration", "system_shared_memory", "binary_tensor_data", "parameters",
              "statistics", "trace", "logging")


class DataPlane:
    def __init__(self, manager: ModelManager, version: str, strict_readiness: bool,
                 limits: RequestLimits = DEFAULT_LIMITS, row_updates: bool = False, tracer: Tracer | None = None,
                 server_name: str = SERVER_NAME, shared_memory: SharedMemory | None = None) -> None:
        """`row_updates`: whether clients may update models' tables (embedding rows; off unless the operator
        turns them on: a client that can write rows can change every answer). `tracer`: the trace extension's
        (none: requests are never traced). `server_name`: the metadata's name (--server-name). `shared_memory`:
        the clients' registered regions, which the V2 front-ends read inputs from and write outputs to (off by
        default)."""
        self.tracer = tracer or Tracer(TraceStartup())
        self._server_name = server_name
        self.shared_memory = shared_memory or SharedMemory(False, 0, 0)
        # Front-ends pass `limits` to their codecs, which check each tensor before allocating it.
        self.limits = limits
        self._row_updates = row_updates
        self._manager = manager
        self._version = version
        self._strict_readiness = strict_readiness
        self._started = False
        self._workers: StatisticsPeers | None = None

    def sum_statistics_with(self, peers: StatisticsPeers) -> None:
        """Under --workers N, or as a Ray Serve replica: statistics answer for every process serving the models
        (core/worker_statistics.py)."""
        self._workers = peers

    def mark_started(self) -> None:
        self._started = True

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        """Done with the models to load at start; with strict readiness, also every model READY.
        A load or reload after start (explicit, poll) leaves the server ready: the others still serve."""
        if not self._started:
            return False
        return self._manager.all_ready() if self._strict_readiness else True

    def serving(self) -> bool:
        """Done with the models to load at start, and every model can answer a request now: what a
        single-model endpoint's health check means (SageMaker's /ping), whatever --strict-readiness says."""
        return self._started and self._manager.all_serving()

    def server_metadata(self) -> dict[str, Any]:
        return {"name": self._server_name, "version": self._version, "extensions": list(EXTENSIONS)}

    def knows(self, name: str) -> bool:
        """Whether the server has a model of this name, in any state (a cheap check for labelling figures)."""
        return self._manager.knows(name)

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            self._manager.get(name, version)
        except ModelhostError:
            return False
        return True

    def version_states(self, name: str) -> list[IndexEntry]:
        """Each version of one model the server knows, with its state and why (a reason fit for clients), as the
        repository index lists them; NOT_FOUND when the model is unknown."""
        return [for_clients(e) for e in self._manager.index_of(name)]

    def metadata(self, name: str, version: str = "") -> ModelMetadata:
        return self._metadata_of(self._manager.get(name, version))

    def _metadata_of(self, served: ServedModel) -> ModelMetadata:
        signature = served.signature
        return ModelMetadata(
            name=served.name,
            versions=tuple(str(v) for v in self._manager.versions(served.name)),
            platform=served.config.platform or served.config.backend,
            inputs=signature.specs(signature.inputs),
            outputs=signature.specs(signature.outputs),
            max_batch_size=signature.max_batch_size,
            version=str(served.version),
            signatures=served.signature_specs,
        )

    async def statistics(self, name: str = "", version: str = "") -> list[dict[str, Any]]:
        """Triton's `model_stats`: every loaded version, of every model or of one model, or one version; summed
        over the server's workers."""
        local = self.local_statistics(name, version)
        if self._workers is None:
            return local
        return merge([local, *await self._workers.gather(name, version)])

    def local_statistics(self, name: str = "", version: str = "") -> list[dict[str, Any]]:
        """`statistics` of this process alone."""
        models = [self._manager.get(name, version)] if version else self._manager.served(name)
        return [m.statistics.as_json(m.name, m.version) for m in sorted(models, key=lambda m: (m.name, m.version))]

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        return config_to_json(self._manager.get(name, version).config)

    def instances(self, name: str, version: str = "") -> tuple[list[int | None], int]:
        """A loaded version's instances (each one's worker process, None where it runs in the server's process)
        and how many requests wait in its queue; NOT_FOUND and UNAVAILABLE as `metadata`."""
        served = self._manager.get(name, version)
        if not isinstance(served.scheduler, Scheduler):
            return [], served.scheduler.queued()
        return served.scheduler.instance_processes(), served.scheduler.queued()

    def admit(self, name: str, version: str = "") -> None:
        """Raises what `infer` of this model would raise before looking at the request: the model is unknown
        or not ready, or its queue is full (counted as a failed request, as `infer` counts it). For a front-end
        that can answer before reading a request's body; the request's own priority is not known yet, so
        this checks the default level, and only where the model has one level."""
        served = self._manager.get(name, version)
        if not isinstance(served.scheduler, Scheduler) or served.config.dynamic_batching.priority_levels > 1:
            return  # an ensemble's steps queue in their own models
        try:
            served.scheduler.check_room()
        except ModelhostError:
            served.statistics.record_request(False, 0)
            raise

    async def infer(self, request: InferRequest) -> InferResponse:
        # Held for the whole request: ModelManager.acquire without its context manager objects (~1 µs less).
        served = self._manager.hold(request.model_name, request.model_version)
        try:
            return await self._answer(served, request)
        finally:
            served.pins.release()

    async def _answer(self, served: ServedModel, request: InferRequest) -> InferResponse:
        """`request` run on `served`, which the caller holds, or on the older version its sequence started on."""
        sequence = _sequence(served, request.parameters)
        if sequence is not None and not request.model_version:
            older = self._older_sequence_version(served, sequence)
            if older is not None:
                try:
                    return await self._run(older, request, sequence)
                finally:
                    older.pins.release()
        return await self._run(served, request, sequence)

    async def _run(self, served: ServedModel, request: InferRequest,
                   sequence: SequenceFlags | None) -> InferResponse:
        if request.trace is not None:
            return await self._traced(served, request, request.trace, sequence)
        priority, timeout_us = _scheduling(request.parameters)
        outputs = await served.run(request.inputs, request.outputs, priority, timeout_us,
                                   self.limits.max_output_bytes, request.signature, _spent(request),
                                   sequence=sequence, origin=request)
        return InferResponse(served.name, str(served.version), outputs, request.id)

    def _older_sequence_version(self, served: ServedModel, sequence: SequenceFlags) -> ServedModel | None:
        """The version a sequence's request runs on when it is not `served`: the one it started on, which a
        reload replaced (that one stays until its sequences end or idle out), held; None: `served`."""
        assert served.sequences is not None
        if sequence.start or served.sequences.is_open(sequence.id):
            return None
        return self._manager.hold_sequence(served.name, sequence.id)  # None: not open anywhere, `run` refuses it

    async def infer_or_stream(self, request: InferRequest) -> InferResponse | AsyncGenerator[Response, None]:
        """`infer`, or for a decoupled model (model_transaction_policy decoupled) `stream`'s responses: for a
        front-end that answers either way (gRPC ModelStreamInfer), with one lookup for an ordinary model."""
        served = self._manager.hold(request.model_name, request.model_version)
        if served.decoupled:
            served.pins.release()  # `stream` holds the version from its first response to its last
            return self.stream(request)
        try:
            return await self._answer(served, request)
        finally:
            served.pins.release()

    async def stream(self, request: InferRequest) -> AsyncGenerator[Response, None]:
        """The responses to `request`, each with whether it is the last: a decoupled model's as it sends them
        (core/decoupled.py), another model's one answer. Raises what fails the request before its first."""
        served = self._manager.hold(request.model_name, request.model_version)
        try:
            if not served.decoupled:
                yield await self._answer(served, request), True
                return
            priority, timeout_us = _scheduling(request.parameters)
            answers = responses(served, request, self.limits.max_output_bytes, priority, timeout_us, _spent(request))
            async with aclosing(answers):
                async for response in answers:
                    yield response
        finally:
            served.pins.release()

    async def decode_and_infer(self, name: str, version: str, decode: Decode[T]) -> tuple[InferResponse, T]:
        """For a front-end whose wire format is read against the model's signature (TF Serving rows, SageMaker
        CSV, KServe's raw binary body): one lookup. The version is held, `decode` gets its metadata and
        returns the request with anything the front-end needs to encode the answer, and that request runs
        on the same version."""
        served = self._manager.hold(name, version)
        try:
            request, context = decode(self._metadata_of(served))
            request.model_name, request.model_version = name, version
            return await self._run(served, request, _sequence(served, request.parameters)), context
        finally:
            served.pins.release()

    async def _traced(self, served: ServedModel, request: InferRequest, trace: Trace,
                      sequence: SequenceFlags | None) -> InferResponse:
        """`infer` of a traced request: its stages stamped; finished here if it fails (else by its front-end,
        once the answer is sent)."""
        trace.model_version, trace.request_id = served.version, request.id
        trace.stamp(REQUEST_START)
        tensors = "TENSORS" in trace.levels
        if tensors:
            trace.inputs = request.inputs
        try:
            priority, timeout_us = _scheduling(request.parameters)
            outputs = await served.run(request.inputs, request.outputs, priority, timeout_us,
                                       self.limits.max_output_bytes, request.signature, _spent(request), trace,
                                       sequence, origin=request)
        except BaseException:
            self.tracer.finish(trace, REQUEST_END)
            raise
        trace.stamp(INFER_RESPONSE_COMPLETE)
        trace.stamp(REQUEST_END)
        if tensors:
            trace.outputs = outputs
        return InferResponse(served.name, str(served.version), outputs, request.id)

    async def update_rows(self, request: InferRequest) -> tuple[str, int, int]:
        """Add or replace rows of the model's table (inputs `ids` and `vectors`): (version, rows, new rows),
        durable when it returns. Requests to the model go on meanwhile."""
        if not self._row_updates:
            raise ModelhostError(ErrorKind.UNSUPPORTED, "embedding row updates from clients are off: the server "
                                 "takes them when started with --embedding-updates")
        served = self._manager.hold(request.model_name, request.model_version)
        try:
            table = served.scheduler.row_updates() if isinstance(served.scheduler, Scheduler) else None
            ids, vectors = checked_rows(request.model_name, table, request.inputs)
            assert table is not None
            added = await apply_rows(table, ids, vectors)
            return str(served.version), len(ids), added
        finally:
            served.pins.release()


def _spent(request: InferRequest) -> float:
    """Seconds since the server began receiving the request (0 when the front-end did not say)."""
    return max(time.monotonic() - request.received, 0.0) if request.received else 0.0


def _sequence(served: ServedModel, parameters: dict[str, Any]) -> SequenceFlags | None:
    """The request's sequence parameters for a sequence model; INVALID_INPUT for any on another model."""
    if served.sequences is not None:
        return sequence_flags(parameters)
    # Inline, not a loop: every request to every other model passes here.
    if parameters and ("sequence_id" in parameters or "sequence_start" in parameters
                       or "sequence_end" in parameters) and isinstance(served.scheduler, Scheduler):
        refuse_sequence(served.name, parameters)  # an ensemble passes them to its sequence steps (core/ensemble.py)
    return None


def _scheduling(parameters: dict[str, Any]) -> tuple[int, int]:
    """The request's `priority` and `timeout` (µs) parameters, 0 when absent; INVALID_INPUT for reserved ones."""
    if not parameters:
        return 0, 0
    check_reserved(parameters)
    return _natural_parameter(parameters, "priority"), _natural_parameter(parameters, "timeout")


def _natural_parameter(parameters: dict[str, Any], name: str) -> int:
    """A request parameter that must be a non-negative integer (Triton's `priority`, `timeout` in µs)."""
    value = parameters.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise invalid(f"request parameter '{name}' must be a non-negative integer, got {client_value(value)}")
    return value
