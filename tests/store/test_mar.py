"""TorchServe model archives (store/mar.py, config/mar_manifest.py), built by the real `torch-model-archiver` in
its three formats, and archives that break its rules."""

from __future__ import annotations

import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from modelhost.config.mar_manifest import MarConfig, MarManifest, parse_manifest
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.store.mar import open_mar

LIMIT = 1 << 24
HANDLER = "def handle(data, context):\n    return [len(row) for row in data]\n"
CONFIG = "minWorkers: 1\nmaxWorkers: 3\nbatchSize: 8\nmaxBatchDelay: 50\nresponseTimeout: 30\nhandler:\n  top_k: 5\n"


def archiver(tmp_path: Path, archive_format: str, config: str | None = CONFIG, **files: str) -> Path:
    """torch-model-archiver's archive of a handler, a weights file, an extra file and a model-config YAML."""
    source = tmp_path / "source"
    source.mkdir(exist_ok=True)
    (source / "handler.py").write_text(HANDLER)
    (source / "weights.bin").write_bytes(bytes(range(256)) * 64)
    (source / "vocab.txt").write_text("a\nb\n")
    for name, text in files.items():
        (source / name).write_text(text)
    export = tmp_path / f"export-{archive_format}"
    export.mkdir()
    command = [shutil.which("torch-model-archiver") or "torch-model-archiver", "--model-name", "ranker",
               "--version", "2.1", "--serialized-file", str(source / "weights.bin"), "--handler",
               str(source / "handler.py"), "--extra-files", str(source / "vocab.txt"), "--archive-format",
               archive_format, "--export-path", str(export)]
    if config is not None:
        (source / "model-config.yaml").write_text(config)
        command += ["--config-file", str(source / "model-config.yaml")]
    subprocess.run(command, check=True, capture_output=True)
    return {"default": export / "ranker.mar", "tgz": export / "ranker.tar.gz", "no-archive": export / "ranker"}[
        archive_format]


@pytest.mark.parametrize("archive_format", ["default", "tgz", "no-archive"])
def test_reads_every_format_torch_model_archiver_writes(tmp_path: Path, archive_format: str) -> None:
    archive = archiver(tmp_path, archive_format)
    model = open_mar(archive, tmp_path / "unpacked", LIMIT)
    assert model.manifest == MarManifest("ranker", "handler.py", serialized_file="weights.bin", model_version="2.1",
                                         config_file="model-config.yaml")
    assert model.manifest.raw["model"]["modelName"] == "ranker"  # the whole manifest, for context.manifest
    assert model.config == MarConfig(min_workers=1, max_workers=3, batch_size=8, max_batch_delay_ms=50,
                                     response_timeout_s=30)
    assert model.config.raw["handler"] == {"top_k": 5}  # the handler's own section, for context.model_yaml_config
    assert (model.root / "handler.py").read_text() == HANDLER
    assert (model.root / "vocab.txt").read_text() == "a\nb\n"
    if archive_format == "no-archive":
        assert model.root == archive  # read in place, as TorchServe reads such a directory in its model store


def test_without_a_config_file_torchserves_defaults_apply(tmp_path: Path) -> None:
    model = open_mar(archiver(tmp_path, "default", config=None), tmp_path / "unpacked", LIMIT)
    assert model.config == MarConfig() and model.config.batch_size == 1 and model.config.max_batch_delay_ms == 100


@pytest.mark.parametrize("config, message", [
    ("batchSize: 0\n", "batchSize must be an integer >= 1, got 0"),
    ("maxBatchDelay: fast\n", "maxBatchDelay must be an integer >= 0, got 'fast'"),
    ("responseTimeout: true\n", "responseTimeout must be an integer >= 1"),
    ("useJobTicket: 1\n", "useJobTicket must be true or false"),
    ("minWorkers: 4\nmaxWorkers: 2\n", "minWorkers 4 is more than maxWorkers 2"),
    ("- a list\n", "must be a mapping"),
    ("batchSize: [\n", "is not valid YAML"),
])
def test_bad_model_config_values_name_the_key(tmp_path: Path, config: str, message: str) -> None:
    archive = archiver(tmp_path, "default", config=config)
    with pytest.raises(ModelhostError) as caught:
        open_mar(archive, tmp_path / "unpacked", LIMIT)
    assert caught.value.kind is ErrorKind.INVALID_INPUT
    assert "model archive ranker.mar: model-config.yaml" in caught.value.message and message in caught.value.message


def rewritten(tmp_path: Path, manifest: dict | None, extra: dict[str, bytes] | None = None) -> Path:
    """A zip like a .mar with the given MANIFEST.json (None: none at all) and files."""
    path = tmp_path / "crafted.mar"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("handler.py", HANDLER)
        for name, data in (extra or {}).items():
            archive.writestr(name, data)
        if manifest is not None:
            archive.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
    return path


@pytest.mark.parametrize("manifest, message", [
    (None, "it has no MAR-INF/MANIFEST.json"),
    ({"runtime": "python"}, "has no 'model' object"),
    ({"model": {"handler": "handler.py"}}, "model.modelName must be a non-empty string (it is required)"),
    ({"model": {"modelName": "m"}}, "model.handler must be a non-empty string (it is required)"),
    ({"runtime": "LSP", "model": {"modelName": "m", "handler": "h.py"}}, "runtime 'LSP' is not supported"),
    ({"model": {"modelName": "m", "handler": "handler.py", "serializedFile": "../../etc/passwd"}}, "'..'"),
    ({"model": {"modelName": "m", "handler": "handler.py", "serializedFile": "/etc/passwd"}}, "relative"),
    ({"model": {"modelName": "m", "handler": "handler.py", "modelFile": "model.py"}},
     "model.modelFile names 'model.py', which the archive does not hold"),
])
def test_manifests_torchserve_would_refuse(tmp_path: Path, manifest: dict | None, message: str) -> None:
    with pytest.raises(ModelhostError) as caught:
        open_mar(rewritten(tmp_path, manifest), tmp_path / "unpacked", LIMIT)
    assert caught.value.kind is ErrorKind.INVALID_INPUT
    assert message in caught.value.message, caught.value.message


def test_a_manifest_nested_past_any_parsers_depth_is_invalid_not_a_crash() -> None:
    for data in (b"[" * 200_000, b'{"model": ' * 100_000):
        with pytest.raises(ModelhostError) as caught:
            parse_manifest(data, "m.mar")
        assert caught.value.kind is ErrorKind.INVALID_INPUT and "is not valid JSON" in caught.value.message


def test_a_handler_by_builtin_name_or_module_function_needs_no_file(tmp_path: Path) -> None:
    for handler in ("image_classifier", "custom_module:handle"):
        target = tmp_path / handler.replace(":", "_")
        target.mkdir()
        manifest = {"runtime": "python", "model": {"modelName": "m", "handler": handler}}
        assert open_mar(rewritten(target, manifest), target / "unpacked", LIMIT).manifest.handler == handler
