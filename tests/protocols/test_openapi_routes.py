"""The OpenAPI documents (modelhost/protocols/openapi) name exactly the routes each port serves, both ways."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from openapi_spec_validator import validate

from modelhost.app import Server
from modelhost.protocols import openapi
from modelhost.protocols.http.app import HttpApp
from modelhost.protocols.sagemaker.runtime_errors import RuntimeErrors
from modelhost.settings import ServerSettings

METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load(openapi.document(name))


def templates(pattern: str) -> list[str]:
    """The OpenAPI path templates a route pattern matches: `(?P<x>...)` -> `{x}`, `(?:a|b)?` -> a, b, "".

    Only the regex syntax routes use is understood; anything else fails, so a new kind of pattern is noticed.
    """
    return _expand(pattern.removeprefix("(?i)"))


def _expand(pattern: str) -> list[str]:
    results, i = [""], 0
    while i < len(pattern):
        char = pattern[i]
        if char == "(":
            end = _closing(pattern, i)
            inner = pattern[i + 1:end]
            if inner.startswith("?P<"):
                choices = ["{" + inner[3:inner.index(">")] + "}"]
            elif inner.startswith("?:"):
                choices = [t for branch in _branches(inner[2:]) for t in _expand(branch)]
            else:
                raise ValueError(f"unsupported group in route pattern {pattern!r}")
            i = end + 1
            if pattern[i:i + 1] == "?":
                choices, i = [*choices, ""], i + 1
        elif char == "\\":
            choices, i = [pattern[i + 1]], i + 2
        elif char in "[]{}*+?|.^$":
            raise ValueError(f"unsupported regex syntax {char!r} in route pattern {pattern!r}")
        else:
            choices, i = [char], i + 1
        results = [r + c for r in results for c in choices]
    return results


def _closing(pattern: str, start: int) -> int:
    depth = 0
    for i in range(start, len(pattern)):
        if pattern[i] == "\\":
            continue
        depth += {"(": 1, ")": -1}.get(pattern[i], 0)
        if depth == 0:
            return i
    raise ValueError(f"unbalanced route pattern {pattern!r}")


def _branches(pattern: str) -> list[str]:
    branches, depth, start = [], 0, 0
    for i, char in enumerate(pattern):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "|" and depth == 0:
            branches.append(pattern[start:i])
            start = i + 1
    return [*branches, pattern[start:]]


def served(app: HttpApp | RuntimeErrors) -> set[tuple[str, str]]:
    """(method, path template) of every route of `app`; each template, filled in, matches its route."""
    found = set()
    for route in app.routes:
        for template in templates(route.pattern):
            sample = re.sub(r"\{(\w+)\}", lambda m: "7" if m.group(1) == "version" else "m1", template)
            assert re.fullmatch(route.pattern, sample), f"{template} (as {sample}) does not match {route.pattern}"
            found.add((route.method, template))
    return found


def documented(document: dict[str, Any], multi_model: bool = True) -> set[tuple[str, str]]:
    return {
        (method.upper(), path)
        for path, item in document["paths"].items()
        if multi_model or not item.get("x-modelhost-multi-model", False)
        for method in METHODS if method in item
    }


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Server]:
    """Servers built (not started) as `modelhost serve` builds them, one per SageMaker mode."""
    cache = tmp_path_factory.mktemp("cache")
    base = ServerSettings(cache_dir=cache, grpc_port=0)
    return {"single": Server(base), "multi": Server(ServerSettings(cache_dir=cache, grpc_port=0, multi_model=True))}


@pytest.mark.parametrize("name", openapi.DOCUMENTS)
def test_each_document_is_valid_openapi(name: str) -> None:
    validate(load(name))


def test_http_document_names_every_route_of_the_http_port(servers: dict[str, Server]) -> None:
    document = documented(load("http"))
    for server in servers.values():
        assert served(server.build_asgi()) == document


def test_sagemaker_document_names_every_route_of_the_sagemaker_port(servers: dict[str, Server]) -> None:
    document = load("sagemaker")
    assert served(servers["multi"].front_end("SageMaker").app) == documented(document)
    # Routes marked x-modelhost-multi-model are exactly those a single-model endpoint lacks.
    assert served(servers["single"].front_end("SageMaker").app) == documented(document, multi_model=False)


def test_metrics_document_names_every_route_of_the_metrics_port(servers: dict[str, Server]) -> None:
    assert served(servers["single"].front_end("metrics").app) == documented(load("metrics"))


def test_tfserving_api_is_documented_alike_on_both_ports() -> None:
    http, sagemaker = load("http"), load("sagemaker")
    paths = [p for p in http["paths"] if p.startswith("/v1/")]
    assert paths and paths == [p for p in sagemaker["paths"] if p.startswith("/v1/")]
    for path in paths:
        # The one difference: on the SageMaker port a path no route matches is answered in the Runtime API's shape.
        answers = [_inline(document, document["paths"][path]) for document in (http, sagemaker)]
        for answer in answers:
            for method in METHODS:
                if method in answer:
                    answer[method]["responses"].pop("404", None)
        assert answers[0] == answers[1], path


def _inline(document: dict[str, Any], node: Any) -> Any:
    """`node` with every local $ref replaced by what it names (descriptions and examples dropped)."""
    if isinstance(node, list):
        return [_inline(document, item) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target: Any = document
        for key in node["$ref"].removeprefix("#/").split("/"):
            target = target[key]
        return _inline(document, target)
    return {k: _inline(document, v) for k, v in node.items() if k not in ("description", "summary", "example")}


def test_route_patterns_expand_as_documented() -> None:
    assert templates(r"(?i)/v1/models/(?P<model>[^/:]+)(?:/versions/(?P<version>[0-9]+)|/labels/(?P<l>[^/]+))?:p") \
        == ["/v1/models/{model}/versions/{version}:p", "/v1/models/{model}/labels/{l}:p", "/v1/models/{model}:p"]
    with pytest.raises(ValueError):
        templates(r"/v2/models/.*")


def test_the_packaged_documents_are_the_files_in_the_source_tree() -> None:
    folder = Path(openapi.__file__).parent
    assert sorted(p.stem for p in folder.glob("*.yaml")) == sorted(openapi.DOCUMENTS)
