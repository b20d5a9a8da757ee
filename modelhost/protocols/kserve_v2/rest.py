"""KServe V2 (and Triton extension) routes over HTTP: parse, call the core once, encode."""

from __future__ import annotations

from functools import partial
from typing import Any

from modelhost.access import Api
from modelhost.core.control import Control
from modelhost.core.dataplane import DataPlane
from modelhost.core.trace import HTTP_SEND_END, HTTP_SEND_START
from modelhost.errors import invalid
from modelhost.protocols.header_forwarding import HeaderForwarding
from modelhost.protocols.http.app import HttpRequest, HttpResponse, Route, error_response, json_response
from modelhost.protocols.http.response_encoding import ACCEPT_ENCODING, encode_response
from modelhost.protocols.json_body import json_object
from modelhost.protocols.kserve_v2 import generate
from modelhost.protocols.kserve_v2.codec import decode_infer_request, encode_infer_response
from modelhost.protocols.kserve_v2.raw_codec import decode_raw_request
from modelhost.protocols.kserve_v2.repository_codec import (
    decode_load_request,
    decode_unload_dependents,
    no_repository,
)
from modelhost.protocols.kserve_v2.shm_tensors import write_outputs
from modelhost.protocols.kserve_v2.trace_setting import trace_routes
from modelhost.types import InferRequest, ModelMetadata, TensorSpec

_MODEL = r"/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[0-9]+))?"
_HEADER_LENGTH = b"inference-header-content-length"
_REPOSITORY = r"/v2/repository(?:/(?P<repository>[^/]+))?"


def routes(dataplane: DataPlane, control: Control, forwarding: HeaderForwarding | None = None) -> list[Route]:
    """`forwarding`: the headers to hand the model as request parameters (--http-header-forward-pattern)."""
    tracer = dataplane.tracer
    forwarded = forwarding if forwarding is not None and forwarding.active else None

    async def infer(request: HttpRequest) -> HttpResponse:
        header_length = _header_length(request.headers.get(_HEADER_LENGTH))
        model, version = request.params["model"], request.params.get("version", "")
        trace = tracer.begin_http(model, request.received, request.headers) if tracer.active else None
        forward = forwarded.parameters(_text_headers(request.headers)) if forwarded is not None else None
        if header_length == 0:
            def raw(metadata: ModelMetadata) -> tuple[InferRequest, InferRequest]:
                decoded = decode_raw_request(request.body, metadata)
                decoded.received, decoded.trace = request.received, trace
                if forward:
                    decoded.parameters.update(forward)
                return decoded, decoded  # the request again, for its binary_data_output when encoding

            response, infer_request = await dataplane.decode_and_infer(model, version, raw)
        else:
            infer_request = decode_infer_request(request.body, header_length, model, version, dataplane.limits,
                                                 dataplane.shared_memory)
            infer_request.received, infer_request.trace = request.received, trace
            if forward:
                infer_request.parameters.update(forward)
            response = await dataplane.infer(infer_request)
        placed = write_outputs(dataplane.shared_memory, response, infer_request) if infer_request.outputs else ()
        parts, json_length = encode_infer_response(response, infer_request, placed)
        if json_length is None:
            answer = HttpResponse(200, parts, [(b"content-type", b"application/json")])
        else:
            headers = [(b"content-type", b"application/octet-stream"), (_HEADER_LENGTH, str(json_length).encode())]
            answer = HttpResponse(200, parts, headers)
        if ACCEPT_ENCODING in request.headers:
            answer = await encode_response(answer, request.headers[ACCEPT_ENCODING])
        if trace is not None:
            trace.stamp(HTTP_SEND_START)
            answer.sent = partial(tracer.finish, trace, HTTP_SEND_END)
        return answer

    async def update_rows(request: HttpRequest) -> HttpResponse:
        # The body is a V2 inference request (JSON, or with the binary extension): inputs ids and vectors.
        header_length = _header_length(request.headers.get(_HEADER_LENGTH))
        model, version = request.params["model"], request.params.get("version", "")
        update = decode_infer_request(request.body, header_length or None, model, version, dataplane.limits)
        served_version, rows, added = await dataplane.update_rows(update)
        return json_response({"model_name": model, "model_version": served_version, "rows": rows,
                              "new_rows": added})

    def admit(params: dict[str, str]) -> None:
        dataplane.admit(params["model"], params.get("version", ""))

    async def live(request: HttpRequest) -> HttpResponse:
        return _health(dataplane.live())

    async def ready(request: HttpRequest) -> HttpResponse:
        return _health(dataplane.ready())

    async def server_metadata(request: HttpRequest) -> HttpResponse:
        return json_response(dataplane.server_metadata())

    async def model_metadata(request: HttpRequest) -> HttpResponse:
        return json_response(_metadata_json(dataplane.metadata(request.params["model"], _version(request))))

    async def model_ready(request: HttpRequest) -> HttpResponse:
        if dataplane.model_ready(request.params["model"], _version(request)):
            return HttpResponse(200, (), [])
        return error_response(400, "Model version not ready")

    async def model_config(request: HttpRequest) -> HttpResponse:
        return json_response(dataplane.model_config(request.params["model"], _version(request)))

    async def statistics(request: HttpRequest) -> HttpResponse:
        stats = await dataplane.statistics(request.params.get("model", ""), _version(request))
        return json_response({"model_stats": stats})

    async def index(request: HttpRequest) -> HttpResponse:
        no_repository(request.params.get("repository", ""), "index")
        body = json_object(request.body)
        ready_only = body.get("ready", False) is True
        entries = [
            {k: v for k, v in (("name", e.name), ("version", e.version), ("state", e.state), ("reason", e.reason)) if v}
            for e in await control.index(ready_only)
        ]
        return json_response(entries)

    async def load(request: HttpRequest) -> HttpResponse:
        no_repository(request.params.get("repository", ""), f"load model '{request.params['model']}'")
        await control.load(request.params["model"], decode_load_request(json_object(request.body)))
        return HttpResponse(200, (), [])

    async def unload(request: HttpRequest) -> HttpResponse:
        no_repository(request.params.get("repository", ""), f"unload model '{request.params['model']}'")
        await control.unload(request.params["model"], decode_unload_dependents(json_object(request.body)))
        return HttpResponse(200, (), [])

    return [
        Route("POST", _MODEL + "/infer", infer, Api.INFERENCE, admit),
        *generate.routes(dataplane),
        Route("POST", _MODEL + "/embeddings/update", update_rows, Api.MODEL_REPOSITORY),
        Route("GET", "/v2/health/live", live, Api.HEALTH),
        Route("GET", "/v2/health/ready", ready, Api.HEALTH),
        Route("GET", "/v2", server_metadata, Api.METADATA),
        Route("GET", "/v2/models/stats", statistics, Api.STATISTICS),
        Route("GET", _MODEL + "/stats", statistics, Api.STATISTICS),
        Route("GET", _MODEL, model_metadata, Api.METADATA),
        Route("GET", _MODEL + "/ready", model_ready, Api.HEALTH),  # Triton counts model readiness as health
        Route("GET", _MODEL + "/config", model_config, Api.MODEL_CONFIG),
        # Triton's routes name a repository optionally (/v2/repository/{repository}/...), which it then refuses.
        Route("POST", _REPOSITORY + "/index", index, Api.MODEL_REPOSITORY),
        # Any name reaches the core (the path is unquoted: %2F is "/"), whose name rule answers 400.
        Route("POST", _REPOSITORY + r"/models/(?P<model>.+)/load", load, Api.MODEL_REPOSITORY),
        Route("POST", _REPOSITORY + r"/models/(?P<model>.+)/unload", unload, Api.MODEL_REPOSITORY),
        *trace_routes(dataplane),
    ]


def _text_headers(headers: dict[bytes, bytes]) -> list[tuple[str, str]]:
    return [(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers.items()]


def _health(ok: bool) -> HttpResponse:
    # Triton answers health checks with an empty body: 200 when true, 400 when false.
    return HttpResponse(200 if ok else 400, (), [])


def _version(request: HttpRequest) -> str:
    return request.params.get("version", "")


def _header_length(value: bytes | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        text = value.decode(errors="replace")
        raise invalid(f"Inference-Header-Content-Length must be an integer, got {text!r}") from None


def _metadata_json(metadata: ModelMetadata) -> dict[str, Any]:
    def tensor(spec: TensorSpec) -> dict[str, Any]:
        return {"name": spec.name, "datatype": spec.datatype, "shape": list(spec.shape)}

    return {
        "name": metadata.name,
        "versions": list(metadata.versions),
        "platform": metadata.platform,
        "inputs": [tensor(s) for s in metadata.inputs],
        "outputs": [tensor(s) for s in metadata.outputs],
    }
