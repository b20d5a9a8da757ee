"""Unpacked archives kept on disk after their models unload: reused while the archive is unchanged, deleted
when it changed or when the copies kept pass their disk budget, oldest first."""

from __future__ import annotations

from pathlib import Path

from modelhost.store.archive_models import ArchiveModels, FetchedModels
from modelhost.store.archive_store import LocalArchiveStore
from modelhost.store.s3 import S3ArchiveStore
from modelhost.store.unpacked_copies import UnpackedCopies
from tests.archives import WIDTH, write_archives
from tests.s3_server import MotoS3Server


def fetcher(tmp_path: Path, budget: int, count: int = 3) -> tuple[ArchiveModels, UnpackedCopies]:
    write_archives(tmp_path / "archives", count)
    copies = UnpackedCopies(budget)
    return ArchiveModels(LocalArchiveStore(tmp_path / "archives"), tmp_path / "downloads", 1 << 30, 100, "model",
                         copies), copies


def on_disk(directory: Path) -> int:
    """A directory's files and links, each its own size (links not followed)."""
    return sum(path.lstat().st_size for path in directory.rglob("*") if not path.is_dir() or path.is_symlink())


def test_an_unchanged_archive_reuses_its_kept_copy_without_unpacking(tmp_path: Path) -> None:
    models, copies = fetcher(tmp_path, 1 << 30)
    first = models.fetch("model-0.tar.gz", tmp_path / "w" / "1")
    assert first.fetch_seconds is not None and first.stamp is not None
    models.release("model-0.tar.gz", first)
    assert first.directory.is_dir() and copies.kept_bytes == on_disk(first.directory) >= WIDTH * 4
    again = models.fetch("model-0.tar.gz", tmp_path / "w" / "2")
    assert again.directory == first.directory and again.fetch_seconds is None  # no download, no unpacking
    assert not (tmp_path / "w" / "2").exists() and copies.kept_bytes == 0  # in use: the loader's again
    models.release("model-0.tar.gz", again)
    assert copies.kept_bytes == on_disk(first.directory)


def test_files_written_into_a_copy_after_its_fetch_count_against_the_budget(tmp_path: Path) -> None:
    models, copies = fetcher(tmp_path, 1 << 30)
    copy = models.fetch("model-0.tar.gz", tmp_path / "w" / "1")
    packages = copy.directory / "packages"  # where inference.py's requirements go
    packages.mkdir()
    (packages / "wheel.bin").write_bytes(b"x" * (2 << 20))
    models.release("model-0.tar.gz", copy)
    assert copies.kept_bytes >= copy.disk_bytes + (2 << 20)
    copies.budget_bytes = copy.disk_bytes + (1 << 20)  # the model files fit, the packages do not
    models.release("model-1.tar.gz", models.fetch("model-1.tar.gz", tmp_path / "w" / "2"))
    assert not copy.directory.exists()


def test_a_changed_archive_is_fetched_again_and_its_old_copy_deleted(tmp_path: Path) -> None:
    models, copies = fetcher(tmp_path, 1 << 30)
    first = models.fetch("model-1.tar.gz", tmp_path / "w" / "1")
    models.release("model-1.tar.gz", first)
    archive = tmp_path / "archives" / "model-1.tar.gz"
    (tmp_path / "archives" / "model-2.tar.gz").replace(archive)  # replaced: another size or modification time
    again = models.fetch("model-1.tar.gz", tmp_path / "w" / "2")
    assert again.directory == tmp_path / "w" / "2" and again.fetch_seconds is not None
    assert not first.directory.exists() and copies.kept_bytes == 0


def test_copies_over_the_budget_are_deleted_oldest_first(tmp_path: Path) -> None:
    models, copies = fetcher(tmp_path, 0)
    sizes = on_disk(models.fetch("model-0.tar.gz", tmp_path / "probe").directory)
    copies.budget_bytes = 2 * sizes + 100  # two copies fit (their links' sizes differ by a few bytes), not three
    fetched = [models.fetch(f"model-{i}.tar.gz", tmp_path / "w" / str(i)) for i in range(3)]
    for i, copy in enumerate(fetched):
        models.release(f"model-{i}.tar.gz", copy)
    assert [copy.directory.is_dir() for copy in fetched] == [False, True, True]
    assert copies.kept_bytes == on_disk(fetched[1].directory) + on_disk(fetched[2].directory)


def test_a_directory_used_in_place_is_never_kept_and_its_layout_is_removed(tmp_path: Path) -> None:
    models, copies = fetcher(tmp_path, 1 << 30)
    unpacked: FetchedModels = models.fetch("model-0.tar.gz", tmp_path / "user-dir")
    in_place = models.in_place(unpacked.root, tmp_path / "w" / "layout")
    assert in_place.stamp is None and in_place.directory == tmp_path / "w" / "layout"
    models.release("user-dir", in_place)
    assert not in_place.directory.exists() and unpacked.root.is_dir() and copies.kept_bytes == 0


def test_an_unchanged_s3_archive_is_not_downloaded_again(s3: MotoS3Server, tmp_path: Path) -> None:
    write_archives(tmp_path / "local", 2)
    client = s3.client()
    client.create_bucket(Bucket="kept-copies")
    for name in ("model-0.tar.gz", "model-1.tar.gz"):
        client.put_object(Bucket="kept-copies", Key=f"models/{name}", Body=(tmp_path / "local" / name).read_bytes())
    store = S3ArchiveStore("kept-copies", "models", s3.endpoint_url)
    downloads: list[str] = []
    download = store.download

    def counted(target: str, into: Path) -> Path:
        downloads.append(target)
        return download(target, into)

    store.download = counted  # type: ignore[method-assign]
    models = ArchiveModels(store, tmp_path / "downloads", 1 << 30, 100, "model", UnpackedCopies(1 << 30))
    first = models.fetch("model-0.tar.gz", tmp_path / "w" / "1")
    models.release("model-0.tar.gz", first)
    again = models.fetch("model-0.tar.gz", tmp_path / "w" / "2")
    assert again.directory == first.directory and downloads == ["model-0.tar.gz"]
    models.release("model-0.tar.gz", again)
    # A new object under the key (another ETag): downloaded again.
    client.put_object(Bucket="kept-copies", Key="models/model-0.tar.gz",
                      Body=(tmp_path / "local" / "model-1.tar.gz").read_bytes())
    replaced = models.fetch("model-0.tar.gz", tmp_path / "w" / "3")
    assert replaced.directory == tmp_path / "w" / "3" and downloads == ["model-0.tar.gz"] * 2
    assert not first.directory.exists()
