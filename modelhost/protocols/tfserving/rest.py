"""TF Serving REST predict (`POST /v1/models/{m}[/versions/{v}]:predict`): parse, call the core once, encode.

Also what a SageMaker TF Serving `inference.py` posts to (`context.rest_uri`).
"""

from __future__ import annotations

from modelhost.access import Api
from modelhost.core.dataplane import DataPlane
from modelhost.errors import invalid
from modelhost.protocols.http.app import HttpRequest, HttpResponse, Route
from modelhost.protocols.tfserving.json_codec import decode_predict, encode_predict
from modelhost.types import InferRequest, ModelMetadata

# Model names are any characters but "/" and ":"; TF Serving matches paths case-insensitively.
PREDICT = r"(?i)/v1/models/(?P<model>[^/:]+)(?:/versions/(?P<version>[0-9]+)|/labels/(?P<label>[^/:]+))?:predict"


def routes(dataplane: DataPlane) -> list[Route]:
    async def predict(request: HttpRequest) -> HttpResponse:
        if "label" in request.params:
            raise invalid(f"version label '{request.params['label']}': modelhost serves versions by number only")
        return await predict_response(dataplane, request.params["model"], request.params.get("version", ""),
                                      request.body)

    return [Route("POST", PREDICT, predict, Api.INFERENCE)]


async def predict_response(dataplane: DataPlane, model: str, version: str, body: bytes) -> HttpResponse:
    """One TF Serving predict call, answered in the format (row or columnar) the body used."""

    def decode(metadata: ModelMetadata) -> tuple[InferRequest, str]:  # the form: ROW or COLUMNAR
        inputs, form = decode_predict(body, metadata.inputs, dataplane.limits)
        return InferRequest(model, inputs, version), form

    response, form = await dataplane.decode_and_infer(model, version, decode)
    return HttpResponse(200, [encode_predict(response.outputs, form)], [(b"content-type", b"application/json")])
