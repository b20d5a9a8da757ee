"""Every variable the SageMaker Triton container's `serve` script reads (and TS_CONFIG_FILE): the setting it maps
to, or the warning at start saying why it has no effect; bad values refused naming the variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelhost.cli import serve_settings
from modelhost.settings import ServerSettings, SettingsError
from modelhost.settings_sources import settings_from_environment, unused_variables

# docker/sagemaker/serve in triton-inference-server/server, all of them.
CONTAINER_VARIABLES = (
    "DEFAULT_MODEL_NAME", "OVERRIDE_PING_MODE", "INFERENCE_TYPE", "DISABLE_MODEL_NAMESPACING", "ALLOW_GRPC",
    "GRPC_PORT", "ALLOW_METRICS", "METRICS_PORT", "BUFFER_MANAGER_THREAD_COUNT", "THREAD_COUNT", "LOG_VERBOSE",
    "LOG_INFO", "LOG_WARNING", "LOG_ERROR", "SHM_DEFAULT_BYTE_SIZE", "SHM_GROWTH_BYTE_SIZE", "TENSORFLOW_VERSION",
    "MODEL_LOAD_GPU_LIMIT", "ADDITIONAL_ARGS",
)
# A value each could have, and the settings it changes ({} where it has no effect: it must be warned about).
EFFECTS: dict[str, tuple[str, dict[str, object]]] = {
    "DEFAULT_MODEL_NAME": ("bert", {"default_model_name": "bert"}),
    "OVERRIDE_PING_MODE": ("live", {}),
    "INFERENCE_TYPE": ("generate", {}),
    "DISABLE_MODEL_NAMESPACING": ("true", {}),
    "ALLOW_GRPC": ("false", {"grpc_port": 0}),
    "GRPC_PORT": ("9001", {"grpc_port": 9001}),
    "ALLOW_METRICS": ("false", {"metrics_port": 0}),
    "METRICS_PORT": ("9002", {"metrics_port": 9002}),
    "BUFFER_MANAGER_THREAD_COUNT": ("4", {}),
    "THREAD_COUNT": ("16", {}),
    "LOG_VERBOSE": ("true", {"log_level": "debug"}),
    "LOG_INFO": ("false", {"log_level": "warning"}),
    "LOG_WARNING": ("false", {"log_level": "info"}),  # INFO lines (on by default) still mean INFO and above
    "LOG_ERROR": ("true", {"log_level": "info"}),
    "SHM_DEFAULT_BYTE_SIZE": ("33554432", {}),
    "SHM_GROWTH_BYTE_SIZE": ("2097152", {}),
    "TENSORFLOW_VERSION": ("1", {}),
    "MODEL_LOAD_GPU_LIMIT": ("0.8", {}),
    "ADDITIONAL_ARGS": ("--log-format=ISO8601", {}),
}
BASE = ServerSettings()


def test_the_table_covers_the_container_script() -> None:
    assert set(EFFECTS) == set(CONTAINER_VARIABLES)


@pytest.mark.parametrize("short", CONTAINER_VARIABLES)
def test_each_variable_is_applied_or_named_in_a_warning(short: str) -> None:
    name = f"SAGEMAKER_TRITON_{short}"
    value, changes = EFFECTS[short]
    settings = settings_from_environment(BASE, {name: value})
    fields = ("default_model_name", "grpc_port", "metrics_port", "log_level")
    changed = {field: getattr(settings, field) for field in fields if getattr(settings, field) != getattr(BASE, field)}
    notes = [line for line in unused_variables({name: value}) if line.startswith(name)]
    if changes:
        assert {k: v for k, v in changes.items() if v != getattr(BASE, k)} == changed
        assert notes == []
    else:
        assert changed == {}
        assert len(notes) == 1 and "is set but not used: " in notes[0] and len(notes[0]) > len(name) + 40


@pytest.mark.parametrize(("variables", "level"), [
    ({"LOG_VERBOSE": "1"}, "debug"), ({"LOG_VERBOSE": "0"}, "info"), ({"LOG_VERBOSE": "false"}, "info"),
    ({"LOG_INFO": "false", "LOG_WARNING": "false"}, "error"),
    ({"LOG_INFO": "false", "LOG_WARNING": "false", "LOG_ERROR": "false"}, "critical"),
    ({"LOG_VERBOSE": "2", "LOG_INFO": "false"}, "debug"),
])
def test_triton_log_switches_become_one_level(variables: dict[str, str], level: str) -> None:
    environ = {f"SAGEMAKER_TRITON_{name}": value for name, value in variables.items()}
    assert settings_from_environment(BASE, environ).log_level == level


def test_ports_allowed_and_chosen() -> None:
    environ = {"SAGEMAKER_TRITON_ALLOW_GRPC": "false", "SAGEMAKER_TRITON_GRPC_PORT": "9001",
               "SAGEMAKER_TRITON_ALLOW_METRICS": "true", "SAGEMAKER_TRITON_METRICS_PORT": "9002"}
    settings = settings_from_environment(BASE, environ)
    assert (settings.grpc_port, settings.metrics_port) == (0, 9002)
    ranged = {"SAGEMAKER_SAFE_PORT_RANGE": "20000-20999"}
    assert settings_from_environment(BASE, ranged).grpc_port == 20000
    assert settings_from_environment(BASE, {**ranged, "SAGEMAKER_TRITON_GRPC_PORT": "9001"}).grpc_port == 9001


@pytest.mark.parametrize(("name", "value"), [
    ("OVERRIDE_PING_MODE", "healthy"), ("INFERENCE_TYPE", "predict"), ("GRPC_PORT", "70000"),
    ("ALLOW_METRICS", "maybe"), ("LOG_VERBOSE", "loud"), ("LOG_INFO", "2"),
])
def test_a_bad_value_is_refused_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=f"SAGEMAKER_TRITON_{name}='{value}'"):
        settings_from_environment(BASE, {f"SAGEMAKER_TRITON_{name}": value})


def test_two_default_model_names_must_agree() -> None:
    same = {"SAGEMAKER_TFS_DEFAULT_MODEL_NAME": "a", "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "a"}
    assert settings_from_environment(BASE, same).default_model_name == "a"
    with pytest.raises(SettingsError, match="SAGEMAKER_TFS_DEFAULT_MODEL_NAME='a' and "
                                            "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME='b'"):
        settings_from_environment(BASE, {**same, "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "b"})


def test_warnings_follow_what_modelhost_does() -> None:
    def notes(**environ: str) -> list[str]:
        return unused_variables(environ)

    assert notes(SAGEMAKER_TRITON_OVERRIDE_PING_MODE="ready") == []  # a single-model endpoint's /ping is readiness
    assert notes(SAGEMAKER_TRITON_OVERRIDE_PING_MODE="live", SAGEMAKER_MULTI_MODEL="true") == []
    assert "answers 'live'" in notes(SAGEMAKER_TRITON_OVERRIDE_PING_MODE="ready", SAGEMAKER_MULTI_MODEL="true")[0]
    assert notes(SAGEMAKER_TRITON_INFERENCE_TYPE="infer") == []
    assert "/v2/models/<name>/generate_stream" in notes(SAGEMAKER_TRITON_INFERENCE_TYPE="generate_stream")[0]
    assert "modelhost torchserve" in notes(TS_CONFIG_FILE="/opt/ml/model/config.properties")[0]
    assert "Java" in notes(SAGEMAKER_MODEL_SERVER_VMARGS="-Xmx4g")[0]


def test_flags_beat_the_variables() -> None:
    environ = {"SAGEMAKER_TRITON_LOG_VERBOSE": "1", "SAGEMAKER_TRITON_GRPC_PORT": "9001"}
    settings = serve_settings(["serve", "--log-level", "warning", "--grpc-port", "7001"], environ)
    assert (settings.log_level, settings.grpc_port) == ("warning", 7001)


def test_a_default_model_the_repository_lacks_stops_the_start(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """As the container's `serve` exits: SAGEMAKER_TRITON_DEFAULT_MODEL_NAME must name a model directory."""
    for name in ("bert", "resnet"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(f'name: "{name}"')
    flags = ["serve", "--model-repository", str(tmp_path)]
    assert serve_settings(flags, {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "bert"}).default_model_name == "bert"
    for missing in ("gpt", "..", "bert/config.pbtxt"):
        with pytest.raises(SystemExit) as exited:
            serve_settings(flags, {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": missing})
        assert exited.value.code == 2
        assert f"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME is '{missing}', but the model repository has no model " \
               "directory of that name" in capsys.readouterr().err
    multi = ["serve", "--multi-model", "--model-repository", str(tmp_path)]  # its models come with each request
    assert serve_settings(multi, {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "gpt"}).default_model_name == "gpt"


def test_a_default_model_name_still_names_a_single_model_of_another_layout(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()  # TF Serving's layout: versions of one model, served under the name given
    (tmp_path / "1" / "saved_model.pb").write_bytes(b"")
    environ = {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "m"}
    settings = serve_settings(["serve", "--model-repository", str(tmp_path)], environ)
    assert settings.default_model_name == "m"
