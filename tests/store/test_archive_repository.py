"""ArchiveRepository: the manager's store over a directory or S3 prefix of model archives."""

from __future__ import annotations

import asyncio
import os
import tarfile
from pathlib import Path

import onnx
import pytest

from modelhost.core.manager import ModelManager
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.store.archive_repository import ArchiveRepository
from modelhost.store.archive_store import LocalArchiveStore, holds_only_archives, open_archive_store
from tests.archives import weighted_model, write_archive
from tests.onnx_models import scale_model, write_model
from tests.s3_server import MotoS3Server

LIMIT = 1 << 30
CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def model_archive(path: Path, factor: float, name: str | None = None) -> Path:
    """path (<name>.tar.gz) holding a Triton model directory <name>/config.pbtxt, <name>/1/model.onnx."""
    name = name or path.name.removesuffix(".tar.gz")
    staging = path.parent / f".staging-{name}"
    model_dir = write_model(staging, name, scale_model(factor), CONFIG.replace("platform", f'name: "{name}"\nplatform'))
    with tarfile.open(path, "w:gz") as archive:
        archive.add(model_dir, arcname=name)
    return path


def replace(path: Path, factor: float) -> None:
    """Rewrite an archive with other content, and a modification time no file system rounds away."""
    model_archive(path, factor)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))


def repository(root: Path, work: Path) -> ArchiveRepository:
    return ArchiveRepository(LocalArchiveStore(root), work, LIMIT, 10_000)


def factor_of(source_path: Path) -> float:
    model = onnx.load(str(source_path / "1" / "model.onnx"))
    return float(onnx.numpy_helper.to_array(model.graph.initializer[0]))


def test_top_level_archives_are_the_models(tmp_path: Path) -> None:
    root = tmp_path / "archives"
    root.mkdir()
    for name in ("b", "a"):
        model_archive(root / f"{name}.tar.gz", 1.0)
    (root / "nested").mkdir()
    model_archive(root / "nested" / "c.tar.gz", 1.0)  # a TargetModel path of a multi-model endpoint, not a name
    (root / "notes.txt").write_text("not an archive")
    assert repository(root, tmp_path / "work").list() == ["a", "b"]


def test_a_fetched_model_is_a_triton_model_directory_named_after_its_archive(tmp_path: Path) -> None:
    root = tmp_path / "archives"
    root.mkdir()
    model_archive(root / "scale.tar.gz", 3.0)
    store = repository(root, tmp_path / "work")
    source = store.fetch("scale")
    assert source.name == "scale" and source.versions == (1,)
    assert (source.path / "config.pbtxt").is_file() and factor_of(source.path) == 3.0
    assert source.path.resolve().is_relative_to((tmp_path / "work").resolve())


def test_a_single_model_file_archive_is_named_after_the_archive(tmp_path: Path) -> None:
    root = tmp_path / "archives"
    root.mkdir()
    onnx.save_model(weighted_model(2.0), str(tmp_path / "model.onnx"))  # 256 KiB of weights
    write_archive(root / "weighted.tar.gz", {"model.onnx": (tmp_path / "model.onnx").read_bytes()})
    source = repository(root, tmp_path / "work").fetch("weighted")
    assert source.name == "weighted" and source.versions == (1,)
    assert (source.path / "1" / "model.onnx").stat().st_size > 256 * 1024


def test_an_unchanged_archive_is_not_fetched_again_and_a_replaced_one_is(tmp_path: Path) -> None:
    root = tmp_path / "archives"
    root.mkdir()
    archive = model_archive(root / "m.tar.gz", 1.0)
    store = repository(root, tmp_path / "work")
    first = store.fetch("m")
    fingerprint = store.fingerprint("m")
    assert store.fetch("m") == first and store.fingerprint("m") == fingerprint

    replace(archive, 2.0)
    changed = store.fingerprint("m")
    assert changed is not None and fingerprint is not None and fingerprint.changed_versions(changed) is None
    second = store.fetch("m")
    assert second.path != first.path and factor_of(second.path) == 2.0
    assert factor_of(first.path) == 1.0  # a reload's old version may still be serving from it

    replace(archive, 3.0)
    third = store.fetch("m")
    assert factor_of(third.path) == 3.0 and factor_of(second.path) == 2.0
    assert not first.path.resolve().exists()  # the copy before the previous one is removed


def test_fingerprints_of_several_models_read_together_are_each_ones(tmp_path: Path) -> None:
    root = tmp_path / "archives"
    root.mkdir()
    for name, factor in (("a", 1.0), ("b", 2.0)):
        model_archive(root / f"{name}.tar.gz", factor)
    store = repository(root, tmp_path / "work")
    together = store.fingerprints(["a", "b", "absent"])
    assert together == {"a": store.fingerprint("a"), "b": store.fingerprint("b"), "absent": None}
    replace(root / "b.tar.gz", 3.0)
    now = store.fingerprints(["a", "b"])
    assert now == {"a": together["a"], "b": store.fingerprint("b")} and now["b"] != together["b"]


def test_a_missing_archive_is_not_found_without_the_servers_paths(tmp_path: Path) -> None:
    root = tmp_path / "archives"
    root.mkdir()
    store = repository(root, tmp_path / "work")
    with pytest.raises(FileNotFoundError) as caught:
        store.fetch("absent")
    assert "absent.tar.gz" in str(caught.value) and str(tmp_path) not in str(caught.value)
    assert store.fingerprint("absent") is None


def test_a_model_named_like_the_stores_own_directories_is_just_a_model(tmp_path: Path) -> None:
    root = tmp_path / "archives"
    root.mkdir()
    for name, factor in (("downloads", 2.0), ("models", 4.0)):
        model_archive(root / f"{name}.tar.gz", factor)
    store = repository(root, tmp_path / "work")
    assert [factor_of(store.fetch(name).path) for name in ("downloads", "models")] == [2.0, 4.0]
    assert factor_of(store.fetch("downloads").path) == 2.0  # after another's fetch used the downloads directory


@pytest.mark.parametrize("name", ["../x", "a/b", "", "..", "x\x00"])
def test_a_name_that_is_not_a_model_name_is_refused_before_any_path(tmp_path: Path, name: str) -> None:
    store = repository(tmp_path, tmp_path / "work")
    for call in (store.fetch, store.fingerprint):
        with pytest.raises(ModelhostError) as caught:
            call(name)
        assert caught.value.kind is ErrorKind.INVALID_INPUT and "model name" in caught.value.message
    assert not (tmp_path / "work").exists()


def test_an_archive_of_several_models_is_refused_naming_them(tmp_path: Path) -> None:
    root = tmp_path / "archives"
    root.mkdir()
    staging = tmp_path / "staging"
    for name in ("one", "two"):
        write_model(staging, name, scale_model(1.0), CONFIG)
    with tarfile.open(root / "pair.tar.gz", "w:gz") as archive:
        for name in ("one", "two"):
            archive.add(staging / name, arcname=name)
    store = repository(root, tmp_path / "work")
    with pytest.raises(ModelhostError) as caught:
        store.fetch("pair")
    assert caught.value.kind is ErrorKind.INVALID_INPUT
    assert "holds 2 models (one, two)" in caught.value.message and "--multi-model" in caught.value.message
    assert not any((tmp_path / "work" / "models" / "pair").iterdir())  # the unpacked files are gone


def test_an_archive_over_the_unpacking_limit_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "archives"
    root.mkdir()
    model_archive(root / "m.tar.gz", 1.0)
    store = ArchiveRepository(LocalArchiveStore(root), tmp_path / "work", 100, 10_000)
    with pytest.raises(ModelhostError) as caught:
        store.fetch("m")
    assert "100" in caught.value.message


def test_a_directory_of_archives_only_is_told_from_a_model_repository(tmp_path: Path) -> None:
    archives, models, empty = tmp_path / "archives", tmp_path / "models", tmp_path / "empty"
    for directory in (archives, models, empty):
        directory.mkdir()
    model_archive(archives / "a.tar.gz", 1.0)
    (archives / ".hidden").write_text("ignored")
    write_model(models, "a", scale_model(1.0), CONFIG)
    model_archive(models / "b.tar.gz", 1.0)
    assert holds_only_archives(archives)
    assert not holds_only_archives(models) and not holds_only_archives(empty)
    assert not holds_only_archives(tmp_path / "missing")


def test_archives_on_s3(tmp_path: Path, s3: MotoS3Server) -> None:
    client = s3.client()
    client.create_bucket(Bucket="repository-unit")
    model_archive(tmp_path / "m.tar.gz", 4.0)
    client.upload_file(str(tmp_path / "m.tar.gz"), "repository-unit", "prod/m.tar.gz")
    client.upload_file(str(tmp_path / "m.tar.gz"), "repository-unit", "prod/deeper/n.tar.gz")
    archives = open_archive_store("s3://repository-unit/prod", s3.endpoint_url)
    store = ArchiveRepository(archives, tmp_path / "work", LIMIT, 10_000)
    assert store.list() == ["m"]
    fingerprint = store.fingerprint("m")
    assert factor_of(store.fetch("m").path) == 4.0
    model_archive(tmp_path / "m.tar.gz", 5.0)
    client.upload_file(str(tmp_path / "m.tar.gz"), "repository-unit", "prod/m.tar.gz")
    assert store.fingerprint("m") != fingerprint  # a new ETag
    assert factor_of(store.fetch("m").path) == 5.0
    assert store.fingerprint("gone") is None
    with pytest.raises(FileNotFoundError):
        store.fetch("gone")


def test_an_unloaded_models_copies_go_and_a_later_load_fetches_it_again(tmp_path: Path) -> None:
    import asyncio

    from modelhost.core.manager import ModelManager

    root = tmp_path / "archives"
    root.mkdir()
    model_archive(root / "m.tar.gz", 5.0)
    store = repository(root, tmp_path / "work")
    unpacked = tmp_path / "work" / "models" / "m"

    async def main() -> None:
        manager = ModelManager(store, 2, 4)
        try:
            await manager.load("m")
            assert len(list(unpacked.iterdir())) == 1
            await manager.unload("m")  # drained, then the store releases its copy
            assert not any(unpacked.iterdir())
            await manager.load("m")
            assert manager.get("m").version == 1 and len(list(unpacked.iterdir())) == 1
            await manager.evict("m")
            assert not any(unpacked.iterdir())
        finally:
            await manager.stop()

    asyncio.run(main())


def test_a_model_loaded_again_while_its_eviction_drains_keeps_its_files(tmp_path: Path) -> None:
    """An evicted model's next request loads it again while the eviction still waits for a request holding the
    old copy: the new load fetches the same unpacked files, and the eviction's end must not remove them (a
    multi-model cache under churn: 'model file ... does not exist' on the next load)."""
    root = tmp_path / "archives"
    root.mkdir()
    model_archive(root / "a.tar.gz", 2.0)
    work = tmp_path / "work"

    async def scenario() -> list[Path]:
        manager = ModelManager(repository(root, work), cpu_count=1, default_max_batch_size=4)
        await manager.load("a")
        held = manager.hold("a")
        eviction = asyncio.create_task(manager.evict("a"))
        await asyncio.sleep(0.05)  # the eviction waits for the held request
        await manager.load("a")  # the next request's load, under a new record
        held.pins.release()
        await eviction
        files = [path for path in (work / "models" / "a").rglob("*.onnx")]
        await manager.stop()
        return files

    assert asyncio.run(scenario()), "the reloaded model's unpacked files were removed by the old copy's eviction"
