"""An app's routes by the first segment of the path (protocols/http/route_index.py): for any path, the routes it
offers match exactly as the whole table does, in the same order."""

from __future__ import annotations

import random
import re

import pytest

from modelhost.protocols.http.route_index import RouteIndex

VERSIONED = r"(?P<model>[^/]+)(?:/versions/(?P<version>[0-9]+))?"
PATTERNS = [
    rf"/v2/models/{VERSIONED}/infer", "/v2/health/ready", "/v2", rf"/v2/models/{VERSIONED}",
    r"/v2/repository(?:/(?P<repository>[^/]+))?/index", r"/v2/systemsharedmemory/region/(?P<region>.+)/status",
    r"(?i)/v1/models/(?P<model>[^/:]+)(?:/versions/(?P<version>[0-9]+)|/labels/(?P<label>[^/:]+))?:predict",
    r"(?i)/v1/models", r"/v2/openapi\.yaml", "/ping", "/invocations", r"/endpoints/(?P<endpoint>[^/]+)/invocations",
    r"/models/(?P<name>[^/]+)", r"/predictions/(?P<model>[^/]+)(?:/(?P<version>[^/]+)(?:/(?P<extra>.+))?)?",
    r"/v1/models/(?P<model>[^/:]+):(?P<verb>predict|explain)",
    r"/v2/(?:a|b)\|x",
]
EVERYWHERE = [  # first segments that are not literal text, or an alternative outside every group: tried for every path
    r"/(?P<anything>[^/]+)/status", r"/v[0-9]/metrics", r"/a.b/x", r"(?:/api)?/health", r"/models(?:/x)?",
    r"/v2/alt|/other/alt",
]
PATHS = [
    "/v2/models/tiny/infer", "/v2/models/tiny/versions/3/infer", "/v2", "/v2/", "/V2/health/ready", "/v2/health/ready",
    "/v1/models/m:predict", "/V1/MODELS/m:PREDICT", "/v1/models", "/v1/models/m/labels/stable:predict",
    "/ping", "/PING", "/invocations", "/endpoints/e/invocations", "/models/m", "/models", "/models/x",
    "/predictions/m/2/extra/more", "/x/status", "/v2/status", "/v3/metrics", "/a.b/x", "/axb/x", "/api/health",
    "/health", "", "/", "//v2", "/v2/openapi.yaml", "/v2/openapiXyaml", "/v2/systemsharedmemory/region/r/status",
    "/other/alt", "/v2/alt", "/v2/a|x",
]


def matches(patterns: list[str], path: str) -> list[str]:
    return [pattern for pattern in patterns if re.fullmatch(pattern, path)]


@pytest.mark.parametrize("seed", range(4))
def test_a_path_gets_the_routes_the_whole_table_would_match_in_order(seed: int) -> None:
    rng = random.Random(seed)
    patterns = PATTERNS + EVERYWHERE
    rng.shuffle(patterns)
    index = RouteIndex(patterns, patterns)
    paths = PATHS + ["".join(c.swapcase() if rng.random() < 0.3 else c for c in p) for p in PATHS]
    for path in paths:
        assert matches(index.of(path), path) == matches(patterns, path), path


def test_a_path_is_offered_only_the_routes_of_its_first_segment() -> None:
    patterns = PATTERNS + EVERYWHERE
    index = RouteIndex(patterns, patterns)
    v1 = [p for p in patterns if p.startswith(("/v1/", "(?i)/v1/")) or p == "(?i)/v1/models" or p in EVERYWHERE]
    assert index.of("/v1/models/m:predict") == v1
    assert index.of("/nothing/here") == EVERYWHERE
