"""Assembles the SageMaker front-end from the core: targets (single model or multi-model cache), the
user's inference.py, the invoker, and the routes of `rest` plus TF Serving predict for `context.rest_uri`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from modelhost.core.code_policy import CodePolicy
from modelhost.core.dataplane import DataPlane
from modelhost.core.model_cache import CachedModel, ModelCache
from modelhost.errors import ModelhostError
from modelhost.protocols.http import Route
from modelhost.protocols.sagemaker import rest
from modelhost.protocols.sagemaker.handlers import Handler, load_handler
from modelhost.protocols.sagemaker.invoke import Invoker
from modelhost.protocols.sagemaker.user_code import REQUIREMENTS, find_program, install_requirements
from modelhost.protocols.tfserving import rest as tfserving_rest
from modelhost.store.layout import ModelLayout

log = logging.getLogger("modelhost.sagemaker")


def local_url(host: str, port: int, tls: bool = False) -> str:
    """Where this server answers itself: a wildcard bind address is reached through loopback."""
    return f"{'https' if tls else 'http'}://{'127.0.0.1' if host in ('', '0.0.0.0', '::') else host}:{port}"


class UserCode:
    """Loads a model's `code/` (requirements, inference.py, model_fn) off the event loop, where `policy` allows."""

    def __init__(self, invoker: Invoker, program: str, default_name: str, policy: CodePolicy | None = None) -> None:
        self._invoker = invoker
        self._program = program
        self._default_name = default_name
        self._policy = policy or CodePolicy()

    async def load(self, layout: ModelLayout, model_dir: Path, served: dict[str, str], tag: str,
                   packages: Path) -> Handler | None:
        code_dir = layout.code_dir
        if code_dir is None:
            return None
        runs = await asyncio.to_thread(self._code_files, code_dir)
        if runs:
            self._policy.check(", ".join(sorted(served.values())), " and ".join(runs))
        await asyncio.to_thread(install_requirements, code_dir, packages)
        handler = await asyncio.to_thread(load_handler, code_dir, self._program, tag)
        if handler is None:
            return None
        target = rest.select_model(served, "", self._default_name, handler)
        handle = self._invoker.handle(target.model, target.version)
        await asyncio.to_thread(handler.load_model, model_dir, handle, target.model, target.version)
        log.info("loaded %s (%s convention) for %s", code_dir / self._program, handler.convention, target.model)
        return handler

    def _code_files(self, code_dir: Path) -> list[str]:
        """What of code/ would run: the handler module, and requirements.txt (pip runs packages' setup code)."""
        found = [f"code/{REQUIREMENTS}"] if (code_dir / REQUIREMENTS).is_file() else []
        program = find_program(code_dir, self._program)
        return ([f"code/{program.name}"] if program is not None else []) + found

    async def on_cache_load(self, model: CachedModel) -> Handler | None:
        return await self.load(model.layout, model.root, model.served, f"mme_{model.work_dir.name}",
                               model.work_dir / "packages")

    async def on_cache_unload(self, model: CachedModel) -> None:
        if isinstance(model.attachment, Handler):
            model.attachment.close()


class SingleModelSite:
    """/opt/ml/model served as one endpoint: ready once every model loaded and inference.py is set up."""

    def __init__(self, dataplane: DataPlane, invoker: Invoker, user_code: UserCode, layout: ModelLayout,
                 root: Path, packages: Path, models: Callable[[], list[str]], default_name: str) -> None:
        self._dataplane = dataplane
        self._user_code = user_code
        self._layout = layout
        self._root = root
        self._packages = packages
        self._code_ready = layout.code_dir is None
        self.targets = rest.SingleModelTargets(models, default_name)
        self.routes = _routes(invoker, self.targets, self.ready, None, dataplane)

    def ready(self) -> bool:
        """/ping's 200: a model that failed to load can only fail requests, so, as Triton's SageMaker entry
        and the TF Serving container do, the endpoint is healthy only while every model serves."""
        return self._code_ready and self._dataplane.serving()

    async def start(self) -> None:
        """After the models loaded: the user's inference.py and model_fn. A failure keeps /ping at 503."""
        if self._layout.code_dir is None:
            return
        served = {name: name for name in self._layout.models}
        try:
            self.targets.handler = await self._user_code.load(self._layout, self._root, served, "single",
                                                               self._packages)
        except ModelhostError as exc:
            log.error("%s: %s (/ping answers 503)", self._layout.code_dir, exc.message)
            return
        self._code_ready = True


def multi_model_routes(dataplane: DataPlane, invoker: Invoker, cache: ModelCache, default_name: str) -> list[Route]:
    return _routes(invoker, rest.MultiModelTargets(cache, default_name), dataplane.ready, cache, dataplane)


def _routes(invoker: Invoker, targets: rest.Targets, ready: Callable[[], bool], cache: ModelCache | None,
            dataplane: DataPlane) -> list[Route]:
    return rest.routes(invoker, targets, ready, cache) + tfserving_rest.routes(dataplane)
