"""`modelhost torchserve`'s command line and config.properties (tsfs §A7): keys read as TorchServe reads them, bad
values refused naming the key, keys modelhost does not use named in the log."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from modelhost.protocols.torchserve.config_properties import (
    Address,
    TorchServeConfigError,
    read_properties,
    torchserve_config,
)
from modelhost.protocols.torchserve.model_server import parse_flags

PROPERTIES = r"""
# a migrating deployment's file
inference_address=http://0.0.0.0:9080
management_address=http://127.0.0.1:9081
metrics_address: http://127.0.0.1:9082
grpc_inference_port=9070
model_store=$$STORE$$
load_models=a.mar,b=b.mar
models={\
  "a": {"1.0": {"defaultVersion": true, "marName": "a.mar", "minWorkers": 2, "batchSize": 4}}\
}
default_workers_per_model=3
job_queue_size=50
max_request_size=1000000
default_response_timeout=30
enable_model_api=true
metrics_mode=prometheus
number_of_netty_threads=4
vmargs=-Xmx4g
not_a_torchserve_key=1
"""


def test_a_deployments_file_is_read_as_torchserve_reads_it(tmp_path: Path) -> None:
    (tmp_path / "config.properties").write_text(PROPERTIES)
    properties = read_properties(tmp_path / "config.properties")
    config = torchserve_config(properties, {"STORE": str(tmp_path)})
    assert config.inference_address == Address("0.0.0.0", 9080)
    assert config.management_address == Address("127.0.0.1", 9081)
    assert config.metrics_address == Address("127.0.0.1", 9082)
    assert (config.grpc_inference_port, config.grpc_management_port) == (9070, 7071)
    assert config.model_store == tmp_path
    assert config.load_models == ("a.mar", "b=b.mar")
    assert config.models["a"]["1.0"]["batchSize"] == 4
    assert (config.default_workers_per_model, config.job_queue_size, config.max_request_size) == (3, 50, 1000000)
    assert (config.default_response_timeout, config.enable_model_api, config.metrics_mode) == (30, True, "prometheus")
    assert not config.disable_token_authorization
    assert config.unused == ("number_of_netty_threads", "vmargs")
    assert config.unknown == ("not_a_torchserve_key",)


def test_environment_variables_win_when_enabled(tmp_path: Path) -> None:
    properties = {"job_queue_size": "10", "enable_envvars_config": "true", "allowed_urls": "file://.*"}
    environ = {"TS_JOB_QUEUE_SIZE": "20", "TS_METRICS_MODE": "legacy", "TS_ALLOWED_URLS": "https://.*"}
    config = torchserve_config(properties, environ, {"job_queue_size": "15"})
    assert (config.job_queue_size, config.metrics_mode) == (20, "legacy")
    assert config.allowed_urls == ("file://.*",)  # TS_ALLOWED_URLS counts only with use_env_allowed_urls
    assert torchserve_config({"job_queue_size": "10"}, environ).job_queue_size == 10  # not enabled


@pytest.mark.parametrize(("key", "value", "message"), [
    ("inference_address", "127.0.0.1:8080", "inference_address must be http(s)://host:port"),
    ("inference_address", "unix:/tmp/s", "inference_address: unix socket addresses are not supported"),
    ("job_queue_size", "many", "job_queue_size must be an integer, got 'many'"),
    ("job_queue_size", "0", "job_queue_size must be >= 1, got '0'"),
    ("enable_model_api", "yes", "enable_model_api must be true or false, got 'yes'"),
    ("metrics_mode", "statsd", "metrics_mode must be one of log, prometheus, legacy, got 'statsd'"),
    ("models", "{not json", "models must be JSON"),
    ("service_envelope", "xml", "service_envelope must be one of json, body, kserve, kservev2, got 'xml'"),
    ("allowed_urls", "file://(", "allowed_urls: 'file://(' is not a regular expression"),
    ("model_store", "$$UNSET_VARIABLE$$", "model_store: environment variable UNSET_VARIABLE"),
    ("management_address", "https://127.0.0.1:8443", "management_address use https: set private_key_file"),
])
def test_a_bad_value_is_an_error_naming_its_key(key: str, value: str, message: str) -> None:
    with pytest.raises(TorchServeConfigError) as caught:
        torchserve_config({key: value}, {})
    assert message in str(caught.value)


def test_flags_override_the_file_and_find_it(tmp_path: Path) -> None:
    (tmp_path / "config.properties").write_text("model_store=/nonexistent\nenable_model_api=false\n")
    flags = parse_flags(["--start", "--ts-config", str(tmp_path / "config.properties"), "--model-store",
                         str(tmp_path), "--models", "x=x.mar", "y.mar", "--enable-model-api", "--dt",
                         "--log-config", "log4j2.xml"], {})
    config = flags.setup.config
    assert config.model_store == tmp_path
    assert config.load_models == ("x=x.mar", "y.mar")
    assert config.enable_model_api and config.disable_token_authorization
    assert "--log-config is accepted and not used by modelhost" in flags.setup.notes
    env_file = tmp_path / "env.properties"
    env_file.write_text("job_queue_size=7\n")
    assert parse_flags(["--ts-config", str(tmp_path / "config.properties"), "--model-store", str(tmp_path)],
                       {"TS_CONFIG_FILE": str(env_file)}).setup.config.job_queue_size == 7


def test_the_command_refuses_a_bad_value_at_start_naming_the_key(tmp_path: Path) -> None:
    (tmp_path / "config.properties").write_text("default_response_timeout=soon\n")
    result = subprocess.run([sys.executable, "-m", "modelhost", "torchserve", "--start", "--ts-config",
                             str(tmp_path / "config.properties")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "default_response_timeout must be an integer, got 'soon'" in result.stderr
