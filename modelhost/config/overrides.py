"""Endpoint-wide model settings (from SAGEMAKER_* variables) that fill what a model's config.pbtxt leaves unset.

A model's config.pbtxt is more specific than a variable that applies to every model of an endpoint,
so an override never replaces a value the config sets. proto3 cannot tell an absent scalar from an
explicit 0, so a 0 in config.pbtxt (max_batch_size, max_queue_delay_microseconds, max_queue_size,
instance_group count) reads as unset, as Triton's own auto-complete reads max_batch_size 0.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from modelhost.config.model_config_pb2 import ModelConfig, ModelInstanceGroup

# config `parameters` keys a backend reads for its thread pools: the first is Triton's name, which
# overrides write; the others are aliases a config may use instead (ONNX Runtime's own names).
INTRA_OP_PARAMETERS = ("intra_op_thread_count", "intra_op_num_threads")
INTER_OP_PARAMETERS = ("inter_op_thread_count", "inter_op_num_threads")
# Triton's onnxruntime name: "0" runs the graph's operators one at a time, "1" runs independent ones in parallel.
EXECUTION_MODE_PARAMETER = "execution_mode"


@dataclass(frozen=True, slots=True)
class ModelOverrides:
    """What every model of the server gets unless its config.pbtxt says otherwise; None = no override.

    Which variable sets which field (settings_sources.settings_from_environment reads them):

    | Variable | Field |
    |---|---|
    | SAGEMAKER_TFS_ENABLE_BATCHING | dynamic_batching (TF Serving's defaults 8 rows, 1000 µs when on) |
    | SAGEMAKER_TFS_MAX_BATCH_SIZE | max_batch_size |
    | SAGEMAKER_TFS_BATCH_TIMEOUT_MICROS | max_queue_delay_microseconds |
    | SAGEMAKER_TFS_NUM_BATCH_THREADS | instance_count (threads that run batches) |
    | SAGEMAKER_TFS_MAX_ENQUEUED_BATCHES | max_queue_size = batches x max batch size |
    | SAGEMAKER_TFS_INTRA_OP_PARALLELISM | intra_op_threads (0 = modelhost decides) |
    | SAGEMAKER_TFS_INTER_OP_PARALLELISM | inter_op_threads (0 = modelhost decides) |
    | SAGEMAKER_TS_BATCH_SIZE | max_batch_size, and dynamic_batching on when > 1 |
    | SAGEMAKER_TS_MAX_BATCH_DELAY (ms) | max_queue_delay_microseconds = ms x 1000 |
    | SAGEMAKER_TS_MIN_WORKERS / MAX_WORKERS | instance_count = the larger |
    | SAGEMAKER_MODEL_SERVER_WORKERS | instance_count (MMS workers per model) |

    max_batch_size reaches only models that can batch: it replaces the server's default_max_batch_size
    where config completion would use that (core/model_loading.py load_version), never a config's own I/O.
    """

    dynamic_batching: bool | None = None
    max_batch_size: int | None = None
    max_queue_delay_microseconds: int | None = None
    max_queue_size: int | None = None
    instance_count: int | None = None
    intra_op_threads: int | None = None
    inter_op_threads: int | None = None
    gpu_fallback: bool | None = None  # KIND_GPU groups run on CPU where there is no GPU (core/devices.py)

    def merged_over(self, base: ModelOverrides) -> ModelOverrides:
        """These overrides, with `base`'s values where these have none."""
        return ModelOverrides(**{
            f.name: getattr(base, f.name) if getattr(self, f.name) is None else getattr(self, f.name)
            for f in fields(self)
        })


def apply_overrides(config: ModelConfig, overrides: ModelOverrides) -> None:
    """Fill in place what `config` (as read from config.pbtxt) leaves unset; called before completion.

    A config with another scheduling choice (sequence batching, ensemble) gets no dynamic batcher; queue
    delay and size fill only a dynamic batcher, the config's own or the one this adds.
    """
    if overrides.dynamic_batching and config.WhichOneof("scheduling_choice") is None:
        config.dynamic_batching.SetInParent()
    if config.WhichOneof("scheduling_choice") == "dynamic_batching":
        batching = config.dynamic_batching
        if overrides.max_queue_delay_microseconds is not None and batching.max_queue_delay_microseconds == 0:
            batching.max_queue_delay_microseconds = overrides.max_queue_delay_microseconds
        if overrides.max_queue_size is not None and batching.default_queue_policy.max_queue_size == 0:
            batching.default_queue_policy.max_queue_size = overrides.max_queue_size
    if overrides.instance_count:
        if not config.instance_group:
            config.instance_group.add(count=overrides.instance_count, kind=ModelInstanceGroup.KIND_CPU)
        for group in config.instance_group:
            if group.count == 0:
                group.count = overrides.instance_count
    _fill_parameter(config, INTRA_OP_PARAMETERS, overrides.intra_op_threads)
    if _fill_parameter(config, INTER_OP_PARAMETERS, overrides.inter_op_threads) and overrides.inter_op_threads != 1:
        # ONNX Runtime uses its inter-op pool only in parallel mode; without it the setting would do nothing.
        if EXECUTION_MODE_PARAMETER not in config.parameters:
            config.parameters[EXECUTION_MODE_PARAMETER].string_value = "1"


def _fill_parameter(config: ModelConfig, names: tuple[str, ...], value: int | None) -> bool:
    """Set parameter names[0] to `value` unless it is None/0 or the config names it already; True if set."""
    if not value or any(name in config.parameters for name in names):
        return False
    config.parameters[names[0]].string_value = str(value)
    return True
