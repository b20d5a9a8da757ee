"""`modelhost tfserving`'s command line and configuration files, read as tensorflow_model_server reads them
(TF Serving's own documented examples), and the model list's Triton layout (store/model_list.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from modelhost.cli import tfserving_settings
from modelhost.config.overrides import ModelOverrides
from modelhost.config.pbtxt import parse_config
from modelhost.core.policy import SchedulingPolicy
from modelhost.protocols.tfserving.config_files import (
    ConfigFileError,
    ServedModelEntry,
    read_batching_parameters,
    read_model_config,
    read_monitoring_path,
)
from modelhost.protocols.tfserving.model_server import TfServingFlagError, parse_flags
from modelhost.store.model_list import ListedModel, ModelListStore

# tsfs §B3.2, TF Serving's serving_config.md example.
MODEL_CONFIG = """
model_config_list {
  config {
    name: "resnet"
    base_path: "/models/resnet"
    model_platform: "tensorflow"
    model_version_policy { specific { versions: 1 versions: 2 } }
    version_labels { key: "stable" value: 1 }
    version_labels { key: "canary" value: 2 }
  }
  config { name: "other" base_path: "other" model_platform: "tensorflow" }
}
"""
# tsfs §B3.3, TF Serving's batching guide example.
BATCHING = """
max_batch_size { value: 128 }
batch_timeout_micros { value: 0 }
max_enqueued_batches { value: 1000000 }
num_batch_threads { value: 8 }
allowed_batch_sizes: 32
allowed_batch_sizes: 128
pad_variable_length_inputs: true
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_model_config_file_lists_models_with_policies_and_labels(tmp_path: Path) -> None:
    entries = read_model_config(write(tmp_path / "models.config", MODEL_CONFIG))
    assert entries == [
        ServedModelEntry("resnet", Path("/models/resnet"), "specific", specific=(1, 2),
                         labels={"stable": 1, "canary": 2}),
        ServedModelEntry("other", tmp_path / "other"),  # relative to the file; latest 1 by default
    ]


@pytest.mark.parametrize("text, message", [
    ("model_config_list { config { name: 'a' } }", "config 1 ('a') has no base_path"),
    ("model_config_list { config { base_path: '/x' } }", "config 1 has no name"),
    ("model_config_list { config { name: 'a' base_path: '/x' } config { name: 'a' base_path: '/y' } }",
     "model 'a' is listed twice"),
    ("model_config_list { config { name: 'a' base_path: '/x' model_platform: 'onnx' } }",
     "model_platform 'onnx' is not supported"),
    ("model_config_list { config { name: 'a' base_path: '/x' nope: 1 } }", "nope"),
    ("model_config_list { config { name: '../up' base_path: '/x' } }", "model name '../up'"),
    ("model_config_list { config { name: 'a' base_path: '/x' version_labels { key: 'l' value: 0 } } }",
     "version label 'l' names version 0"),
])
def test_bad_model_config_files_are_errors_naming_the_file(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path / "models.config", text)
    with pytest.raises(ConfigFileError, match="--model_config_file .*models.config") as info:
        read_model_config(path)
    assert message in str(info.value)


def test_batching_parameters_map_onto_the_scheduler(tmp_path: Path) -> None:
    batching = read_batching_parameters(write(tmp_path / "batching.config", BATCHING))
    assert batching.overrides == ModelOverrides(dynamic_batching=True, max_batch_size=128,
                                                max_queue_delay_microseconds=0, max_queue_size=128_000_000,
                                                instance_count=8)
    assert batching.allowed_batch_sizes == (32, 128)
    small = read_batching_parameters(write(tmp_path / "small.config", "max_enqueued_batches { value: 4 }"))
    # TF's defaults for the rest: max_batch_size 1000, 4 batches of 1000 queued at most
    assert (small.overrides.max_batch_size, small.overrides.max_queue_size) == (1000, 4000)


@pytest.mark.parametrize("text, message", [
    ("max_batch_size { value: 64 } allowed_batch_sizes: 8 allowed_batch_sizes: 32", "must equal max_batch_size"),
    ("max_batch_size { value: 64 } allowed_batch_sizes: 64 allowed_batch_sizes: 8", "must increase"),
    ("max_batch_size { value: 0 }", "max_batch_size must be positive"),
    ("max_batch_size { value: 8 } enable_large_batch_splitting { value: true } max_execution_batch_size { value: 9 }",
     "max_execution_batch_size must be between 1 and max_batch_size"),
    ("max_batch_size: 8", "max_batch_size"),
])
def test_bad_batching_parameters_are_errors(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigFileError, match="--batching_parameters_file") as info:
        read_batching_parameters(write(tmp_path / "batching.config", text))
    assert message in str(info.value)


def test_monitoring_config(tmp_path: Path) -> None:
    path = write(tmp_path / "monitoring.config",
                 'prometheus_config { enable: true, path: "/monitoring/prometheus/metrics" }')
    assert read_monitoring_path(path) == "/monitoring/prometheus/metrics"
    assert read_monitoring_path(write(tmp_path / "off.config", "prometheus_config { enable: false }")) is None
    assert read_monitoring_path(write(tmp_path / "default.config", "prometheus_config { enable: true }")) == (
        "/monitoring/prometheus/metrics")
    with pytest.raises(ConfigFileError, match="must be an absolute URL path"):
        read_monitoring_path(write(tmp_path / "bad.config", 'prometheus_config { enable: true path: "../x" }'))


# the command line


def test_flags_in_tf_servings_forms(tmp_path: Path) -> None:
    flags = parse_flags(["--port=9000", "--rest_api_port", "9001", "--model_name=rec", f"--model_base_path={tmp_path}",
                         "--enable_batching", "--tensorflow_session_parallelism=3",
                         "--tensorflow_intra_op_parallelism=2", "--file_system_poll_wait_seconds=0"])
    assert (flags.grpc_port, flags.rest_api_port, flags.file_system_poll_seconds) == (9000, 9001, 0.0)
    assert flags.setup.models == (ServedModelEntry("rec", tmp_path.resolve()),)
    assert flags.overrides.dynamic_batching and flags.overrides.max_batch_size == 1000
    assert (flags.overrides.intra_op_threads, flags.overrides.inter_op_threads) == (2, 3)
    settings = tfserving_settings(flags)
    assert (settings.host, settings.grpc_port, settings.http_port) == ("0.0.0.0", 9000, 9001)
    assert (settings.sagemaker_port, settings.metrics_port, settings.model_control_mode) == (0, 0, "none")
    assert tfserving_settings(parse_flags([f"--model_base_path={tmp_path}"])).model_control_mode == "poll"
    assert flags.setup.model_warmup and flags.setup.typed_outputs
    off = parse_flags([f"--model_base_path={tmp_path}", "--enable_model_warmup=false",
                       "--enable_serialization_as_tensor_content"]).setup
    assert not off.model_warmup and not off.typed_outputs


def test_batching_file_gives_each_model_padding_and_splitting(tmp_path: Path) -> None:
    path = write(tmp_path / "batching.config", BATCHING + "enable_large_batch_splitting { value: true }\n"
                 "max_execution_batch_size { value: 64 }\n")
    flags = parse_flags([f"--model_base_path={tmp_path}", "--enable_batching=true",
                         f"--batching_parameters_file={path}"])
    config = parse_config(flags.setup.listed()[0].config_text())
    config.max_batch_size = 128  # what the override gives a model that can batch
    policy = SchedulingPolicy.from_config(config)
    assert (policy.pad_sizes, policy.split_size, policy.batching) == ((32, 128), 64, True)


@pytest.mark.parametrize("argv, message", [
    (["--bogus=1"], "unknown flag --bogus=1"),
    (["--port=x"], None),
    (["--grpc_socket_path=/tmp/s"], "--grpc_socket_path: modelhost does not serve a Unix socket"),
    (["--rest_api_enable_cors_support"], "CORS"),
    ([], "--model_base_path is required"),
    (["--model_base_path=/no/such/dir"], "is not a directory"),
    (["--port=9000", "--rest_api_port=9000"], "must differ from --port"),
    (["--saved_model_tags=serve,gpu"], "one tag"),
    (["--model_name=a/b"], "--model_name 'a/b'"),
])
def test_bad_command_lines_name_the_flag(tmp_path: Path, argv: list[str], message: str | None,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    if "--model_base_path" not in " ".join(argv) and message != "--model_base_path is required":
        argv = [*argv, f"--model_base_path={tmp_path}"]
    if message is None:  # argparse's own error for a bad value, naming the flag
        with pytest.raises(SystemExit):
            parse_flags(argv)
        assert "--port: '" in capsys.readouterr().err
        return
    with pytest.raises(TfServingFlagError) as info:
        parse_flags(argv)
    assert message in str(info.value)


def test_flags_modelhost_has_no_use_for_are_noted(tmp_path: Path) -> None:
    flags = parse_flags([f"--model_base_path={tmp_path}", "--rest_api_num_threads=8", "--max_num_load_retries=0"])
    assert [note.split(" ")[0] for note in flags.setup.notes] == ["--rest_api_num_threads", "--max_num_load_retries"]


# the model list's layout


def saved_model_version(base: Path, version: str) -> Path:
    directory = base / version
    (directory / "variables").mkdir(parents=True)
    (directory / "saved_model.pb").write_bytes(b"")
    return directory


def test_model_list_layout_links_versions_and_writes_the_policy(tmp_path: Path) -> None:
    base = tmp_path / "base"
    saved_model_version(base, "1")
    saved_model_version(base, "0002")  # TF Serving reads leading zeros
    (base / "3").mkdir()  # no SavedModel (yet): not a version
    (base / "notes").mkdir()
    root = tmp_path / "layout"
    root.mkdir()
    store = ModelListStore(root, [ListedModel("m", base, "specific", specific=(1, 2))])
    assert store.list() == ["m"]
    assert sorted(p.name for p in (root / "m").iterdir()) == ["1", "2", "config.pbtxt"]
    assert os.readlink(root / "m" / "2") == str(base / "0002")
    config = parse_config((root / "m" / "config.pbtxt").read_text())
    assert list(config.version_policy.specific.versions) == [1, 2]
    source = store.fetch("m")
    assert source.versions == (1, 2)
    before = store.fingerprint("m")
    (base / "3" / "saved_model.pb").write_bytes(b"")  # the copy of version 3 is complete
    store.list()
    assert store.fetch("m").versions == (1, 2, 3)
    after = store.fingerprint("m")
    assert before is not None and after is not None and before.changed_versions(after) == {3}
    store.set_models([ListedModel("n", base)])
    assert store.list() == ["n"] and not (root / "m").exists() and base.exists()


def test_model_list_links_resolved_versions_of_ascii_numbers(tmp_path: Path) -> None:
    base = tmp_path / "base"
    saved_model_version(base, "1")
    saved_model_version(base, "²")  # a digit to str.isdigit, not a version
    elsewhere = saved_model_version(tmp_path / "elsewhere", "7")
    os.symlink(elsewhere, base / "7")
    os.symlink(base, tmp_path / "current")  # a deployment that swaps a link to the base path
    root = tmp_path / "layout"
    root.mkdir()
    store = ModelListStore(root, [ListedModel("m", tmp_path / "current", "all")])
    assert store.list() == ["m"]
    assert sorted(p.name for p in (root / "m").iterdir()) == ["1", "7", "config.pbtxt"]
    assert os.readlink(root / "m" / "1") == str(base / "1") and os.readlink(root / "m" / "7") == str(elsewhere)
    assert store.fetch("m").versions == (1, 7)


def test_model_list_refuses_names_that_are_not_model_names(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="model name"):
        ModelListStore(tmp_path, [ListedModel("../x", tmp_path)])


def test_per_model_batching_reads_each_models_newest_version_and_batches_only_those_that_have_one(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    common = write(tmp_path / "batching.config", "max_batch_size { value: 16 }")
    batched, plain = tmp_path / "batched", tmp_path / "plain"
    saved_model_version(batched, "1")
    write(saved_model_version(batched, "2") / "batching_params.pbtxt",
          BATCHING + "enable_large_batch_splitting { value: true }\nmax_execution_batch_size { value: 64 }\n")
    saved_model_version(plain, "1")
    models = write(tmp_path / "models.config", "model_config_list { config { name: 'batched' base_path: 'batched' } "
                                               "config { name: 'plain' base_path: 'plain' } }")
    flags = parse_flags([f"--model_config_file={models}", "--enable_batching",
                         "--enable_per_model_batching_parameters", f"--batching_parameters_file={common}"])
    assert flags.overrides.dynamic_batching is None and flags.overrides.max_batch_size is None, "not every model's"
    assert "--batching_parameters_file is checked but not applied" in " ".join(flags.setup.notes)
    root = tmp_path / "layout"
    root.mkdir()
    store = ModelListStore(root, flags.setup.listed())
    assert store.list() == ["batched", "plain"]
    config = parse_config((root / "batched" / "config.pbtxt").read_text())
    assert config.max_batch_size == 128 and config.instance_group[0].count == 8
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 128_000_000
    policy = SchedulingPolicy.from_config(config)
    assert (policy.pad_sizes, policy.split_size, policy.batching) == ((32, 128), 64, True)
    plain_config = parse_config((root / "plain" / "config.pbtxt").read_text())
    assert plain_config.max_batch_size == 0 and not plain_config.HasField("dynamic_batching")

    saved_model_version(batched, "3")  # a newer version without a file: the model is no longer batched
    store.list()
    assert not parse_config((root / "batched" / "config.pbtxt").read_text()).HasField("dynamic_batching")
    write(batched / "3" / "batching_params.pbtxt", "max_batch_size { value: 0 }")
    with caplog.at_level("ERROR", logger="modelhost.store"):
        store.list()
        store.list()
    assert [record.getMessage() for record in caplog.records] == [
        "model batched is not served: batching_params.pbtxt of version 3: max_batch_size must be positive, got 0"]
    assert store.fetch("batched").versions == (), "TF Serving would refuse to load the version: none served"
    write(batched / "3" / "batching_params.pbtxt", "max_batch_size { value: 4 }")
    store.list()
    assert store.fetch("batched").versions == (1, 2, 3)
    assert parse_config((root / "batched" / "config.pbtxt").read_text()).max_batch_size == 4


def test_per_model_batching_needs_batching_on(tmp_path: Path) -> None:
    flags = parse_flags([f"--model_base_path={tmp_path}", "--enable_per_model_batching_parameters"])
    assert not flags.setup.per_model_batching and flags.setup.listed()[0].version_config is None
    assert "read only with --enable_batching" in flags.setup.notes[0]
