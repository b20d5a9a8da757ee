"""ServerSettings from the environment: every SAGEMAKER_* variable, its errors, and the precedence rules."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from modelhost.config.overrides import ModelOverrides
from modelhost.settings import (
    GIB,
    ServerSettings,
    SettingsError,
    handler_threads,
    memory_bytes,
    parse_byte_size,
    unpacked_cache_bytes,
)
from modelhost.settings_checks import check_settings
from modelhost.settings_sources import (
    resolve_settings,
    sagemaker_repository,
    settings_from_environment,
    unused_variables,
)

BASE = ServerSettings()


def from_env(**environ: str) -> ServerSettings:
    return settings_from_environment(BASE, environ)


def overrides(**environ: str) -> ModelOverrides:
    return from_env(**environ).model_overrides


class TestDefaults:
    def test_new_fields(self) -> None:
        s = ServerSettings()
        assert (s.sagemaker_port, s.multi_model, s.s3_endpoint_url) == (8080, False, None)
        assert s.max_unpacked_bytes == 16 * GIB
        assert (s.invocation_timeout_seconds, s.default_accept) == (60.0, "application/json")
        assert (s.sagemaker_program, s.default_model_name, s.model_repository) == ("inference.py", "model", None)
        assert s.model_overrides == ModelOverrides()

    def test_model_cache_is_half_the_memory(self) -> None:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        assert 0 < memory_bytes() <= physical
        assert ServerSettings().model_cache_bytes == memory_bytes() // 2

    def test_an_empty_environment_changes_nothing(self) -> None:
        assert settings_from_environment(BASE, {}) == BASE
        assert settings_from_environment(BASE, {"SAGEMAKER_TFS_MAX_BATCH_SIZE": " ", "UNRELATED": "x"}) == BASE

    def test_reads_only_the_mapping_it_gets(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("SAGEMAKER_BIND_TO_PORT", "not a port")
        assert settings_from_environment(BASE, {}).sagemaker_port == 8080


@pytest.mark.parametrize(("text", "expected"), [
    ("123", 123), ("512MiB", 512 * 1024**2), ("2GB", 2 * 1000**3), ("4GiB", 4 * GIB), ("4gib", 4 * GIB),
    ("1.5 KiB", 1536), ("10kb", 10_000), ("7B", 7), ("1TiB", 1024**4),
])
def test_parse_byte_size(text: str, expected: int) -> None:
    assert parse_byte_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "-1", "12XB", "1e9", "four"])
def test_parse_byte_size_rejects(text: str) -> None:
    with pytest.raises(SettingsError, match="is not a size in bytes"):
        parse_byte_size(text)


@pytest.mark.parametrize(("environ", "expected"), [
    ({"SAGEMAKER_BIND_TO_PORT": "9090"}, {"sagemaker_port": 9090}),
    ({"SAGEMAKER_MULTI_MODEL": "true"}, {"multi_model": True}),
    ({"SAGEMAKER_MULTI_MODEL": "TRUE"}, {"multi_model": True}),
    ({"SAGEMAKER_MULTI_MODEL": "false"}, {"multi_model": False}),
    ({"SAGEMAKER_MULTI_MODEL": "0"}, {"multi_model": False}),
    ({"SAGEMAKER_TFS_INSTANCE_COUNT": "3"}, {"workers": 3}),
    ({"SAGEMAKER_MODEL_SERVER_TIMEOUT": "120"}, {"invocation_timeout_seconds": 120.0}),
    ({"SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS": "2.5"}, {"invocation_timeout_seconds": 2.5}),
    ({"SAGEMAKER_TS_RESPONSE_TIMEOUT": "30"}, {"invocation_timeout_seconds": 30.0}),
    ({"SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT": "text/csv"}, {"default_accept": "text/csv"}),
    ({"SAGEMAKER_PROGRAM": "handler.py"}, {"sagemaker_program": "handler.py"}),
    ({"SAGEMAKER_TFS_DEFAULT_MODEL_NAME": "half_plus_three"}, {"default_model_name": "half_plus_three"}),
    ({"SAGEMAKER_GPU_FALLBACK": "cpu"}, {"gpu_fallback": "cpu"}),
])
def test_server_variables(environ: dict[str, str], expected: dict[str, Any]) -> None:
    assert settings_from_environment(BASE, environ) == replace(BASE, **expected)


@pytest.mark.parametrize(("environ", "expected"), [
    ({"SAGEMAKER_TFS_ENABLE_BATCHING": "true"},  # TF Serving's defaults fill size and timeout
     ModelOverrides(dynamic_batching=True, max_batch_size=8, max_queue_delay_microseconds=1000)),
    ({"SAGEMAKER_TFS_ENABLE_BATCHING": "false"}, ModelOverrides(dynamic_batching=False)),
    ({"SAGEMAKER_TFS_ENABLE_BATCHING": "true", "SAGEMAKER_TFS_MAX_BATCH_SIZE": "32",
      "SAGEMAKER_TFS_BATCH_TIMEOUT_MICROS": "0"},
     ModelOverrides(dynamic_batching=True, max_batch_size=32, max_queue_delay_microseconds=0)),
    ({"SAGEMAKER_TFS_MAX_BATCH_SIZE": "32"}, ModelOverrides(max_batch_size=32)),
    ({"SAGEMAKER_TFS_BATCH_TIMEOUT_MICROS": "250"}, ModelOverrides(max_queue_delay_microseconds=250)),
    ({"SAGEMAKER_TFS_NUM_BATCH_THREADS": "4"}, ModelOverrides(instance_count=4)),
    ({"SAGEMAKER_TFS_MAX_ENQUEUED_BATCHES": "10"}, ModelOverrides(max_queue_size=80)),  # x TF Serving's 8
    ({"SAGEMAKER_TFS_MAX_ENQUEUED_BATCHES": "10", "SAGEMAKER_TFS_MAX_BATCH_SIZE": "16"},
     ModelOverrides(max_batch_size=16, max_queue_size=160)),
    ({"SAGEMAKER_TFS_INTRA_OP_PARALLELISM": "2"}, ModelOverrides(intra_op_threads=2)),
    ({"SAGEMAKER_TFS_INTER_OP_PARALLELISM": "3"}, ModelOverrides(inter_op_threads=3)),
    ({"SAGEMAKER_TFS_INTRA_OP_PARALLELISM": "0", "SAGEMAKER_TFS_INTER_OP_PARALLELISM": "0"}, ModelOverrides()),
    ({"SAGEMAKER_TS_BATCH_SIZE": "4"},  # TorchServe's max_batch_delay default: 100 ms
     ModelOverrides(dynamic_batching=True, max_batch_size=4, max_queue_delay_microseconds=100_000)),
    ({"SAGEMAKER_TS_BATCH_SIZE": "1"}, ModelOverrides()),  # TorchServe's default: no batching
    ({"SAGEMAKER_TS_BATCH_SIZE": "4", "SAGEMAKER_TS_MAX_BATCH_DELAY": "5"},
     ModelOverrides(dynamic_batching=True, max_batch_size=4, max_queue_delay_microseconds=5000)),
    ({"SAGEMAKER_TS_MAX_BATCH_DELAY": "5"}, ModelOverrides(max_queue_delay_microseconds=5000)),
    ({"SAGEMAKER_TS_MIN_WORKERS": "2", "SAGEMAKER_TS_MAX_WORKERS": "4"}, ModelOverrides(instance_count=4)),
    ({"SAGEMAKER_TS_MIN_WORKERS": "3"}, ModelOverrides(instance_count=3)),
    ({"SAGEMAKER_TS_MAX_WORKERS": "2"}, ModelOverrides(instance_count=2)),
    ({"SAGEMAKER_MODEL_SERVER_WORKERS": "2"}, ModelOverrides(instance_count=2)),
    # equal values from two variables are no conflict
    ({"SAGEMAKER_TFS_MAX_BATCH_SIZE": "4", "SAGEMAKER_TS_BATCH_SIZE": "4"},
     ModelOverrides(dynamic_batching=True, max_batch_size=4, max_queue_delay_microseconds=100_000)),
    # TF Serving's switch picks TF Serving's timeout default
    ({"SAGEMAKER_TFS_ENABLE_BATCHING": "true", "SAGEMAKER_TS_BATCH_SIZE": "4"},
     ModelOverrides(dynamic_batching=True, max_batch_size=4, max_queue_delay_microseconds=1000)),
    # server-specific beats the generic SAGEMAKER_MODEL_SERVER_WORKERS
    ({"SAGEMAKER_TFS_NUM_BATCH_THREADS": "3", "SAGEMAKER_MODEL_SERVER_WORKERS": "5"}, ModelOverrides(instance_count=3)),
    ({"SAGEMAKER_TS_MAX_WORKERS": "2", "SAGEMAKER_MODEL_SERVER_WORKERS": "5"}, ModelOverrides(instance_count=2)),
])
def test_model_variables(environ: dict[str, str], expected: ModelOverrides) -> None:
    assert overrides(**environ) == expected


def test_server_specific_timeout_beats_the_generic_one() -> None:
    settings = from_env(SAGEMAKER_TS_RESPONSE_TIMEOUT="30", SAGEMAKER_MODEL_SERVER_TIMEOUT="90")
    assert settings.invocation_timeout_seconds == 30.0


def test_gpu_fallback_must_be_none_or_cpu() -> None:
    check_settings(replace(BASE, gpu_fallback="cpu"))
    with pytest.raises(SettingsError, match="SAGEMAKER_GPU_FALLBACK must be one of none, cpu, got 'gpu'"):
        check_settings(replace(BASE, gpu_fallback="gpu"))


def test_environment_overrides_merge_over_the_base() -> None:
    base = replace(BASE, model_overrides=ModelOverrides(max_batch_size=2, instance_count=5))
    merged = settings_from_environment(base, {"SAGEMAKER_TFS_MAX_BATCH_SIZE": "16"}).model_overrides
    assert merged == ModelOverrides(max_batch_size=16, instance_count=5)


@pytest.mark.parametrize(("environ", "message"), [
    ({"SAGEMAKER_BIND_TO_PORT": "http"}, "SAGEMAKER_BIND_TO_PORT='http' must be an integer between 1 and 65535"),
    ({"SAGEMAKER_BIND_TO_PORT": "0"}, "SAGEMAKER_BIND_TO_PORT='0' must be an integer between 1 and 65535"),
    ({"SAGEMAKER_BIND_TO_PORT": "70000"}, "SAGEMAKER_BIND_TO_PORT='70000'"),
    ({"SAGEMAKER_MULTI_MODEL": "maybe"}, "SAGEMAKER_MULTI_MODEL='maybe' must be true or false"),
    ({"SAGEMAKER_TFS_ENABLE_BATCHING": "yes please"}, "SAGEMAKER_TFS_ENABLE_BATCHING='yes please' must be true"),
    ({"SAGEMAKER_TFS_INSTANCE_COUNT": "0"}, "SAGEMAKER_TFS_INSTANCE_COUNT='0' must be an integer >= 1"),
    ({"SAGEMAKER_MODEL_SERVER_TIMEOUT": "soon"}, "SAGEMAKER_MODEL_SERVER_TIMEOUT='soon' must be a positive number"),
    ({"SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS": "0"}, "SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS='0' must be a positive"),
    ({"SAGEMAKER_TS_RESPONSE_TIMEOUT": "-5"}, "SAGEMAKER_TS_RESPONSE_TIMEOUT='-5' must be a positive"),
    ({"SAGEMAKER_TS_RESPONSE_TIMEOUT": "inf"}, "SAGEMAKER_TS_RESPONSE_TIMEOUT='inf' must be a positive"),
    ({"SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT": "json"}, "SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT='json' must be a media"),
    ({"SAGEMAKER_TFS_MAX_BATCH_SIZE": "0"}, "SAGEMAKER_TFS_MAX_BATCH_SIZE='0' must be an integer >= 1"),
    ({"SAGEMAKER_TFS_MAX_BATCH_SIZE": "8.5"}, "SAGEMAKER_TFS_MAX_BATCH_SIZE='8.5' must be an integer"),
    ({"SAGEMAKER_TFS_BATCH_TIMEOUT_MICROS": "-1"}, "SAGEMAKER_TFS_BATCH_TIMEOUT_MICROS='-1' must be an integer >= 0"),
    ({"SAGEMAKER_TFS_NUM_BATCH_THREADS": "0"}, "SAGEMAKER_TFS_NUM_BATCH_THREADS='0' must be an integer >= 1"),
    ({"SAGEMAKER_TFS_MAX_ENQUEUED_BATCHES": "x"}, "SAGEMAKER_TFS_MAX_ENQUEUED_BATCHES='x' must be an integer >= 1"),
    ({"SAGEMAKER_TFS_INTRA_OP_PARALLELISM": "-2"}, "SAGEMAKER_TFS_INTRA_OP_PARALLELISM='-2' must be an integer >= 0"),
    ({"SAGEMAKER_TFS_INTER_OP_PARALLELISM": "all"}, "SAGEMAKER_TFS_INTER_OP_PARALLELISM='all' must be an integer"),
    ({"SAGEMAKER_TS_BATCH_SIZE": "0"}, "SAGEMAKER_TS_BATCH_SIZE='0' must be an integer >= 1"),
    ({"SAGEMAKER_TS_MAX_BATCH_DELAY": "-1"}, "SAGEMAKER_TS_MAX_BATCH_DELAY='-1' must be an integer >= 0"),
    ({"SAGEMAKER_TS_MIN_WORKERS": "0"}, "SAGEMAKER_TS_MIN_WORKERS='0' must be an integer >= 1"),
    ({"SAGEMAKER_TS_MAX_WORKERS": "many"}, "SAGEMAKER_TS_MAX_WORKERS='many' must be an integer >= 1"),
    ({"SAGEMAKER_MODEL_SERVER_WORKERS": "0"}, "SAGEMAKER_MODEL_SERVER_WORKERS='0' must be an integer >= 1"),
    ({"SAGEMAKER_TS_MIN_WORKERS": "4", "SAGEMAKER_TS_MAX_WORKERS": "2"},
     "SAGEMAKER_TS_MIN_WORKERS='4' is more than SAGEMAKER_TS_MAX_WORKERS='2'"),
    # two server-specific variables that disagree: neither is more specific
    ({"SAGEMAKER_TFS_MAX_BATCH_SIZE": "16", "SAGEMAKER_TS_BATCH_SIZE": "4"},
     "SAGEMAKER_TFS_MAX_BATCH_SIZE='16' and SAGEMAKER_TS_BATCH_SIZE='4' set max_batch_size to different values"),
    ({"SAGEMAKER_TFS_ENABLE_BATCHING": "false", "SAGEMAKER_TS_BATCH_SIZE": "4"},
     "SAGEMAKER_TFS_ENABLE_BATCHING='false' and SAGEMAKER_TS_BATCH_SIZE='4' set dynamic_batching"),
    ({"SAGEMAKER_TFS_BATCH_TIMEOUT_MICROS": "1000", "SAGEMAKER_TS_MAX_BATCH_DELAY": "5"},
     "SAGEMAKER_TFS_BATCH_TIMEOUT_MICROS='1000' and SAGEMAKER_TS_MAX_BATCH_DELAY='5' set max_queue_delay"),
    ({"SAGEMAKER_TFS_NUM_BATCH_THREADS": "2", "SAGEMAKER_TS_MIN_WORKERS": "1", "SAGEMAKER_TS_MAX_WORKERS": "3"},
     "SAGEMAKER_TFS_NUM_BATCH_THREADS='2' and SAGEMAKER_TS_MIN_WORKERS='1', SAGEMAKER_TS_MAX_WORKERS='3' set "
     "instance_count"),
    ({"SAGEMAKER_MODEL_SERVER_TIMEOUT": "60", "SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS": "90"},
     "SAGEMAKER_MODEL_SERVER_TIMEOUT='60' and SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS='90' set the invocation timeout"),
])
def test_invalid_variables(environ: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as info:
        settings_from_environment(BASE, environ)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


class TestContainerVariables:
    def test_gunicorn_workers_times_threads_size_the_handler_pool(self) -> None:
        assert from_env(SAGEMAKER_GUNICORN_WORKERS="3", SAGEMAKER_GUNICORN_THREADS="4").handler_threads == 12
        assert from_env(SAGEMAKER_GUNICORN_WORKERS="2").handler_threads == 2
        assert from_env(SAGEMAKER_GUNICORN_THREADS="5").handler_threads == 5
        with pytest.raises(SettingsError, match="SAGEMAKER_GUNICORN_WORKERS='0' must be an integer >= 1"):
            from_env(SAGEMAKER_GUNICORN_WORKERS="0")

    def test_gunicorn_timeout_is_the_invocation_timeout(self) -> None:
        assert from_env(SAGEMAKER_GUNICORN_TIMEOUT_SECONDS="7").invocation_timeout_seconds == 7.0
        with pytest.raises(SettingsError, match="set the invocation timeout to different values"):
            from_env(SAGEMAKER_GUNICORN_TIMEOUT_SECONDS="7", SAGEMAKER_MODEL_SERVER_TIMEOUT="8")

    def test_safe_port_range_gives_the_grpc_port(self) -> None:
        assert from_env(SAGEMAKER_SAFE_PORT_RANGE="20000-20999").grpc_port == 20000
        for bad in ("20000", "b-c", "20999-20000", "0-10"):
            with pytest.raises(SettingsError, match="SAGEMAKER_SAFE_PORT_RANGE=.* must be a port range"):
                from_env(SAGEMAKER_SAFE_PORT_RANGE=bad)

    def test_unused_variables_are_named_with_why(self) -> None:
        notes = unused_variables({"SAGEMAKER_GUNICORN_WORKER_CLASS": "gevent", "SAGEMAKER_TFS_NGINX_LOGLEVEL": " ",
                                  "SAGEMAKER_TFS_FRACTIONAL_GPU_MEM_MARGIN": "0.2"})
        assert len(notes) == 2
        assert notes[0].startswith("SAGEMAKER_GUNICORN_WORKER_CLASS is set but not used: inference.py handlers run")
        assert "CPU" in notes[1]


class TestCheckSettings:
    @pytest.mark.parametrize(("changes", "message"), [
        ({"workers": 0}, "--workers must be at least 1, got 0"),
        ({"workers": 2, "multi_model": True}, "cannot be combined with multi-model mode"),
        ({"model_control_mode": "poll", "multi_model": True}, "poll cannot be combined with multi-model mode"),
        ({"sagemaker_port": 70000}, "--sagemaker-port must be a port 0-65535, got 70000"),
        ({"http_port": -1}, "--http-port must be a port"),
        ({"model_cache_bytes": 0}, "--model-cache-bytes must be positive, got 0"),
        ({"model_cache_policy": "fifo"}, "--model-cache-policy must be lfu or lru, got 'fifo'"),
        ({"max_unpacked_bytes": -1}, "--max-unpacked-bytes must be positive"),
        ({"invocation_timeout_seconds": 0.0}, "--invocation-timeout-seconds must be positive"),
        ({"handler_threads": -1}, r"--handler-threads must be 0 \(automatic\) or more, got -1"),
        ({"unpacked_cache_bytes": -1}, r"--unpacked-cache-bytes must be 0 \(automatic\) or more, got -1"),
        ({"allow_client_shm": True, "workers": 2}, "--allow-client-shm cannot be combined with --workers 2"),
        ({"client_shm_max_regions": 0}, "--client-shm-max-regions and --client-shm-max-bytes must be positive"),
        ({"lone_request_max_us": -1}, "--lone-request-max-us must be 0-1000000, got -1"),
        ({"lone_request_max_us": 2_000_000}, "--lone-request-max-us must be 0-1000000, got 2000000"),
    ])
    def test_errors(self, changes: dict[str, Any], message: str) -> None:
        with pytest.raises(SettingsError, match=message):
            check_settings(replace(BASE, **changes))

    def test_a_multi_model_endpoint_takes_explicit_mode(self) -> None:
        check_settings(replace(BASE, multi_model=True, model_control_mode="explicit", load_models=("m",)))

    def test_workers_with_multi_model_from_the_environment(self) -> None:
        with pytest.raises(SettingsError, match="SAGEMAKER_TFS_INSTANCE_COUNT 2 cannot be combined"):
            resolve_settings(BASE, {"SAGEMAKER_TFS_INSTANCE_COUNT": "2", "SAGEMAKER_MULTI_MODEL": "true"}, {})

    def test_unpacked_cache_bytes_are_as_set_or_a_quarter_of_the_free_disk(self, tmp_path: Path) -> None:
        assert unpacked_cache_bytes(replace(BASE, unpacked_cache_bytes=5), tmp_path) == 5
        assert 0 < unpacked_cache_bytes(BASE, tmp_path) <= shutil.disk_usage(tmp_path).total // 4

    def test_handler_threads_are_as_set_or_as_python_sizes_its_default_executor(self) -> None:
        assert handler_threads(replace(BASE, handler_threads=3)) == 3
        assert handler_threads(replace(BASE, cpu_count=2)) == 6
        assert handler_threads(replace(BASE, cpu_count=64)) == 32

    def test_zero_ports_turn_sites_off(self) -> None:
        check_settings(replace(BASE, sagemaker_port=0, metrics_port=0))


class TestResolve:
    def test_flag_beats_environment_beats_default(self) -> None:
        environ = {"SAGEMAKER_BIND_TO_PORT": "9000", "SAGEMAKER_TFS_INSTANCE_COUNT": "2"}
        settings = resolve_settings(BASE, environ, {"sagemaker_port": 9100})
        assert (settings.sagemaker_port, settings.workers, settings.http_port) == (9100, 2, 8000)

    def test_a_flag_can_settle_a_cross_check(self) -> None:
        environ = {"SAGEMAKER_TFS_INSTANCE_COUNT": "2", "SAGEMAKER_MULTI_MODEL": "true"}
        assert resolve_settings(BASE, environ, {"workers": 1}).multi_model is True


class TestSageMakerRepository:
    def test_single_and_multi_model_directories(self, tmp_path: Path) -> None:
        environ = {"SAGEMAKER_BASE_DIR": str(tmp_path)}
        assert sagemaker_repository(environ, multi_model=False) is None
        (tmp_path / "model").mkdir()
        assert sagemaker_repository(environ, multi_model=False) == str(tmp_path / "model")
        assert sagemaker_repository(environ, multi_model=True) is None
        (tmp_path / "models").mkdir()
        assert sagemaker_repository(environ, multi_model=True) == str(tmp_path / "models")

    def test_default_base_is_opt_ml(self) -> None:
        expected = "/opt/ml/model" if Path("/opt/ml/model").is_dir() else None
        assert sagemaker_repository({}, multi_model=False) == expected
