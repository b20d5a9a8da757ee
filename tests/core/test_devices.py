"""core/devices.py's choices, without a GPU: how many GPUs are visible, which groups keep KIND_GPU, which instance
runs on which GPU, and the refusal and the CPU fallback where there is none (the GPU path itself runs on a GPU host:
test_sagemaker_streaming.py covers the server's side on this one)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from modelhost.config.model_config_pb2 import ModelInstanceGroup
from modelhost.config.pbtxt import ConfigError, parse_config
from modelhost.core.devices import instance_gpu, place_instances, visible_gpus

GROUPS = ('name: "m" instance_group [ { count: 1 kind: KIND_CPU }, '
          '{ name: "big" count: 3 kind: KIND_GPU gpus: [ 1, 0 ] } ]')


def driver(tmp_path: Path, count: int) -> Path:
    for index in range(count):
        (tmp_path / f"0000:0{index}:00.0").mkdir()
    return tmp_path


def test_visible_gpus_counts_the_driver_narrowed_by_cuda_visible_devices(tmp_path: Path) -> None:
    gpus = driver(tmp_path, 4)
    assert visible_gpus({}, gpus) == 4
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}, gpus) == 2
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, gpus) == 0
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}, gpus) == 0
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,x,1"}, gpus) == 1  # CUDA stops at the first bad entry
    assert visible_gpus({}, tmp_path / "absent") == 0


def test_gpu_groups_stay_where_the_backend_has_gpus_and_spread_over_them() -> None:
    config = parse_config(GROUPS)
    place_instances(config, "onnxruntime", 2, fallback=False)
    assert [g.kind for g in config.instance_group] == [ModelInstanceGroup.KIND_CPU, ModelInstanceGroup.KIND_GPU]
    assert [instance_gpu(config, i) for i in range(4)] == [None, 1, 0, 1]
    with pytest.raises(ConfigError, match="instance group big: gpu id 1 does not exist; onnxruntime sees 1 GPU"):
        place_instances(parse_config(GROUPS), "onnxruntime", 1, fallback=False)


def test_without_a_gpu_the_load_is_refused_naming_the_group_and_the_fallback() -> None:
    with pytest.raises(ConfigError) as refused:
        place_instances(parse_config(GROUPS), "pytorch", 0, fallback=False, why_none="torch has no CUDA")
    message = str(refused.value)
    assert "model 'm'" in message and "instance group big has kind KIND_GPU, but torch has no CUDA" in message
    assert "--gpu-fallback cpu" in message and "SAGEMAKER_GPU_FALLBACK=cpu" in message
    unnamed = parse_config('name: "m" instance_group [ { kind: KIND_GPU }, { kind: KIND_GPU } ]')
    with pytest.raises(ConfigError, match="instance groups m_0, m_1 have kind KIND_GPU, but this host has no GPU"):
        place_instances(unnamed, "onnxruntime", 0, fallback=False)


def test_the_fallback_runs_gpu_groups_on_cpu_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    config = parse_config(GROUPS)
    with caplog.at_level(logging.WARNING, logger="modelhost.devices"):
        place_instances(config, "onnxruntime", 0, fallback=True)
    assert [g.kind for g in config.instance_group] == [ModelInstanceGroup.KIND_CPU] * 2
    assert not config.instance_group[1].gpus and config.instance_group[1].count == 3
    assert [instance_gpu(config, i) for i in range(4)] == [None] * 4
    assert len(caplog.records) == 1 and "big" in caplog.messages[0] and "running on CPU" in caplog.messages[0]
    untouched = parse_config('name: "m" instance_group [ { kind: KIND_CPU } ]')
    place_instances(untouched, "onnxruntime", 0, fallback=False)  # no GPU group: nothing to decide
