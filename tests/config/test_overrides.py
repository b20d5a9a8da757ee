"""ModelOverrides: endpoint-wide settings fill what config.pbtxt leaves unset, and reach the served model."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import onnxruntime as ort
import pytest
from onnx import TensorProto

from modelhost.config.model_config_pb2 import ModelConfig, ModelInstanceGroup
from modelhost.config.overrides import ModelOverrides, apply_overrides
from modelhost.config.pbtxt import parse_config
from modelhost.core.model_loading import load_version, plan_model
from modelhost.core.policy import SchedulingPolicy
from modelhost.core.served_model import ServedModel
from modelhost.store.local import LocalStore
from tests.onnx_models import ADD_SUB_CONFIG, add_sub_model, identity_model, write_model

EVERYTHING = ModelOverrides(
    dynamic_batching=True, max_batch_size=16, max_queue_delay_microseconds=500, max_queue_size=64,
    instance_count=3, intra_op_threads=1, inter_op_threads=2,
)


def applied(text: str, overrides: ModelOverrides = EVERYTHING) -> ModelConfig:
    config = parse_config(text)
    apply_overrides(config, overrides)
    return config


def parameters(config: ModelConfig) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


class TestApplyOverrides:
    def test_fills_an_empty_config(self) -> None:
        config = applied("")
        assert config.WhichOneof("scheduling_choice") == "dynamic_batching"
        assert config.dynamic_batching.max_queue_delay_microseconds == 500
        assert config.dynamic_batching.default_queue_policy.max_queue_size == 64
        assert [(g.count, g.kind) for g in config.instance_group] == [(3, ModelInstanceGroup.KIND_CPU)]
        assert parameters(config) == {"intra_op_thread_count": "1", "inter_op_thread_count": "2", "execution_mode": "1"}

    def test_max_batch_size_is_left_to_completion(self) -> None:
        # Only completion knows whether the model can batch (see the load tests below).
        assert applied("").max_batch_size == 0

    def test_keeps_what_the_config_sets(self) -> None:
        config = applied("""
            dynamic_batching { max_queue_delay_microseconds: 50 default_queue_policy { max_queue_size: 3 } }
            instance_group [ { count: 2 kind: KIND_CPU } ]
            parameters { key: "intra_op_num_threads" value: { string_value: "4" } }
            parameters { key: "inter_op_thread_count" value: { string_value: "5" } }
        """)
        assert config.dynamic_batching.max_queue_delay_microseconds == 50
        assert config.dynamic_batching.default_queue_policy.max_queue_size == 3
        assert [g.count for g in config.instance_group] == [2]
        # the ORT alias counts as set; nothing is added beside it, and no execution mode either
        assert parameters(config) == {"intra_op_num_threads": "4", "inter_op_thread_count": "5"}

    def test_fills_the_configs_own_batcher(self) -> None:
        config = applied("dynamic_batching { preferred_batch_size: [ 4 ] }", ModelOverrides(
            max_queue_delay_microseconds=700, max_queue_size=9))
        assert list(config.dynamic_batching.preferred_batch_size) == [4]
        assert config.dynamic_batching.max_queue_delay_microseconds == 700
        assert config.dynamic_batching.default_queue_policy.max_queue_size == 9

    def test_queue_settings_need_a_dynamic_batcher(self) -> None:
        config = applied("", ModelOverrides(dynamic_batching=False, max_queue_delay_microseconds=700,
                                            max_queue_size=9))
        assert config.WhichOneof("scheduling_choice") is None

    def test_another_scheduling_choice_is_kept(self) -> None:
        config = applied("sequence_batching { }")
        assert config.WhichOneof("scheduling_choice") == "sequence_batching"

    def test_instance_groups_without_count_are_filled(self) -> None:
        config = applied("instance_group [ { kind: KIND_CPU }, { count: 1 } ]")
        assert [g.count for g in config.instance_group] == [3, 1]

    def test_zero_threads_let_modelhost_decide(self) -> None:
        assert parameters(applied("", ModelOverrides(intra_op_threads=0, inter_op_threads=0))) == {}

    def test_one_inter_op_thread_needs_no_parallel_mode(self) -> None:
        assert parameters(applied("", ModelOverrides(inter_op_threads=1))) == {"inter_op_thread_count": "1"}

    def test_an_explicit_execution_mode_is_kept(self) -> None:
        config = applied('parameters { key: "execution_mode" value: { string_value: "0" } }',
                         ModelOverrides(inter_op_threads=4))
        assert parameters(config) == {"execution_mode": "0", "inter_op_thread_count": "4"}

    def test_no_overrides_change_nothing(self) -> None:
        text = ADD_SUB_CONFIG
        assert applied(text, ModelOverrides()) == parse_config(text)

    def test_merged_over(self) -> None:
        merged = ModelOverrides(max_batch_size=4).merged_over(ModelOverrides(max_batch_size=2, instance_count=5))
        assert merged == ModelOverrides(max_batch_size=4, instance_count=5)


# --------------------------------------------------------------------------- through the loader


@pytest.fixture
def loaded() -> Iterator[list[ServedModel]]:
    served: list[ServedModel] = []
    yield served
    for model in served:
        asyncio.run(model.scheduler.stop())


def load(repo: Path, name: str, overrides: ModelOverrides | None, cpu_count: int = 8) -> ServedModel:
    source = LocalStore(repo).fetch(name)
    return load_version(source, 1, plan_model(source, overrides), cpu_count=cpu_count, default_max_batch_size=4)


def sessions(served: ServedModel) -> list[ort.SessionOptions]:
    return [instance._session.get_session_options() for instance, _ in served.scheduler._instances]  # type: ignore[attr-defined]


class TestThroughTheLoader:
    def test_a_model_without_config_takes_every_override(self, tmp_path: Path, loaded: list[ServedModel]) -> None:
        write_model(tmp_path, "auto", add_sub_model(), None)
        served = load(tmp_path, "auto", EVERYTHING)
        loaded.append(served)
        assert served.config.max_batch_size == 16
        policy = served.scheduler._policy  # type: ignore[attr-defined]
        assert policy == SchedulingPolicy.from_config(served.config)
        assert policy.batching and policy.max_batch_size == 16
        assert policy.max_queue_delay_s == pytest.approx(0.0005)
        assert policy.levels[0].max_queue_size == 64
        options = sessions(served)
        assert len(options) == 3
        assert {(o.intra_op_num_threads, o.inter_op_num_threads, o.execution_mode) for o in options} == {
            (1, 2, ort.ExecutionMode.ORT_PARALLEL)}

    def test_the_config_wins(self, tmp_path: Path, loaded: list[ServedModel]) -> None:
        config = ADD_SUB_CONFIG + """
            instance_group [ { count: 1 kind: KIND_CPU } ]
            dynamic_batching { max_queue_delay_microseconds: 100 default_queue_policy { max_queue_size: 2 } }
        """
        write_model(tmp_path, "simple", add_sub_model(), config)
        served = load(tmp_path, "simple", EVERYTHING)
        loaded.append(served)
        policy = served.scheduler._policy  # type: ignore[attr-defined]
        assert (policy.max_batch_size, policy.max_queue_delay_s, policy.levels[0].max_queue_size) == (8, 0.0001, 2)
        assert len(sessions(served)) == 1

    def test_max_batch_size_reaches_only_models_that_can_batch(
        self, tmp_path: Path, loaded: list[ServedModel]
    ) -> None:
        write_model(tmp_path, "fixed", identity_model(TensorProto.INT32, batch=False, dims=(3, -1)), None)
        served = load(tmp_path, "fixed", ModelOverrides(max_batch_size=16, dynamic_batching=True))
        loaded.append(served)
        assert served.config.max_batch_size == 0
        assert not served.scheduler._policy.batching  # type: ignore[attr-defined]

    def test_declared_io_without_max_batch_size_stays_unbatched(
        self, tmp_path: Path, loaded: list[ServedModel]
    ) -> None:
        config = ADD_SUB_CONFIG.replace("max_batch_size: 8", "").replace("dims: [ 16 ]", "dims: [ -1, 16 ]")
        write_model(tmp_path, "declared", add_sub_model(), config)
        served = load(tmp_path, "declared", ModelOverrides(max_batch_size=16))
        loaded.append(served)
        assert served.config.max_batch_size == 0

    def test_without_overrides_threads_split_the_cores(self, tmp_path: Path, loaded: list[ServedModel]) -> None:
        write_model(tmp_path, "auto", add_sub_model(), 'instance_group [ { count: 2 kind: KIND_CPU } ]')
        served = load(tmp_path, "auto", None, cpu_count=8)
        loaded.append(served)
        assert served.config.max_batch_size == 4  # the server's default_max_batch_size
        assert [(o.intra_op_num_threads, o.execution_mode) for o in sessions(served)] == [
            (4, ort.ExecutionMode.ORT_SEQUENTIAL)] * 2
        assert served.scheduler._policy.batching is False  # type: ignore[attr-defined]

    def test_instance_count_splits_the_cores(self, tmp_path: Path, loaded: list[ServedModel]) -> None:
        write_model(tmp_path, "auto", add_sub_model(), None)
        served = load(tmp_path, "auto", ModelOverrides(instance_count=4), cpu_count=8)
        loaded.append(served)
        assert [o.intra_op_num_threads for o in sessions(served)] == [2] * 4

    def test_execution_mode_must_be_0_or_1(self, tmp_path: Path) -> None:
        config = 'parameters { key: "execution_mode" value: { string_value: "2" } }'
        write_model(tmp_path, "auto", add_sub_model(), config)
        with pytest.raises(ValueError, match="parameter execution_mode must be 0 .* or 1 .*, got '2'"):
            load(tmp_path, "auto", None)
