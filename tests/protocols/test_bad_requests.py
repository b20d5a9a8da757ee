"""Bad KServe V2 HTTP requests, sent raw with `requests` to the example server.

Each gets the right status and a JSON body {"error": "..."} whose message names the tensor or
field and the problem; after each one the server still answers a good request.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import requests

from tests.helpers import assert_error
from tests.server import ServerProcess

GOOD_TINY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
HEADER_LENGTH = "Inference-Header-Content-Length"


@pytest.fixture(scope="module")
def http() -> Iterator[requests.Session]:
    with requests.Session() as session:
        yield session


def assert_still_serving(http: requests.Session, server: ServerProcess) -> None:
    response = http.post(f"{server.base}/v2/models/tiny/infer", json=GOOD_TINY, timeout=10)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [3.0, 5.0, 7.0, 9.0]


def tensor(name: str, datatype: str, shape: list[int], data: Any = None, **parameters: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
    if data is not None:
        entry["data"] = data
    if parameters:
        entry["parameters"] = parameters
    return entry


def binary_body(header: dict[str, Any], *chunks: bytes) -> tuple[bytes, dict[str, str]]:
    text = json.dumps(header).encode()
    return text + b"".join(chunks), {HEADER_LENGTH: str(len(text))}


@dataclass
class Case:
    """POST /v2/models/{model}/infer with `body` (a dict is sent as JSON) -> `status`, message with `fragments`."""

    model: str
    body: bytes | dict[str, Any]
    status: int
    fragments: tuple[str, ...]
    headers: dict[str, str] = field(default_factory=dict)


def _binary_case(model: str, header: dict[str, Any], chunks: list[bytes], status: int, *fragments: str,
                 headers: dict[str, str] | None = None) -> Case:
    body, framing = binary_body(header, *chunks)
    return Case(model, body, status, fragments, {**framing, **(headers or {})})


X16 = np.arange(4, dtype=np.float32).reshape(1, 4).tobytes()  # tiny's x [1,4] FP32: 16 bytes
DEEP_JSON = b"[" * 1000 + b"1" + b"]" * 1000
DEEPFM_VALS = tensor("feat_vals", "FP32", [1, 39], [0.5] * 39)

INFER_CASES = {
    # body framing and JSON
    "bad-json": Case("tiny", b'{"inputs": [', 400, ("not valid JSON",)),
    "empty-body": Case("tiny", b"", 400, ("not valid JSON",)),
    "body-is-a-list": Case("tiny", b"[1, 2]", 400, ("JSON object",)),
    "body-is-a-string": Case("tiny", b'"inputs"', 400, ("JSON object",)),
    "no-inputs": Case("tiny", {"id": "1"}, 400, ("'inputs'",)),
    "inputs-not-a-list": Case("tiny", {"inputs": {"x": 1}}, 400, ("'inputs'", "must be a list")),
    "input-not-an-object": Case("tiny", {"inputs": [7]}, 400, ("inputs[0]",)),
    "input-without-name": Case("tiny", {"inputs": [{"datatype": "FP32", "shape": [1, 4], "data": [1] * 4}]},
                               400, ("inputs[0]", "'name'")),
    "input-without-datatype": Case("tiny", {"inputs": [{"name": "x", "shape": [1, 4], "data": [1] * 4}]},
                                   400, ("'x'", "'datatype'")),
    "unknown-datatype": Case("tiny", {"inputs": [tensor("x", "FLOAT", [1, 4], [1] * 4)]}, 400, ("'x'", "'FLOAT'")),
    "negative-shape": Case("tiny", {"inputs": [tensor("x", "FP32", [1, -4], [1] * 4)]}, 400, ("'x'", "'shape'")),
    "scalar-input": Case("tiny", {"inputs": [tensor("x", "FP32", [], 1.0)]}, 400, ("'x'", "scalar", "batch")),
    "empty-inputs-list": Case("tiny", {"inputs": []}, 400, ("missing", "'x'")),
    "input-without-data": Case("tiny", {"inputs": [tensor("x", "FP32", [1, 4])]}, 400, ("'x'", "'data'")),
    "id-not-a-string": Case("tiny", {**GOOD_TINY, "id": 5}, 400, ("'id'", "string")),
    "duplicate-input": Case("tiny", {"inputs": GOOD_TINY["inputs"] * 2}, 400, ("'x'", "twice")),
    # tensor data in JSON (the signature checks every protocol shares are in test_conformance.py)
    "json-data-too-short": Case("tiny", {"inputs": [tensor("x", "FP32", [1, 4], [1, 2, 3])]},
                                400, ("'x'", "3 elements", "[1,4]")),
    "json-data-too-long": Case("tiny", {"inputs": [tensor("x", "FP32", [1, 4], [1, 2, 3, 4, 5])]},
                               400, ("'x'", "5 elements", "[1,4]")),
    "json-data-ragged": Case("tiny", {"inputs": [tensor("x", "FP32", [2, 2], [[1, 2, 3], [4]])]},
                             400, ("'x'", "ragged")),
    "json-strings-for-fp32": Case("tiny", {"inputs": [tensor("x", "FP32", [1, 4], ["a", "b", "c", "d"])]},
                                  400, ("'x'", "FP32", "numbers")),
    "json-floats-for-int64": Case("deepfm", {"inputs": [tensor("feat_ids", "INT64", [1, 39], [1.5] * 39),
                                                        DEEPFM_VALS]}, 400, ("'feat_ids'", "INT64", "integers")),
    "classification-count-negative": Case(
        "tiny", {**GOOD_TINY, "outputs": [{"name": "y", "parameters": {"classification": -2}}]},
        400, ("'y'", "classification", "non-negative integer", "-2")),
    "classification-count-not-a-number": Case(
        "tiny", {**GOOD_TINY, "outputs": [{"name": "y", "parameters": {"classification": "3"}}]},
        400, ("'y'", "classification", "'3'")),
    # JSON nested past what repr() prints (1,000 lists) where a message shows the client's value: a 400, not a 500
    "deep-shape": Case("tiny", b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": ' + DEEP_JSON
                       + b', "data": [1]}]}', 400, ("'x'", "shape", "[[[[...]]]]")),
    "deep-datatype": Case("tiny", b'{"inputs": [{"name": "x", "datatype": ' + DEEP_JSON + b', "shape": [1, 4]}]}',
                          400, ("'x'", "unknown datatype")),
    "deep-binary-size": Case(
        "tiny", b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": '
        + DEEP_JSON + b'}}]}', 400, ("'x'", "binary_data_size")),
    "deep-priority": Case("tiny", b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], '
                          b'"data": [1, 2, 3, 4]}], "parameters": {"priority": ' + DEEP_JSON + b'}}',
                          400, ("'priority'", "non-negative")),
    "output-without-name": Case("tiny", {**GOOD_TINY, "outputs": [{"parameters": {}}]}, 400, ("outputs[0]", "'name'")),
    # As Triton (qa/L0_output_name): an unknown output is named before a wrong input
    "unknown-output-and-input": Case("tiny", {"inputs": [tensor("INPUT0", "FP32", [1, 4], [1] * 4)],
                                              "outputs": [{"name": "DUMMY"}]},
                                     400, ("unexpected inference output 'DUMMY' for model 'tiny'",)),
    # Triton's binary tensor data extension
    "binary-truncated": _binary_case("tiny", {"inputs": [tensor("x", "FP32", [1, 4], binary_data_size=16)]},
                                     [X16[:8]], 400, "'x'", "binary_data_size 16", "8 bytes"),
    "binary-leftover-bytes": _binary_case("tiny", {"inputs": [tensor("x", "FP32", [1, 4], binary_data_size=16)]},
                                          [X16, b"junk"], 400, "4 bytes", "no input claims"),
    "binary-size-mismatches-shape": _binary_case(
        "tiny", {"inputs": [tensor("x", "FP32", [1, 4], binary_data_size=12)]}, [X16[:12]],
        400, "'x'", "12 bytes", "[1,4]", "16"),
    "binary-size-not-an-int": _binary_case(
        "tiny", {"inputs": [tensor("x", "FP32", [1, 4], binary_data_size="16")]}, [X16], 400, "'x'",
        "binary_data_size"),
    "binary-without-header-length": Case(
        "tiny", binary_body({"inputs": [tensor("x", "FP32", [1, 4], binary_data_size=16)]}, X16)[0],
        400, ("not valid JSON",)),
    "header-length-not-an-int": _binary_case(
        "tiny", {"inputs": [tensor("x", "FP32", [1, 4], binary_data_size=16)]}, [X16], 400,
        HEADER_LENGTH, "'abc'", headers={HEADER_LENGTH: "abc"}),
    "header-length-beyond-body": _binary_case(
        "tiny", {"inputs": [tensor("x", "FP32", [1, 4], binary_data_size=16)]}, [X16], 400,
        HEADER_LENGTH, "100000", headers={HEADER_LENGTH: "100000"}),
    "header-length-negative": _binary_case(
        "tiny", {"inputs": [tensor("x", "FP32", [1, 4], binary_data_size=16)]}, [X16], 400,
        HEADER_LENGTH, "-3", headers={HEADER_LENGTH: "-3"}),
    "header-length-cuts-json": _binary_case(
        "tiny", {"inputs": [tensor("x", "FP32", [1, 4], binary_data_size=16)]}, [X16], 400,
        "not valid JSON", headers={HEADER_LENGTH: "10"}),
    # content encoding
    "bad-gzip": Case("tiny", b"definitely not gzip", 400, ("gzip",), {"Content-Encoding": "gzip"}),
    "unsupported-encoding": Case("tiny", json.dumps(GOOD_TINY).encode(), 400, ("br",), {"Content-Encoding": "br"}),
    # models and versions
    "unknown-version": Case("tiny/versions/7", GOOD_TINY, 404, ("'tiny'", "7", "not found")),
}


@pytest.mark.parametrize("case", INFER_CASES.values(), ids=INFER_CASES.keys())
def test_bad_infer_request(http: requests.Session, example_server: ServerProcess, case: Case) -> None:
    url = f"{example_server.base}/v2/models/{case.model}/infer"
    if isinstance(case.body, dict):
        response = http.post(url, data=json.dumps(case.body).encode(), headers=case.headers, timeout=30)
    else:
        response = http.post(url, data=case.body, headers=case.headers, timeout=30)
    assert_error(response, case.status, *case.fragments)
    assert_still_serving(http, example_server)


def test_unknown_model_message_prefix(http: requests.Session, example_server: ServerProcess) -> None:
    for method, path in [("GET", "/v2/models/nope"), ("GET", "/v2/models/nope/config"),
                         ("POST", "/v2/models/nope/infer")]:
        response = http.request(method, example_server.base + path, json=GOOD_TINY, timeout=10)
        message = assert_error(response, 404)
        assert message.startswith("Request for unknown model: 'nope' is not found"), (path, message)
    assert_still_serving(http, example_server)


@pytest.mark.parametrize("path", ["/v2/models/tiny/versions/7", "/v2/models/tiny/versions/7/config"])
def test_unknown_version(http: requests.Session, example_server: ServerProcess, path: str) -> None:
    assert_error(http.get(example_server.base + path, timeout=10), 404, "'tiny'", "7")
    assert_still_serving(http, example_server)


@pytest.mark.parametrize("path", ["/v2/models/nope/ready", "/v2/models/tiny/versions/7/ready"])
def test_not_ready_model(http: requests.Session, example_server: ServerProcess, path: str) -> None:
    # Triton: an unknown model or version is simply not ready -> 400 {"error": "Model version not ready"}.
    assert_error(http.get(example_server.base + path, timeout=10), 400, "not ready")


ROUTES = [
    ("GET", "/v2/nothing", 404, "Not Found"),
    ("GET", "/", 404, "Not Found"),
    ("GET", "/v2/models/tiny/versions/one", 404, "Not Found"),
    ("POST", "/v2/models/tiny/versions/1/infer/extra", 404, "Not Found"),
    ("GET", "/v2/models/tiny/infer", 405, "Method Not Allowed"),
    ("POST", "/v2/health/live", 405, "Method Not Allowed"),
    ("DELETE", "/v2", 405, "Method Not Allowed"),
    ("PUT", "/v2/models/tiny", 405, "Method Not Allowed"),
    ("GET", "/v2/repository/index", 405, "Method Not Allowed"),
]


@pytest.mark.parametrize(("method", "path", "status", "error"), ROUTES, ids=[f"{m} {p}" for m, p, _, _ in ROUTES])
def test_unknown_route_or_method(
    http: requests.Session, example_server: ServerProcess, method: str, path: str, status: int, error: str
) -> None:
    response = http.request(method, example_server.base + path, timeout=10)
    assert_error(response, status)
    assert response.json() == {"error": error}
    assert_still_serving(http, example_server)


@pytest.mark.parametrize(("body", "fragments"), [(b"{", ("not valid JSON",)), (b"[true]", ("JSON object",))],
                         ids=["bad-json", "not-an-object"])
def test_bad_repository_index_body(
    http: requests.Session, example_server: ServerProcess, body: bytes, fragments: tuple[str, ...]
) -> None:
    assert_error(http.post(f"{example_server.base}/v2/repository/index", data=body, timeout=10), 400, *fragments)
    assert_still_serving(http, example_server)


def test_error_inside_the_model(http: requests.Session, example_server: ServerProcess) -> None:
    """deepfm's Gather fails on an id out of its vocabulary: 400 with onnxruntime's message, then business as usual."""
    url = f"{example_server.base}/v2/models/deepfm/infer"
    bad = {"inputs": [tensor("feat_ids", "INT64", [2, 39], [10**9] * 78), tensor("feat_vals", "FP32", [2, 39],
                                                                                  [1.0] * 78)]}
    assert_error(http.post(url, json=bad, timeout=10), 400, "onnxruntime", "Gather", "out of data bounds")

    ids = np.random.default_rng(0).integers(0, 100_000, (2, 39)).tolist()
    good = {"inputs": [tensor("feat_ids", "INT64", [2, 39], ids), tensor("feat_vals", "FP32", [2, 39], [1.0] * 78)]}
    response = http.post(url, json=good, timeout=10)
    assert response.status_code == 200, response.text
    [entry] = response.json()["outputs"]
    assert entry["name"] == "prob" and entry["shape"] == [2, 1]
    assert all(0.0 < p < 1.0 for p in entry["data"])
    assert_still_serving(http, example_server)


# --- request size limit: a server of its own with a small --http-max-body-bytes -------------------

LIMIT = 4096


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(None, "--http-max-body-bytes", str(LIMIT), cache_dir=tmp_path_factory.mktemp("cache"))
    yield server.wait_ready()
    server.stop()


def _padded_tiny(size: int) -> bytes:
    """A valid tiny request whose JSON text is `size` bytes (padding in an ignored request parameter)."""
    base = json.dumps({**GOOD_TINY, "parameters": {"pad": ""}}).encode()
    return json.dumps({**GOOD_TINY, "parameters": {"pad": "a" * (size - len(base))}}).encode()


@pytest.mark.parametrize("size", [LIMIT + 1, 16 * LIMIT, 1024 * LIMIT])
def test_body_over_limit(http: requests.Session, small_server: ServerProcess, size: int) -> None:
    url = f"{small_server.base}/v2/models/tiny/infer"
    body = _padded_tiny(size)
    assert len(body) == size
    assert_error(http.post(url, data=body, timeout=30), 413, str(LIMIT), "--http-max-body-bytes")
    assert_still_serving(http, small_server)


def test_chunked_body_over_limit(http: requests.Session, small_server: ServerProcess) -> None:
    """No Content-Length (Transfer-Encoding: chunked): the limit applies to the bytes as they arrive."""
    body = _padded_tiny(4 * LIMIT)
    chunks = iter([body[i : i + 1000] for i in range(0, len(body), 1000)])
    response = http.post(f"{small_server.base}/v2/models/tiny/infer", data=chunks, timeout=30)
    assert_error(response, 413, str(LIMIT), "--http-max-body-bytes")
    assert_still_serving(http, small_server)


def test_body_at_limit_is_accepted(http: requests.Session, small_server: ServerProcess) -> None:
    response = http.post(f"{small_server.base}/v2/models/tiny/infer", data=_padded_tiny(LIMIT), timeout=10)
    assert response.status_code == 200, response.text


def test_gzip_body_over_limit_once_decompressed(http: requests.Session, small_server: ServerProcess) -> None:
    """The limit bounds what the server holds: Triton caps the decompressed size at its max input size too."""
    body = gzip.compress(_padded_tiny(256 * LIMIT))
    assert len(body) < LIMIT
    response = http.post(f"{small_server.base}/v2/models/tiny/infer", data=body,
                         headers={"Content-Encoding": "gzip"}, timeout=30)
    assert_error(response, 413, str(LIMIT), "--http-max-body-bytes")
    assert_still_serving(http, small_server)
