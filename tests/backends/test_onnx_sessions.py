"""ONNX Runtime sessions of a model's instances, through the loader: one each by default, one for them all with
Triton's share_session_between_instances (its weights held once), with every run's answer its own."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from modelhost.config.pbtxt import ConfigError
from modelhost.core.model_loading import load_version, plan_model
from modelhost.store.local import LocalStore
from tests.onnx_models import scale_model, write_model

CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 8
instance_group [ { count: 3 kind: KIND_CPU } ]
%s
"""
SHARED = 'parameters { key: "share_session_between_instances" value { string_value: "%s" } }'


def served_sessions(tmp_path: Path, parameters: str, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], Any]:
    """The model's instances and the sessions ONNX Runtime created for them (a spy that creates them)."""
    write_model(tmp_path, "m", scale_model(3.0), CONFIG % parameters)
    created: list[ort.InferenceSession] = []
    session_class = ort.InferenceSession

    def create(*args: Any, **kwargs: Any) -> ort.InferenceSession:
        created.append(session_class(*args, **kwargs))
        return created[-1]

    monkeypatch.setattr(ort, "InferenceSession", create)
    source = LocalStore(tmp_path).fetch("m")
    served = load_version(source, 1, plan_model(source), cpu_count=6, default_max_batch_size=4)
    return [instance for instance, _ in served.scheduler._instances], (served, created)  # type: ignore[attr-defined]


def run_at_once(instances: list[Any]) -> None:
    inputs = [np.full((2, 4), float(i), np.float32) for i in range(30)]
    with ThreadPoolExecutor(len(instances)) as pool:
        answers = list(pool.map(lambda item: instances[item[0] % len(instances)].infer({"INPUT0": item[1]},
                                                                                       ["OUTPUT0"])["OUTPUT0"],
                                enumerate(inputs)))
    for x, y in zip(inputs, answers, strict=True):
        np.testing.assert_array_equal(y, x * 3.0)


def test_each_instance_has_its_session_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    instances, (served, created) = served_sessions(tmp_path, "", monkeypatch)
    try:
        assert len(instances) == 3 and len(created) == 3
        assert [s.get_session_options().intra_op_num_threads for s in created] == [2, 2, 2]
        run_at_once(instances)
    finally:
        asyncio.run(served.scheduler.stop())


def test_shared_instances_run_at_once_on_one_session_of_all_their_threads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    instances, (served, created) = served_sessions(tmp_path, SHARED % "true", monkeypatch)
    try:
        assert len(instances) == 3 and len(created) == 1
        assert created[0].get_session_options().intra_op_num_threads == 6
        run_at_once(instances)
        instances[0].unload()  # its queue drained: the others keep the session
        np.testing.assert_array_equal(instances[2].infer({"INPUT0": np.ones((1, 4), np.float32)}, ["OUTPUT0"])
                                      ["OUTPUT0"], [[3.0] * 4])
    finally:
        asyncio.run(served.scheduler.stop())


def test_a_bad_sharing_value_is_a_config_error_naming_the_parameter(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="share_session_between_instances must be true or false, got 'maybe'"):
        served_sessions(tmp_path, SHARED % "maybe", monkeypatch)
