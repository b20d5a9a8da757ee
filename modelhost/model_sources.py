"""Where a server's models come from, chosen once from its settings as it starts: a directory in any layout
`find_layout` knows (the built-in example repository without one), a repository of archives (an S3 prefix, or a
directory holding only `*.tar.gz` files), a multi-model endpoint's archives, `modelhost tfserving`'s model list,
or the archives `modelhost torchserve`'s management API registers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from modelhost.errors import ModelhostError
from modelhost.settings import ServerSettings
from modelhost.store.archive_repository import ArchiveRepository
from modelhost.store.archive_store import ArchiveStore, holds_only_archives, open_archive_store
from modelhost.store.layout import ModelLayout, find_layout
from modelhost.store.local import LocalStore
from modelhost.store.mar_repository import MarRepository
from modelhost.store.model_list import ModelListStore
from modelhost.store.model_store import ModelStore

if TYPE_CHECKING:
    from modelhost.protocols.tfserving.model_server import TfServingSetup
    from modelhost.protocols.torchserve.model_server import TorchServeSetup


@dataclass
class ModelSources:
    store: ModelStore | None  # what the manager loads models from by name; None: nothing but archives on demand
    description: str = ""  # where the models come from, for the log
    archives: ArchiveStore | None = None  # a multi-model endpoint's TargetModel archives
    root: Path | None = None  # the directory served (one endpoint)
    layout: ModelLayout | None = None  # how that directory was laid out as a repository
    model_list: ModelListStore | None = None  # `modelhost tfserving`'s
    mar_repository: MarRepository | None = None  # `modelhost torchserve`'s


def open_model_sources(settings: ServerSettings, work_dir: Path, tfserving: TfServingSetup | None,
                       torchserve: TorchServeSetup | None) -> ModelSources:
    """The models `settings` (or a `tfserving` / `torchserve` command's setup) serve; files this process makes for
    them go under `work_dir`. SystemExit for a repository that is not there or cannot be read."""
    if settings.multi_model:  # the archives, if any, are the manager's store as well as the cache's
        archives = _archive_store(settings)
        store = None if archives is None else _archive_repository(settings, archives, work_dir)
        return ModelSources(store, archives=archives)
    if tfserving is not None:
        (work_dir / "models").mkdir()
        model_list = ModelListStore(work_dir / "models", tfserving.listed())
        return ModelSources(model_list, f"{len(tfserving.models)} model base path(s)", model_list=model_list)
    if torchserve is not None:
        (work_dir / "models").mkdir()
        mar_repository = MarRepository(work_dir / "models")
        return ModelSources(mar_repository, f"TorchServe model store {torchserve.config.model_store or '(none)'}",
                            mar_repository=mar_repository)
    return _repository(settings, work_dir)


def _repository(settings: ServerSettings, work_dir: Path) -> ModelSources:
    location = settings.model_repository
    if location is not None and (location.startswith("s3://") or holds_only_archives(Path(location))):
        archives = _archive_store(settings)
        assert archives is not None
        return ModelSources(_archive_repository(settings, archives, work_dir), archives.description)
    if location is None:
        from modelhost.example_repository import ensure_example_repository

        root = ensure_example_repository(settings.cache_dir)
    else:
        root = Path(location)
        if not root.is_dir():
            raise SystemExit(f"--model-repository {root} is not a directory")
    try:
        # An empty repository serves nothing, as Triton's does.
        layout = find_layout(root, settings.default_model_name, work_dir / "layout", program=settings.sagemaker_program,
                             allow_empty=True)
    except ModelhostError as exc:
        raise SystemExit(f"--model-repository {root}: {exc.message}") from None
    return ModelSources(LocalStore(layout.repository), str(root), root=root, layout=layout)


def _archive_repository(settings: ServerSettings, archives: ArchiveStore, work_dir: Path) -> ArchiveRepository:
    return ArchiveRepository(archives, work_dir / "archives", settings.max_unpacked_bytes,
                             settings.max_archive_members)


def _archive_store(settings: ServerSettings) -> ArchiveStore | None:
    """The archives at --model-repository (a directory or an S3 prefix), if it is given."""
    if settings.model_repository is None:
        return None
    try:
        return open_archive_store(settings.model_repository, settings.s3_endpoint_url)
    except ModelhostError as exc:
        raise SystemExit(f"--model-repository {settings.model_repository}: {exc.message}") from None
