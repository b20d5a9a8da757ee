"""The OpenAPI documents of modelhost's HTTP ports (package data), and the route serving the HTTP port's.

One document per port: `http` (--http-port: KServe V2 with Triton's extensions, TF Serving REST predict),
`sagemaker` (--sagemaker-port) and `metrics` (--metrics-port). tests/protocols/test_openapi_routes.py keeps
each equal to the routes its port serves; test_openapi_live.py runs schemathesis against a live server.
"""

from __future__ import annotations

import re
from importlib import resources

from modelhost.access import Api
from modelhost.protocols.http.app import HttpRequest, HttpResponse, Route

DOCUMENTS = ("http", "sagemaker", "metrics")
PATH = "/v2/openapi.yaml"


def document(name: str) -> bytes:
    """The YAML text of one document (a name of DOCUMENTS)."""
    if name not in DOCUMENTS:
        raise ValueError(f"no OpenAPI document '{name}'; documents: {', '.join(DOCUMENTS)}")
    return resources.files(__package__).joinpath(f"{name}.yaml").read_bytes()


def routes() -> list[Route]:
    """`GET /v2/openapi.yaml`: the HTTP port's document, read once here and served as it is."""
    body = document("http")
    headers = [(b"content-type", b"application/yaml")]

    async def openapi(request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, [body], list(headers))

    return [Route("GET", re.escape(PATH), openapi, Api.METADATA)]
