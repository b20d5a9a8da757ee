"""The model an HTTP request names, read from where each protocol puts it, so that Ray Serve can route the
request to a replica that holds that model (model affinity).

Only the route and headers are read: the body stays unparsed until a replica's protocol front-end takes it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from modelhost.protocols.sagemaker.rest import TARGET_MODEL
from modelhost.store.archive_store import ARCHIVE_SUFFIX

# KServe V2 / Triton: /v2/models/{name}[/versions/{v}][/...]; the repository extension's load and unload.
_V2 = re.compile(r"/v2/models/(?P<name>[^/]+)(?P<rest>/.*)?")
_V2_REPOSITORY = re.compile(r"/v2/repository/models/(?P<name>[^/]+)/(load|unload)")
# TF Serving REST: /v1/models/{name}[/versions/{v}|/labels/{l}][:method|/metadata]
_TF_SERVING = re.compile(r"/v1/models/(?P<name>[^/:]+)(?P<rest>[/:].*)?")
# SageMaker's Runtime API, InvokeEndpoint.
_SAGEMAKER_RUNTIME = re.compile(r"/endpoints/[^/]+/invocations")
# SageMaker's multi-model invoke of a model registered with POST /models.
_SAGEMAKER_INVOKE = re.compile(r"/models/(?P<name>[^/]+)/invoke")
# V2 routes under a model that do not need it in memory: its statistics and trace settings answer for what ran.
_V2_WITHOUT_LOAD = ("/stats", "/trace/setting")


@dataclass(frozen=True, slots=True)
class NamedModel:
    """`key`: what Ray Serve routes the request by. `load`: the model the replica must have loaded before the
    request runs (None: the request needs none, or its protocol loads it, as SageMaker's TargetModel does)."""

    key: str
    load: str | None


def named_model(method: str, path: str, headers: Mapping[bytes, bytes]) -> NamedModel | None:
    """The model the request is for, None for a request about the server (health, metadata, index, metrics)."""
    match = _V2.fullmatch(path)
    if match and not (match["name"] == "stats" and not match["rest"]):  # /v2/models/stats: every model's
        rest = match["rest"] or ""
        needs = not any(rest.endswith(suffix) for suffix in _V2_WITHOUT_LOAD)
        return NamedModel(match["name"], match["name"] if needs else None)
    match = _V2_REPOSITORY.fullmatch(path) or _SAGEMAKER_INVOKE.fullmatch(path)
    if match:
        return NamedModel(match["name"], None)
    match = _TF_SERVING.fullmatch(path)
    if match:
        return NamedModel(match["name"], match["name"])
    target = headers.get(TARGET_MODEL)
    if target and (path == "/invocations" or _SAGEMAKER_RUNTIME.fullmatch(path)):
        # SageMaker's multi-model endpoint: the archive's key; its front-end loads it. Routed by the model's
        # name, so that V2 requests for the same model find the same replicas.
        key = target.decode("latin-1")
        return NamedModel(key[:-len(ARCHIVE_SUFFIX)] if key.endswith(ARCHIVE_SUFFIX) else key, None)
    return None
