"""Where a model's instances run: its config's instance groups against the GPUs this host's backend can use.

A KIND_GPU group loads on the GPUs where the backend can reach some (ONNX Runtime's CUDA provider, torch CUDA):
its `count` instances spread over the group's `gpus` (all of them when it lists none). Where there is none, the
load fails naming the group, as Triton refuses a KIND_GPU config on a host without GPUs (Triton's wording: the
group "has kind KIND_GPU but specifies no GPUs"); unless the operator allows the CPU fallback (--gpu-fallback cpu,
SAGEMAKER_GPU_FALLBACK=cpu), which turns the groups into KIND_CPU with one warning at load, so that an archive
written for a GPU endpoint can be tried on a laptop. Decided once per load (plan_model); nothing per request.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from modelhost.backends.base import Backend
from modelhost.config.model_config_pb2 import ModelConfig, ModelInstanceGroup
from modelhost.config.pbtxt import CONFIG_FILENAME, ConfigError
from modelhost.digits import is_digits

log = logging.getLogger("modelhost.devices")

KIND_GPU = ModelInstanceGroup.KIND_GPU
FALLBACK_HINT = "start modelhost with --gpu-fallback cpu (or set SAGEMAKER_GPU_FALLBACK=cpu) to run it on CPU here"
_DRIVER_GPUS = Path("/proc/driver/nvidia/gpus")


def visible_gpus(environ: Mapping[str, str] = os.environ, driver_gpus: Path = _DRIVER_GPUS) -> int:
    """How many NVIDIA GPUs this process may use: the driver's, narrowed by CUDA_VISIBLE_DEVICES; cheap (no CUDA
    initialisation), so a host without GPUs answers without importing a framework."""
    try:
        present = sum(1 for _ in driver_gpus.iterdir())
    except OSError:
        return 0
    chosen = environ.get("CUDA_VISIBLE_DEVICES")
    if chosen is None:
        return present
    ids = [part.strip() for part in chosen.split(",") if part.strip()]
    usable = 0
    for part in ids:  # CUDA stops at the first invalid entry
        if not is_digits(part.lstrip("-")) or int(part) < 0:
            break
        usable += 1
    return min(usable, present)


def gpu_groups(config: ModelConfig) -> list[str]:
    """The names of the config's KIND_GPU groups (Triton's default name: <model>_<index>)."""
    return [group.name or f"{config.name}_{i}" for i, group in enumerate(config.instance_group)
            if group.kind == KIND_GPU]


def place_instances(config: ModelConfig, backend: str, gpus: int, fallback: bool, why_none: str = "") -> None:
    """Check `config`'s KIND_GPU groups against the `gpus` the backend can use (in place): kept where there are
    GPUs, turned into KIND_CPU with a warning when there are none and `fallback` allows it, else ConfigError.
    `why_none`: why the backend has none although the host may (e.g. a CPU-only onnxruntime)."""
    groups = gpu_groups(config)
    if not groups:
        return
    where = f"model '{config.name}': {CONFIG_FILENAME} instance group{'s' if len(groups) > 1 else ''} " \
            f"{', '.join(groups)}"
    if gpus > 0:
        for group in config.instance_group:
            wrong = [gid for gid in group.gpus if not 0 <= gid < gpus] if group.kind == KIND_GPU else []
            if wrong:
                raise ConfigError(f"{where}: gpu id {wrong[0]} does not exist; {backend} sees {gpus} GPU(s) here "
                                  f"(ids 0-{gpus - 1})")
        return
    reason = why_none or "this host has no GPU"
    if not fallback:
        raise ConfigError(f"{where} {'has' if len(groups) == 1 else 'have'} kind KIND_GPU, but {reason}; "
                          f"{FALLBACK_HINT}")
    for group in config.instance_group:
        if group.kind == KIND_GPU:
            group.kind = ModelInstanceGroup.KIND_CPU
            del group.gpus[:]
    log.warning("%s asked for KIND_GPU, but %s: running on CPU instead (--gpu-fallback cpu); expect it to be "
                "slower than on the GPU endpoint it was written for", where, reason)


def place(config: ModelConfig, backend: Backend, fallback: bool) -> None:
    """`place_instances` with this host's GPUs as `backend` sees them (asked only when a group wants a GPU)."""
    if not gpu_groups(config):
        return
    gpus, why_none = (backend.gpu_devices() if visible_gpus() else (0, "this host has no GPU"))
    place_instances(config, backend.name, gpus, fallback, why_none)


def instance_gpu(config: ModelConfig, index: int) -> int | None:
    """The GPU that instance `index` (counted over the groups in order) runs on; None for a CPU instance."""
    for group in config.instance_group:
        count = max(group.count, 1)
        if index < count:
            if group.kind != KIND_GPU:
                return None
            ids = list(group.gpus) or list(range(max(visible_gpus(), 1)))
            return ids[index % len(ids)]
        index -= count
    return None
