"""The SageMaker front-end, whole: its port's routes, its readiness, the user's `inference.py`, its start and stop.

app.py serves it as it serves every front-end (protocols/front_end.py); which models it runs comes from the
core: the loaded models of the repository, or on a multi-model endpoint the archives loaded on first use within
the model cache's budget (target_models.py), each with its own `inference.py`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from modelhost.access import AccessPolicy
from modelhost.core.code_policy import CodePolicy
from modelhost.core.dataplane import DataPlane
from modelhost.errors import ModelhostError
from modelhost.protocols.front_end import FrontEnd
from modelhost.protocols.http.app import HttpApp
from modelhost.protocols.sagemaker import rest
from modelhost.protocols.sagemaker.handler_api import Handler
from modelhost.protocols.sagemaker.handlers import load_handler
from modelhost.protocols.sagemaker.invoke import Invoker
from modelhost.protocols.sagemaker.runtime_errors import RuntimeErrors
from modelhost.protocols.sagemaker.target_model import TargetModel
from modelhost.protocols.sagemaker.target_models import TargetModels
from modelhost.protocols.sagemaker.user_code import REQUIREMENTS, find_program, install_requirements
from modelhost.protocols.tfserving import rest as tfserving_rest
from modelhost.store.layout import ModelLayout

log = logging.getLogger("modelhost.sagemaker")


@dataclass(frozen=True, slots=True)
class SageMakerOptions:
    """The settings the SageMaker front-end reads (modelhost/settings.py documents each)."""

    port: int
    url: str  # where this server answers itself on the SageMaker port: inference.py's context.rest_uri
    default_accept: str
    invocation_timeout_seconds: float
    program: str  # the handler module in code/
    default_model_name: str
    handler_threads: int
    max_body_bytes: int
    # Where this server answers TF Serving's gRPC API in plain text: inference.py's context.grpc_port (None: off).
    grpc_port: int | None = None


def local_url(host: str, port: int, tls: bool = False) -> str:
    """Where this server answers itself: a wildcard bind address is reached through loopback."""
    return f"{'https' if tls else 'http'}://{'127.0.0.1' if host in ('', '0.0.0.0', '::') else host}:{port}"


class SageMakerFrontEnd(FrontEnd):
    """`/ping`, `/invocations`, the multi-model API and TF Serving predict (for `context.rest_uri`) on one port.

    Without target models it serves the repository's models as one endpoint (/opt/ml/model) with the one
    inference.py beside them, loaded by `start` once the models are; with them, each archive's own.
    """

    name = "SageMaker"

    def __init__(self, options: SageMakerOptions, dataplane: DataPlane, models: Collection[str],
                 target_models: TargetModels | None, layout: ModelLayout | None, model_dir: Path | None, work_dir: Path,
                 code_policy: CodePolicy, access: AccessPolicy) -> None:
        self.port = options.port
        self._dataplane = dataplane
        self._layout = layout
        self._model_dir = model_dir  # what one endpoint's model_fn gets: the user's directory
        self._work_dir = work_dir
        # User handlers block on the served model and on their own code: a pool of their own, so that slow
        # handlers never hold up model loads and drains, which run on the loop's default executor.
        self._handler_pool = ThreadPoolExecutor(options.handler_threads, thread_name_prefix="sagemaker-handler")
        self._invoker = Invoker(dataplane, options.default_accept, options.invocation_timeout_seconds, options.url,
                                self._handler_pool, options.grpc_port)
        self._user_code = UserCode(self._invoker, options.program, options.default_model_name, code_policy)
        self._code_ready = layout is None or layout.code_dir is None
        targets: rest.Targets
        self._target_models = target_models
        if target_models is not None:
            target_models.set_hooks(self._user_code.on_target_load, self._user_code.on_target_unload)
            targets = rest.MultiModelTargets(target_models, options.default_model_name, self._user_code.handlers)
            ready = dataplane.ready
        else:
            self._single = rest.SingleModelTargets(models, options.default_model_name)
            targets, ready = self._single, self.ready
        routes = rest.routes(self._invoker, targets, ready, target_models, self._user_code.handlers)
        routes += tfserving_rest.routes(dataplane)
        self.app = RuntimeErrors(HttpApp(routes, max_body_bytes=options.max_body_bytes, access=access), routes)

    def ready(self) -> bool:
        """/ping's 200 for one endpoint: a model that failed to load can only fail requests, so, as Triton's
        SageMaker entry and the TF Serving container do, it is healthy only while every model serves."""
        return self._code_ready and self._dataplane.serving()

    async def start(self) -> None:
        """After the models loaded: one endpoint's inference.py and model_fn. A failure keeps /ping at 503."""
        layout, model_dir = self._layout, self._model_dir
        if layout is None or layout.code_dir is None or model_dir is None:
            return
        served = {name: name for name in layout.models}
        try:
            self._single.handler = await self._user_code.load(layout, model_dir, served, "single",
                                                              self._work_dir / "packages")
        except ModelhostError as exc:
            log.error("%s: %s (/ping answers 503)", layout.code_dir, exc.message)
            return
        self._code_ready = True

    async def stop(self) -> None:
        """The target models unload; handlers still running finish in their threads; none starts after this."""
        if self._target_models is not None:
            await self._target_models.stop()
        self._handler_pool.shutdown(wait=False, cancel_futures=True)
        self._invoker.close()


class UserCode:
    """Loads a model's `code/` (requirements, inference.py, model_fn) off the event loop, where `policy` allows."""

    def __init__(self, invoker: Invoker, program: str, default_name: str, policy: CodePolicy | None = None) -> None:
        self._invoker = invoker
        self._program = program
        self._default_name = default_name
        self._policy = policy or CodePolicy()
        self.handlers: dict[str, Handler] = {}  # a target model's key -> its archive's inference.py

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

    async def on_target_load(self, model: TargetModel) -> None:
        assert model.layout is not None and model.root is not None and model.work_dir is not None  # an archive's
        if model.layout.code_dir is None:  # no inference.py (the usual archive): nothing to do on the loop
            return
        handler = await self.load(model.layout, model.root, model.served, f"mme_{model.work_dir.name}",
                                  model.work_dir / "packages")
        if handler is not None:
            self.handlers[model.key] = handler

    async def on_target_unload(self, model: TargetModel) -> None:
        handler = self.handlers.pop(model.key, None)
        if handler is not None:
            handler.close()
