"""The settings the tuner searches, how each is written into a model's configuration (Triton's JSON, as the
repository extension's load-with-config takes it), and the values worth trying next to the current ones."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from modelhost.config.overrides import INTRA_OP_PARAMETERS
from modelhost.core.policy import SPLIT_PARAMETER

NO_BATCHER = -1  # queue_delay_us: no dynamic batcher at all


@dataclass(frozen=True, slots=True)
class Knobs:
    instances: int
    threads: int  # intra-op threads per instance; 0: the server decides
    max_batch_size: int
    queue_delay_us: int  # NO_BATCHER: requests run as they come
    preferred: bool  # preferred_batch_size [max_batch_size]: a full batch runs without waiting
    split_size: int  # the server's request_split_size; 0: off
    client_split: int  # parts the client cuts each request into

    def describe(self) -> str:
        batcher = "no batcher" if self.queue_delay_us == NO_BATCHER else f"delay {self.queue_delay_us} µs"
        return (f"{self.instances} instance(s) x {self.threads or 'auto'} threads, max batch {self.max_batch_size}, "
                f"{batcher}{', preferred' if self.preferred else ''}, server split {self.split_size or 'off'}, "
                f"client split {self.client_split}")


def knobs_of(config: dict[str, Any]) -> Knobs:
    """The knobs a configuration sets now (client split 1)."""
    groups = config.get("instance_group") or []
    instances = sum(max(int(group.get("count", 1) or 1), 1) for group in groups) or 1
    parameters = config.get("parameters") or {}
    threads = next((int(parameters[name]["string_value"]) for name in INTRA_OP_PARAMETERS if name in parameters), 0)
    batching = config.get("dynamic_batching")
    delay = NO_BATCHER if batching is None else int(batching.get("max_queue_delay_microseconds", 0) or 0)
    preferred = bool(batching and batching.get("preferred_batch_size"))
    split = int((parameters.get(SPLIT_PARAMETER) or {}).get("string_value", 0) or 0)
    return Knobs(instances, threads, int(config.get("max_batch_size", 0) or 0), delay, preferred, split, 1)


def configured(base: dict[str, Any], knobs: Knobs) -> dict[str, Any]:
    """`base` with `knobs` written in (the client split is the client's, not the config's)."""
    config = copy.deepcopy(base)
    kind = next((group.get("kind") for group in config.get("instance_group") or [] if group.get("kind")), "KIND_CPU")
    config["instance_group"] = [{"count": knobs.instances, "kind": kind}]
    parameters = config.setdefault("parameters", {})
    for name in INTRA_OP_PARAMETERS:
        parameters.pop(name, None)
    if knobs.threads:
        parameters[INTRA_OP_PARAMETERS[0]] = {"string_value": str(knobs.threads)}
    parameters.pop(SPLIT_PARAMETER, None)
    if knobs.split_size:
        parameters[SPLIT_PARAMETER] = {"string_value": str(knobs.split_size)}
    config["max_batch_size"] = knobs.max_batch_size
    if knobs.queue_delay_us == NO_BATCHER or not knobs.max_batch_size:
        config.pop("dynamic_batching", None)
    else:
        batching = config.setdefault("dynamic_batching", {})
        batching["max_queue_delay_microseconds"] = knobs.queue_delay_us
        batching["preferred_batch_size"] = [knobs.max_batch_size] if knobs.preferred else []
    return config


@dataclass(frozen=True, slots=True)
class Space:
    """What bounds the search: the rows of one request, the server's cores, the p99 budget."""

    rows: int
    cores: int
    budget_ms: float


@dataclass(frozen=True, slots=True)
class Dimension:
    name: str
    values: Callable[[Knobs, Space], list[Knobs]]  # the alternatives to the knobs' current value


def _layouts(knobs: Knobs, space: Space) -> list[Knobs]:
    counts = sorted({1, 2, space.cores} | ({4} if space.cores >= 8 else set()))
    return [replace(knobs, instances=n, threads=max(space.cores // n, 1)) for n in counts if n <= space.cores]


def _batch_sizes(knobs: Knobs, space: Space) -> list[Knobs]:
    if not knobs.max_batch_size:
        return []  # the model has no batch dimension
    unit = max(space.rows, 1)
    sizes = sorted({unit * k for k in (1, 2, 4, 8)} | ({8, 32, 128} if unit == 1 else set()))
    return [replace(knobs, max_batch_size=size) for size in sizes]


def _delays(knobs: Knobs, space: Space) -> list[Knobs]:
    if not knobs.max_batch_size:
        return []
    ceiling = space.budget_ms * 1000 / 4
    delays = [NO_BATCHER] + [us for us in (0, 200, 1000, 5000, 20000) if us <= ceiling]
    return [replace(knobs, queue_delay_us=us) for us in delays]


def _preferred(knobs: Knobs, space: Space) -> list[Knobs]:
    if knobs.queue_delay_us == NO_BATCHER or not knobs.max_batch_size:
        return []
    return [replace(knobs, preferred=flag) for flag in (False, True)]


def _server_splits(knobs: Knobs, space: Space) -> list[Knobs]:
    if not knobs.max_batch_size or space.rows < 8:
        return []
    return [replace(knobs, split_size=size) for size in (0, space.rows // 2, space.rows // 4)]


def _client_splits(knobs: Knobs, space: Space) -> list[Knobs]:
    if not knobs.max_batch_size or space.rows < 8:
        return []
    return [replace(knobs, client_split=parts) for parts in (1, 2, 4, 10) if parts <= space.rows]


# In the order searched: what moves throughput most first.
DIMENSIONS = (
    Dimension("instances x threads", _layouts),
    Dimension("max batch size", _batch_sizes),
    Dimension("queue delay", _delays),
    Dimension("preferred batch size", _preferred),
    Dimension("server request split", _server_splits),
    Dimension("client split", _client_splits),
)
