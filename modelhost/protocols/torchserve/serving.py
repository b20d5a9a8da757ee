"""TorchServe's API over the core, for its inference, management and gRPC front-ends alike (tsfs §A1, §A2): which
models and versions are registered, with what worker settings, and predictions through a model's `handler`
signature (handler_messages.py).

Each registered model is one modelhost model, served by the torchserve backend from a layout this module writes
(store/mar_repository.py); each TorchServe version (a free-form string) is one of its versions, numbered in
registration order. Worker settings are the model's, as one config.pbtxt holds them: those of its latest
registration. A model registered with no workers is known here and not loaded.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import replace
from pathlib import Path

import numpy as np

from modelhost.core.dataplane import DataPlane
from modelhost.core.manager import ModelManager
from modelhost.core.partial_answers import PartialAnswers
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.handler_messages import (
    HANDLER_INPUT,
    HANDLER_SIGNATURE,
    RESPONSE_OUTPUT,
    HandlerRequest,
    HandlerResponse,
)
from modelhost.protocols.torchserve.config_properties import TorchServeConfig
from modelhost.protocols.torchserve.errors import TorchServeError, model_not_found, no_worker, version_not_found
from modelhost.protocols.torchserve.metrics import TorchServeMetrics
from modelhost.protocols.torchserve.model_store import archive_in_store, startup_archives
from modelhost.protocols.torchserve.registrations import (
    RegisteredModel,
    RegisteredVersion,
    Registration,
    check_workers,
    worker_settings,
)
from modelhost.store.mar import read_mar_settings
from modelhost.store.mar_repository import MarEntry, MarRepository, MarVersion
from modelhost.store.paths import name_problem
from modelhost.types import InferRequest

log = logging.getLogger("modelhost.torchserve")

DEFAULT_VERSION = "1.0"  # torch-model-archiver's, for a manifest that names none


class TorchServing:
    def __init__(self, dataplane: DataPlane, manager: ModelManager, repository: MarRepository,
                 config: TorchServeConfig, cpu_count: int) -> None:
        self.dataplane = dataplane
        self.config = config
        self._manager = manager
        self._repository = repository
        self._cpu_count = cpu_count
        self._models: dict[str, RegisteredModel] = {}
        self._lock = asyncio.Lock()
        self.metrics = TorchServeMetrics(config.metrics_mode, self._queue_times)

    # registry

    def models(self) -> list[RegisteredModel]:
        return [self._models[name] for name in sorted(self._models)]

    def model(self, name: str) -> RegisteredModel:
        found = self._models.get(name)
        if found is None:
            raise model_not_found(name)
        return found

    def version(self, name: str, version: str | None = None) -> RegisteredVersion:
        """The version `version` of model `name`, its default version when None or empty."""
        model = self.model(name)
        found = model.versions.get(version or model.default)
        if found is None:
            raise version_not_found(name, version or model.default)
        return found

    async def register(self, archive: Path, url: str, request: Registration,
                       wait: bool = True) -> tuple[RegisteredVersion, asyncio.Task[None] | None]:
        """Register the archive's model and start its workers: returns once they serve, or (not `wait`) at once
        with the task that starts them. TorchServeError for what TorchServe refuses; a version whose workers fail
        to start is registered no longer."""
        try:
            manifest, yaml = await asyncio.to_thread(read_mar_settings, archive)
        except ModelhostError as exc:
            raise TorchServeError(400, "ModelException", exc.message) from None
        name = request.name or manifest.model_name
        problem = name_problem(name)
        if problem is not None:
            raise TorchServeError(400, "BadRequestException", f"Invalid model name {name!r}: it {problem}")
        async with self._lock:
            model = self._models.get(name) or RegisteredModel(name)
            version = manifest.model_version or DEFAULT_VERSION
            if version in model.versions:
                raise TorchServeError(409, "ConflictStatusException",
                                      f"Model version {version} is already registered for model {name}")
            settings = worker_settings(self.config, self._cpu_count, name, version, yaml, request)
            registered = RegisteredVersion(version, next(model.numbers), url, archive, manifest, settings,
                                           request.handler, request.at_startup)
            model.versions[version] = registered
            if not model.default or request.default_version:
                model.default = version
            self._models[name] = model
            await self._write(model, registered)
        task = asyncio.get_running_loop().create_task(self._start_workers(model, registered))
        if not wait:
            return registered, task
        await task
        return registered, None

    async def _start_workers(self, model: RegisteredModel, registered: RegisteredVersion) -> None:
        try:
            await self._load(model, new_version=True)
        except TorchServeError:
            async with self._lock:
                await self._forget(model, registered.version)
            raise

    async def scale(self, name: str, version: str | None, min_workers: int, max_workers: int,
                    wait: bool) -> asyncio.Task[None] | None:
        """Run `min_workers` workers for the model (every version of it: they share one config), replacing its
        instances beside those that serve, so that no request fails; 0 unloads it."""
        self.version(name, version)
        check_workers(min_workers)
        async with self._lock:
            model = self.model(name)
            for registered in model.versions.values():
                registered.settings = replace(registered.settings, min_workers=min_workers, max_workers=max_workers)
            await self._write(model)
        task = asyncio.get_running_loop().create_task(self._load(model, new_version=False))
        if not wait:
            return task
        await task
        return None

    async def unregister(self, name: str, version: str | None) -> None:
        """Forget one version (the default one when None), unloading it once its requests are answered."""
        registered = self.version(name, version)
        async with self._lock:
            model = self.model(name)
            if registered.version == model.default and len(model.versions) > 1:
                raise TorchServeError(403, "InvalidModelVersionException",
                                      f"Cannot remove default version for model {name}")
            await self._forget(model, registered.version)

    async def _forget(self, model: RegisteredModel, version: str) -> None:
        model.versions.pop(version, None)
        if not model.versions:
            self._models.pop(model.name, None)
            if self._manager.knows(model.name):
                await self._manager.unload(model.name)
            await self._write(model)
            return
        if model.default == version:
            model.default = next(iter(model.versions))
        await self._write(model)
        if self._manager.knows(model.name):
            await self._manager.reload_changed(model.name, set())  # retires the version whose directory went

    def set_default(self, name: str, version: str) -> None:
        model = self.model(name)
        if version not in model.versions:
            raise TorchServeError(404, "ModelVersionNotFoundException",
                                  f"Model version {version} does not exist for model {name}")
        model.default = version

    async def register_at_start(self) -> None:
        """Register the models `load_models` (or `--models`) names; one that cannot be registered is logged, and
        the others are served."""
        for name, url in startup_archives(self.config):
            try:
                archive = archive_in_store(self.config.model_store, url)
                version = self.config.models.get(name or "", {})
                default = any(settings.get("defaultVersion") is True for settings in version.values())
                registered, _ = await self.register(archive, url, Registration(name=name, at_startup=True,
                                                                               default_version=default))
            except TorchServeError as exc:
                log.error("model archive %s was not registered: %s", url, exc.message)
                continue
            log.info('model "%s" version %s registered from %s with %d worker(s)', registered.manifest.model_name
                     if name is None else name, registered.version, url, registered.settings.min_workers)

    async def _load(self, model: RegisteredModel, new_version: bool) -> None:
        """Load what the model's layout now says: its new versions, or (not `new_version`) every version again,
        beside what serves; unload it when it asks for no workers."""
        if not any(v.settings.min_workers for v in model.versions.values()):
            if self._manager.knows(model.name):
                await self._manager.unload(model.name)
            return
        try:
            await self._manager.reload_changed(model.name, set() if new_version else None)
        except ModelhostError as exc:
            raise TorchServeError(500, "InternalServerException", exc.message) from None

    async def _write(self, model: RegisteredModel, latest: RegisteredVersion | None = None) -> None:
        if not model.versions:
            await asyncio.to_thread(self._repository.remove, model.name)
            return
        source = latest or model.versions[model.default]
        entry = MarEntry(model.name, tuple(MarVersion(v.number, v.archive) for v in model.versions.values()),
                         source.settings.config_text(source.handler, self.config.decode_input_request,
                                                     self.config.service_envelope))
        await asyncio.to_thread(self._repository.put, entry)

    # inference

    async def predict(self, name: str, version: str | None, request: HandlerRequest) -> HandlerResponse:
        """The handler's answer to one request (its status may be an error of the handler's); TorchServeError for
        an unknown model or version and for one without workers, ModelhostError for what the core refuses."""
        registered = self.version(name, version)
        if registered.settings.min_workers == 0:
            raise no_worker(name)
        self.metrics.accepted(name, version)
        started = time.perf_counter()
        try:
            return await self._predict(name, registered, request)
        finally:
            self.metrics.answered(name, version, (time.perf_counter() - started) * 1e6)

    async def answers(self, name: str, version: str | None,
                      request: HandlerRequest) -> AsyncGenerator[tuple[HandlerResponse, bool], None]:
        """`predict` for a front-end that streams (tsfs §A1.6): the handler's intermediate answers to the request
        as it sends them, then its final one, each with whether it is the last. Raises as `predict` does, and
        ModelhostError (TOO_LARGE) when the unread answers exceed the response size limit."""
        partials = PartialAnswers(self.dataplane.limits.max_output_bytes)

        async def predicted() -> HandlerResponse:
            try:
                return await self.predict(name, version, replace(request, partials=partials))
            finally:
                partials.close()  # in the task's last step: the reader wakes one loop turn sooner than a callback

        final = asyncio.ensure_future(predicted())
        try:
            while (answer := await partials.next()) is not None:
                yield answer, False
            yield await final, True
        finally:
            if not final.done():
                final.cancel()  # the client is gone, or the stream failed: a queued request is withdrawn
            elif not final.cancelled():
                final.exception()  # retrieved: a failure after the stream ended is the stream's, not a loose task's

    async def _predict(self, name: str, registered: RegisteredVersion, request: HandlerRequest) -> HandlerResponse:
        requests = np.empty(1, dtype=object)
        requests[0] = request
        try:
            response = await self.dataplane.infer(InferRequest(
                name, {HANDLER_INPUT: requests}, str(registered.number), request.request_id,
                signature=HANDLER_SIGNATURE))
        except ModelhostError as exc:
            if exc.kind in (ErrorKind.NOT_FOUND, ErrorKind.UNAVAILABLE, ErrorKind.OVERLOADED):
                raise no_worker(name) from None
            raise
        answer = response.outputs[RESPONSE_OUTPUT].reshape(-1)[0]
        assert isinstance(answer, HandlerResponse)
        return answer

    def _queue_times(self) -> list[tuple[str, str, float]]:
        """(model, version, µs its requests waited in its queue) of each loaded version, for the metrics."""
        times = []
        for model in self._models.values():
            by_number = {registered.number: registered.version for registered in model.versions.values()}
            for statistics in self.dataplane.local_statistics(model.name) if self._manager.knows(model.name) else ():
                version = by_number.get(int(statistics["version"]))
                if version is not None:
                    times.append((model.name, version, statistics["inference_stats"]["queue"]["ns"] / 1000))
        return times

    def only_startup_model(self) -> str | None:
        """The model `/invocations` means without a model_name: the one model registered at start, if one."""
        names = [model.name for model in self._models.values()
                 if any(version.loaded_at_startup for version in model.versions.values())]
        return names[0] if len(names) == 1 else None

    def healthy(self) -> bool:
        """TorchServe's /ping: every model's default version has the workers it asks for (tsfs §A1.2)."""
        for model in self._models.values():
            default = model.versions.get(model.default)
            if default is not None and default.settings.min_workers and not self.dataplane.model_ready(
                    model.name, str(default.number)):
                return False
        return True


def new_request_id() -> str:
    return str(uuid.uuid4())
