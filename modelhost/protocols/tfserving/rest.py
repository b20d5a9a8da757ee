"""TF Serving's REST API (tsfs §B1): model status and metadata, predict, classify and regress, by version or label.

Routes match TF Serving's, case-insensitively; answers are JSON, errors `{"error": message}` with the status
codes of http.STATUS. Also what a SageMaker TF Serving `inference.py` posts to (`context.rest_uri`).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from google.protobuf import json_format
from prometheus_client import CONTENT_TYPE_LATEST

from modelhost.access import Api
from modelhost.core.dataplane import DataPlane
from modelhost.errors import invalid
from modelhost.protocols.http.app import HttpRequest, HttpResponse, Route, json_response
from modelhost.protocols.tfserving.examples import example_count, input_from_json
from modelhost.protocols.tfserving.json_codec import parse_json
from modelhost.protocols.tfserving.serving import TfServing, signature_name_of
from modelhost.protocols.tfserving.signature_def import metadata_json
from modelhost.protocols.tfserving.tensor_proto import ModelSpecInfo

# Model names and labels are any characters but "/" and ":".
_MODEL = r"(?i)/v1/models/(?P<model>[^/:]+)(?:/versions/(?P<version>[0-9]+)|/labels/(?P<label>[^/:]+))?"
PREDICT = _MODEL + ":predict"
CLASSIFY = _MODEL + ":classify"
REGRESS = _MODEL + ":regress"
STATUS = _MODEL
METADATA = _MODEL + "/metadata"
NO_MODEL = r"(?i)/v1/models"


def routes(dataplane: DataPlane, serving: TfServing | None = None, metrics_path: str | None = None) -> list[Route]:
    """`metrics_path`: where TF Serving's Prometheus metrics are served (modelhost tfserving's monitoring config)."""
    api = serving or TfServing(dataplane)

    def where(request: HttpRequest) -> tuple[str, str, str]:
        params = request.params
        return params["model"], params.get("version") or "", params.get("label") or ""

    async def predict(request: HttpRequest) -> HttpResponse:
        model, version, label = where(request)
        with api.metrics.request(model, "predict", "REST"):
            answer = await api.predict_json(model, version, label, request.body)
        return HttpResponse(200, [answer], [(b"content-type", b"application/json")])

    async def classify(request: HttpRequest) -> HttpResponse:
        spec, source = _examples_request(request, where(request))
        with api.metrics.request(spec.name, "classify", "REST", example_count(source)):
            result, _ = await api.classify(spec, source)
        rows = [[[c.label, c.score] for c in row.classes] for row in result.classifications]
        return json_response({"results": rows})

    async def regress(request: HttpRequest) -> HttpResponse:
        spec, source = _examples_request(request, where(request))
        with api.metrics.request(spec.name, "regress", "REST", example_count(source)):
            result, _ = await api.regress(spec, source)
        return json_response({"results": [r.value for r in result.regressions]})

    async def status(request: HttpRequest) -> HttpResponse:
        message = api.status(*where(request))
        return json_response(json_format.MessageToDict(message, preserving_proto_field_name=True,
                                                       always_print_fields_with_no_presence=True))

    async def metadata(request: HttpRequest) -> HttpResponse:
        return json_response(metadata_json(api.metadata(*where(request))))

    async def no_model(request: HttpRequest) -> HttpResponse:
        raise invalid("Missing model name in request.")

    async def metrics(request: HttpRequest) -> HttpResponse:
        body = await asyncio.to_thread(api.metrics.render)  # many models' exposition: off the loop
        return HttpResponse(200, [body], [(b"content-type", CONTENT_TYPE_LATEST.encode())])

    extra = [] if metrics_path is None else [Route("GET", re.escape(metrics_path), metrics, Api.METRICS)]
    return extra + [
        Route("POST", PREDICT, predict, Api.INFERENCE),
        Route("POST", CLASSIFY, classify, Api.INFERENCE),
        Route("POST", REGRESS, regress, Api.INFERENCE),
        Route("GET", METADATA, metadata, Api.METADATA),
        Route("GET", STATUS, status, Api.HEALTH),
        Route("GET", NO_MODEL, no_model, Api.HEALTH),
    ]


def _examples_request(request: HttpRequest, where: tuple[str, str, str]) -> tuple[ModelSpecInfo, Any]:
    document = parse_json(request.body)
    if not isinstance(document, dict):
        raise invalid("request body must be a JSON object with 'examples'")
    name, version, label = where
    return ModelSpecInfo(name, version, signature_name_of(document), label), input_from_json(document)

