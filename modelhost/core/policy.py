"""A model's scheduling policy, read once from config.pbtxt's `dynamic_batching` (Triton's semantics)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from modelhost.config.model_config_pb2 import ModelConfig, ModelQueuePolicy, ModelSequenceBatching
from modelhost.config.parameters import natural_parameter, string_parameters
from modelhost.config.pbtxt import ConfigError
from modelhost.core.latency_target import TARGET_PARAMETER


@dataclass(frozen=True, slots=True)
class LevelPolicy:
    """Queue policy of one priority level."""

    max_queue_size: int = 0  # 0 = unbounded
    default_timeout_s: float = 0.0  # 0 = none
    allow_timeout_override: bool = False
    delay_on_timeout: bool = False  # timeout_action DELAY: run after every request still in time


@dataclass(frozen=True, slots=True)
class SchedulingPolicy:
    batching: bool
    max_batch_size: int
    preferred_batch_sizes: tuple[int, ...]  # descending
    max_queue_delay_s: float
    preserve_ordering: bool
    levels: tuple[LevelPolicy, ...]  # levels[0] is priority 1, the highest
    default_level: int  # index into levels
    split_size: int = 0  # requests of more rows run as chunks of this many rows; 0 = never split
    # Batches predicted to run within this many ns may run on the event loop; 0 = never, None = what a
    # handoff to an instance thread takes, learned (core/loop_gate.py).
    inline_max_ns: int | None = 0
    # Batch sizes a batch is padded up to (ascending; TF Serving's allowed_batch_sizes); () = run as formed.
    pad_sizes: tuple[int, ...] = ()

    @classmethod
    def from_config(cls, config: ModelConfig) -> SchedulingPolicy:
        split = _natural_parameter(config, SPLIT_PARAMETER)
        if split and config.max_batch_size == 0:
            raise ConfigError(f"parameter {SPLIT_PARAMETER} needs a batch dimension (max_batch_size > 0)")
        inline_us = natural_parameter(string_parameters(config), (INLINE_PARAMETER,), None)
        inline_ns = None if inline_us is None else 1000 * inline_us
        # A latency target forms batches as a dynamic batcher of its own settings would (core/latency_target.py).
        targeted = TARGET_PARAMETER in string_parameters(config) and config.max_batch_size > 0
        if config.WhichOneof("scheduling_choice") == "sequence_batching":
            return _sequence_policy(cls, config, inline_ns)
        if config.WhichOneof("scheduling_choice") != "dynamic_batching" and not targeted:
            # Without a dynamic batcher requests run one by one; a request may still bring its own timeout.
            level = LevelPolicy(allow_timeout_override=True)
            return cls(False, config.max_batch_size, (), 0.0, False, (level,), 0, split, inline_ns)
        batching = config.dynamic_batching
        count = batching.priority_levels or 1
        if batching.priority_levels and not 1 <= batching.default_priority_level <= count:
            raise ConfigError(
                f"dynamic_batching default_priority_level must be between 1 and priority_levels {count}, "
                f"got {batching.default_priority_level}"
            )
        for size in batching.preferred_batch_size:
            if not 0 < size <= max(config.max_batch_size, 1):
                raise ConfigError(
                    f"dynamic_batching preferred_batch_size {size} must be between 1 and max_batch_size "
                    f"{config.max_batch_size}"
                )
        for key in batching.priority_queue_policy:
            if not 1 <= key <= count:
                raise ConfigError(f"dynamic_batching priority_queue_policy level {key} is not in 1..{count}")
        default = _level(batching.default_queue_policy)
        levels = tuple(
            _level(batching.priority_queue_policy[n]) if n in batching.priority_queue_policy else default
            for n in range(1, count + 1)
        )
        pad_sizes = _pad_sizes(config)
        return cls(
            batching=config.max_batch_size > 0,
            max_batch_size=config.max_batch_size,
            # Padded batches form as TF Serving forms them: up to max_batch_size, the sizes only pad.
            preferred_batch_sizes=() if pad_sizes else tuple(sorted(set(batching.preferred_batch_size), reverse=True)),
            max_queue_delay_s=batching.max_queue_delay_microseconds / 1e6,
            preserve_ordering=batching.preserve_ordering,
            levels=levels,
            default_level=batching.default_priority_level - 1 if batching.priority_levels else 0,
            split_size=split,
            inline_max_ns=inline_ns,
            pad_sizes=pad_sizes,
        )


# `parameters { key: "request_split_size" value: { string_value: "N" } }`: split requests above N rows.
SPLIT_PARAMETER = "request_split_size"
# Batches predicted (from measured executions) to take at most this many µs run on the event loop
# instead of an instance thread; 0 = never. Unset: what a handoff takes, learned (core/loop_gate.py).
INLINE_PARAMETER = "inline_max_microseconds"


# `parameters { key: "pad_to_preferred_batch_size" value: { string_value: "true" } }`: a batch runs padded up to
# the next preferred_batch_size, the largest of which must be max_batch_size (TF Serving's allowed_batch_sizes).
PAD_PARAMETER = "pad_to_preferred_batch_size"


def _pad_sizes(config: ModelConfig) -> tuple[int, ...]:
    value = string_parameters(config).get(PAD_PARAMETER, "false").strip().lower()
    if value not in ("true", "false"):
        raise ConfigError(f"parameter {PAD_PARAMETER} must be true or false, got '{value}'")
    if value == "false":
        return ()
    sizes = tuple(sorted(set(config.dynamic_batching.preferred_batch_size)))
    if not sizes or sizes[-1] != config.max_batch_size:
        raise ConfigError(f"parameter {PAD_PARAMETER} needs preferred_batch_size values whose largest is "
                          f"max_batch_size {config.max_batch_size}, got {list(sizes)}")
    return sizes


def _sequence_policy(cls: type[SchedulingPolicy], config: ModelConfig, inline_ns: int | None) -> SchedulingPolicy:
    """A sequence model's queue (core/sequences.py): its requests batch across sequences with the strategy's
    delay and, for `oldest`, its preferred sizes; never split (a sequence request has one row)."""
    sequences = config.sequence_batching
    strategy = sequences.oldest if sequences.HasField("oldest") else sequences.direct
    preferred = tuple(sorted(set(sequences.oldest.preferred_batch_size), reverse=True))
    for size in preferred:
        if not 0 < size <= max(config.max_batch_size, 1):
            raise ConfigError(f"sequence_batching oldest preferred_batch_size {size} must be between 1 and "
                              f"max_batch_size {config.max_batch_size}")
    delay = strategy.max_queue_delay_microseconds / 1e6
    if not sequences.HasField("oldest"):
        preferred, delay = _slot_utilization(sequences.direct, config.max_batch_size, delay)
    level = LevelPolicy(allow_timeout_override=True)
    return cls(config.max_batch_size > 0, config.max_batch_size, preferred, delay, False, (level,), 0, 0, inline_ns)


def _slot_utilization(direct: ModelSequenceBatching.StrategyDirect, max_batch_size: int,
                      delay: float) -> tuple[tuple[int, ...], float]:
    """Direct's batch sizes and delay, as Triton has them: its max_queue_delay_microseconds counts only with a
    minimum_slot_utilization (without one a batch runs as soon as any slot has a request); with one, a batch
    runs once that share of the slots have requests (any size from there up is preferred) or the delay ran out."""
    utilization = direct.minimum_slot_utilization
    if not 0 <= utilization <= 1:
        raise ConfigError(f"sequence_batching direct minimum_slot_utilization must be between 0 and 1, got "
                          f"{utilization:g}")
    if utilization == 0 or max_batch_size == 0:
        return (), 0.0
    least = max(1, math.ceil(utilization * max_batch_size))
    return tuple(range(max_batch_size, least - 1, -1)), delay


def _natural_parameter(config: ModelConfig, name: str, default: int = 0) -> int:
    return natural_parameter(string_parameters(config), (name,), default)


def _level(policy: ModelQueuePolicy) -> LevelPolicy:
    return LevelPolicy(
        max_queue_size=policy.max_queue_size,
        default_timeout_s=policy.default_timeout_microseconds / 1e6,
        allow_timeout_override=policy.allow_timeout_override,
        delay_on_timeout=policy.timeout_action == ModelQueuePolicy.DELAY,
    )
