"""The Serve config modelhost ships and prints: valid for Ray Serve, and its flags build the application."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from modelhost.ray_serve import application
from modelhost.ray_serve.application import REPLICA_DEPLOYMENT, RayOptions, replica_settings
from modelhost.ray_serve.command import IMPORT_PATH, _app_flags, main, parse_flags, serve_config

SHIPPED = Path(__file__).resolve().parents[2] / "deploy" / "ray" / "serve_config.yaml"


def test_the_shipped_config_is_a_serve_config_whose_flags_parse() -> None:
    config = yaml.safe_load(SHIPPED.read_text())
    schema = ServeDeploySchema.model_validate(config)
    app = schema.applications[0]
    module, _, attribute = app.import_path.partition(":")
    assert module == application.__name__ and callable(getattr(application, attribute))
    settings, options = parse_flags(app.args["flags"], environ={})
    assert settings.model_repository == "s3://my-bucket/models" and settings.model_cache_bytes == 8 << 30
    assert options.scaling()["autoscaling_config"]["max_replicas"] == 8


def test_printed_config_carries_the_flags_and_resizes_through_deployments() -> None:
    flags = ["--model-repository", "/models", "--replicas", "3", "--grpc-port", "0"]
    settings, options = parse_flags(flags, environ={})
    config = serve_config(flags, settings, replicas={"num_replicas": 5}, environ={"MODELHOST_CACHE_DIR": "/c",
                                                                                  "HOME": "/root"})
    schema = ServeDeploySchema.model_validate(config)
    app = schema.applications[0]
    assert app.import_path == IMPORT_PATH and app.args == {"flags": flags}
    assert app.runtime_env == {"env_vars": {"MODELHOST_CACHE_DIR": "/c"}}
    assert [(d.name, d.num_replicas) for d in app.deployments] == [(REPLICA_DEPLOYMENT, 5)]
    assert "grpc_options" not in config and options == RayOptions(replicas=3)


def test_replicas_serve_without_ports_and_load_on_demand() -> None:
    settings, _ = parse_flags(["--model-repository", "/models", "--workers", "4"], environ={})
    replica = replica_settings(settings)
    assert (replica.models_on_demand, replica.multi_model, replica.model_control_mode) == (True, False, "explicit")
    assert (replica.grpc_port, replica.metrics_port, replica.workers) == (0, 0, 1)
    assert replica_settings(parse_flags(["--model-repository", "s3://b/p"], environ={})[0]).multi_model
    settings, _ = parse_flags(["--model-control-mode", "explicit", "--load-model", "m"], environ={})
    assert replica_settings(settings).load_models == ("m",), "loaded by every replica at its start"


def test_driver_flags_stay_out_of_the_applications_flags() -> None:
    argv = ["--address", "auto", "--app-name=x", "--print-config", "--replicas", "2"]
    assert _app_flags(argv) == ["--replicas", "2"]


def test_bad_flags_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_flags(["--replicas", "0"], environ={})
    assert exited.value.code == 2 and "--replicas" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_flags(["--max-replicas", "2", "--min-replicas", "3"], environ={})
    with pytest.raises(SystemExit):
        parse_flags(["--min-replicas", "2"], environ={})
    with pytest.raises(SystemExit):
        parse_flags(["--model-control-mode", "poll"], environ={})
    assert "do not poll the repository" in capsys.readouterr().err


def test_variables_without_effect_are_named_at_start_as_serve_names_them(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("SAGEMAKER_TFS_NGINX_LOGLEVEL", "info")
    assert main(["--print-config", "--model-repository", "/models"]) == 0
    assert ServeDeploySchema.model_validate(json.loads(capsys.readouterr().out))
    assert any(r.levelname == "WARNING" and "SAGEMAKER_TFS_NGINX_LOGLEVEL is set but not used" in r.getMessage()
               for r in caplog.records)
