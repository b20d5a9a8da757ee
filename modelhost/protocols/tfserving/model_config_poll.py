"""A `--model_config_file` applied while serving (tsfs §B3.2): re-read every
--model_config_file_poll_wait_seconds, or pushed with ModelService.HandleReloadConfigRequest.

A new model list goes to the ModelListStore, whose layout the repository poller then applies as it applies any
repository change: new models load, removed ones unload, a changed version policy reloads, each without
dropping a request (core/repository_poll.py). Version labels change once the versions they name are loaded.
A file that cannot be read or is invalid is logged and the list in use stays.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from modelhost.errors import invalid
from modelhost.protocols.tfserving import apis_pb2 as pb
from modelhost.protocols.tfserving.config_files import (
    ConfigFileError,
    ServedModelEntry,
    model_entries,
    read_model_config,
)
from modelhost.protocols.tfserving.model_server import TfServingSetup
from modelhost.protocols.tfserving.serving import VersionLabels
from modelhost.store.model_list import ModelListStore

log = logging.getLogger("modelhost.tfserving")


class ModelConfigPoller:
    def __init__(self, setup: TfServingSetup, labels: VersionLabels) -> None:
        self._setup = setup
        self._labels = labels
        self._entries: list[ServedModelEntry] = list(setup.models)
        self._set_labels(self._entries)
        self._store: ModelListStore | None = None
        self._apply: Callable[[], Awaitable[None]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        # A reload request may name base paths only under the directories the server was started with.
        self._roots = {entry.base_path.parent.resolve() for entry in setup.models}
        if setup.model_config_file is not None:
            self._roots.add(setup.model_config_file.parent)

    def start(self, store: ModelListStore, apply: Callable[[], Awaitable[None]]) -> None:
        """Re-read the file from now on (when polling is set); `apply` makes the store's changes take effect."""
        self._store, self._apply = store, apply
        if self._setup.model_config_file is not None and self._setup.model_config_poll_seconds > 0:
            self._task = asyncio.get_running_loop().create_task(self._run(self._setup.model_config_file))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self, path: Path) -> None:
        # Applied when the file changes, so that a list a HandleReloadConfigRequest set stays until it does.
        last = list(self._setup.models)
        while True:
            await asyncio.sleep(self._setup.model_config_poll_seconds)
            try:
                entries = await asyncio.to_thread(read_model_config, path)
            except ConfigFileError as exc:
                log.error("%s; still serving the models it listed before", exc)
                continue
            if entries == last:
                continue
            last = entries
            try:
                await self.serve(entries)
            except Exception:
                log.exception("applying --model_config_file %s failed", path)

    async def reload(self, config: pb.ModelServerConfig) -> None:
        """HandleReloadConfigRequest: serve this list instead (INVALID_INPUT for one TF Serving would refuse, or
        a base path outside the directories the server's models came from)."""
        try:
            entries = model_entries(config, Path.cwd(), "ReloadConfigRequest")
        except ConfigFileError as exc:
            raise invalid(str(exc)) from None
        for entry in entries:
            resolved = entry.base_path.resolve()
            if not any(resolved.is_relative_to(root) for root in self._roots):
                raise invalid(f"ReloadConfigRequest: model '{entry.name}' base_path is outside the directories "
                              "this server was started with; a reload may only rearrange models under them")
        await self.serve(entries)

    async def serve(self, entries: Sequence[ServedModelEntry]) -> None:
        """Make `entries` the model list, if it changed, and wait until the change is applied."""
        assert self._store is not None and self._apply is not None, "start() first"
        async with self._lock:
            if list(entries) == self._entries:
                return
            log.info("model config: now %d model(s): %s", len(entries), ", ".join(e.name for e in entries))
            self._store.set_models(self._setup.listed(entries))
            await self._apply()
            self._entries = list(entries)
            self._set_labels(entries)

    def _set_labels(self, entries: Sequence[ServedModelEntry]) -> None:
        self._labels.replace({entry.name: entry.labels for entry in entries})
