"""One table of inference cases, run through every protocol that can express each: the same request means the
same outputs or the same kind of error whichever front-end carries it.

Adapters: KServe V2 over HTTP as JSON (`requests`) and as binary tensors (`tritonclient.http`), KServe V2 over
gRPC (`tritonclient.grpc`), TF Serving's REST predict, and SageMaker's /invocations (JSON `instances`). Each
turns a case into its protocol's request and the answer back into outputs or an ErrorKind, read from the
protocol's own status code; the error's message must name what the case says it names. Runs against the
session's example server (`tiny`: y = 2x + 1, x FP32 [-1, 4], max_batch_size 1024; `rank`: features FP32
[-1, 1000]; `deepfm`: two inputs). Wire-level refusals (JSON framing, the binary extension, encodings) are in
each protocol's own tests (test_bad_requests.py for KServe V2 over HTTP).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from modelhost.errors import ErrorKind
from modelhost.protocols.grpc_handlers import STATUS as GRPC_STATUS
from modelhost.protocols.http.app import STATUS as HTTP_STATUS
from tests.server import ServerProcess

V2_JSON, V2_BINARY, V2_GRPC, TFS_REST, SAGEMAKER = "v2-json", "v2-binary", "v2-grpc", "tfs-rest", "sagemaker"
ALL = frozenset({V2_JSON, V2_BINARY, V2_GRPC, TFS_REST, SAGEMAKER})
TYPED = frozenset({V2_JSON, V2_BINARY, V2_GRPC})  # the wire carries a datatype and can name outputs


def f32(*rows: list[float]) -> np.ndarray:
    return np.array(rows, dtype=np.float32)


@dataclass(frozen=True)
class Case:
    id: str
    inputs: dict[str, np.ndarray]
    expect: dict[str, np.ndarray] | ErrorKind
    names: tuple[str, ...] = ()  # what the error message must mention
    v2_names: tuple[str, ...] = ()  # what KServe V2's messages mention besides (TF Serving's speak per instance)
    model: str = "tiny"
    outputs: tuple[str, ...] = ()  # requested outputs; () for all
    protocols: frozenset[str] = ALL


CASES = [
    Case("one-row", {"x": f32([1, 2, 3, 4])}, {"y": f32([3, 5, 7, 9])}),
    Case("three-rows", {"x": f32([0, 0, 0, 0], [1, 1, 1, 1], [-1, 0.5, 2, 8])},
         {"y": f32([1, 1, 1, 1], [3, 3, 3, 3], [-1, 2, 5, 17])}),
    Case("named-output", {"x": f32([1, 2, 3, 4])}, {"y": f32([3, 5, 7, 9])}, outputs=("y",), protocols=TYPED),
    Case("unknown-model", {"x": f32([1, 2, 3, 4])}, ErrorKind.NOT_FOUND, ("nope",), model="nope"),
    Case("wrong-width", {"x": f32([1, 2, 3, 4, 5])}, ErrorKind.INVALID_INPUT, ("x", "4]")),
    Case("wrong-shape", {"features": np.full((2, 999), 0.5, np.float32)}, ErrorKind.INVALID_INPUT,
         ("'features'", "999", "1000"), v2_names=("[2,999]", "[-1,1000]"), model="rank"),
    Case("wrong-rank", {"x": np.array([1, 2, 3, 4], np.float32)}, ErrorKind.INVALID_INPUT, ("'x'", "[4]", "[-1,4]"),
         protocols=TYPED),
    Case("unexpected-input", {"x": f32([1, 2, 3, 4]), "z": f32([1, 2, 3, 4])}, ErrorKind.INVALID_INPUT, ("z",)),
    Case("unknown-input", {"nope_in": f32([1, 2, 3, 4])}, ErrorKind.INVALID_INPUT, ("'nope_in'", "'tiny'", "'x'"),
         protocols=TYPED),
    Case("over-max-batch", {"x": np.zeros((1025, 4), np.float32)}, ErrorKind.INVALID_INPUT,
         ("x", "1025", "max_batch_size", "1024")),
    Case("over-max-batch-4mb", {"features": np.zeros((1025, 1000), np.float32)}, ErrorKind.INVALID_INPUT,
         ("'features'", "1025", "max_batch_size", "1024"), model="rank", protocols=TYPED),
    Case("wrong-datatype", {"x": np.array([[1, 2, 3, 4]], np.int32)}, ErrorKind.INVALID_INPUT, ("x", "INT32", "FP32"),
         protocols=TYPED),
    Case("wrong-datatype-fp64", {"features": np.full((1, 1000), 0.5, np.float64)}, ErrorKind.INVALID_INPUT,
         ("'features'", "FP64", "FP32"), model="rank", protocols=TYPED),
    Case("missing-input", {"feat_ids": np.ones((1, 39), np.int64)}, ErrorKind.INVALID_INPUT,
         ("missing", "'feat_vals'"), v2_names=("'deepfm'",), model="deepfm"),
    Case("batch-mismatch", {"feat_ids": np.ones((1, 39), np.int64), "feat_vals": np.full((2, 39), 0.5, np.float32)},
         ErrorKind.INVALID_INPUT, ("'feat_vals'", "batch"), model="deepfm", protocols=TYPED),
    Case("unknown-output", {"x": f32([1, 2, 3, 4])}, ErrorKind.INVALID_INPUT, ("'nope_out'", "'y'"),
         outputs=("nope_out",), protocols=TYPED),
]


@dataclass
class Answer:
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    kind: ErrorKind | None = None
    message: str = ""


HTTP_KINDS = {status: kind for kind, status in reversed(list(HTTP_STATUS.items()))}
GRPC_KINDS = {status: kind for kind, status in reversed(list(GRPC_STATUS.items()))}


def http_error(response: requests.Response) -> Answer:
    return Answer(kind=HTTP_KINDS[response.status_code], message=response.json()["error"])


def v2_json(server: ServerProcess, case: Case) -> Answer:
    body: dict[str, Any] = {"inputs": [
        {"name": name, "datatype": np_to_triton_dtype(array.dtype), "shape": list(array.shape), "data": array.tolist()}
        for name, array in case.inputs.items()]}
    if case.outputs:
        body["outputs"] = [{"name": name} for name in case.outputs]
    response = requests.post(f"{server.base}/v2/models/{case.model}/infer", json=body, timeout=30)
    if response.status_code != 200:
        return http_error(response)
    return Answer({o["name"]: np.array(o["data"], np.float32).reshape(o["shape"]) for o in response.json()["outputs"]})


def v2_binary(server: ServerProcess, case: Case) -> Answer:
    client = httpclient.InferenceServerClient(server.url)
    inputs = []
    for name, array in case.inputs.items():
        given = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        given.set_data_from_numpy(array, binary_data=True)
        inputs.append(given)
    outputs = [httpclient.InferRequestedOutput(name, binary_data=True) for name in case.outputs] or None
    try:
        result = client.infer(case.model, inputs, outputs=outputs)
    except InferenceServerException as exc:
        return Answer(kind=HTTP_KINDS[int(exc.status())], message=exc.message())
    finally:
        client.close()
    return Answer({o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]})


def v2_grpc(server: ServerProcess, case: Case) -> Answer:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inputs = []
    for name, array in case.inputs.items():
        given = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        given.set_data_from_numpy(array)
        inputs.append(given)
    outputs = [grpcclient.InferRequestedOutput(name) for name in case.outputs] or None
    try:
        result = client.infer(case.model, inputs, outputs=outputs)
    except InferenceServerException as exc:
        code = getattr(grpc.StatusCode, str(exc.status()).removeprefix("StatusCode."))
        return Answer(kind=GRPC_KINDS[code], message=exc.message())
    finally:
        client.close()
    return Answer({o.name: result.as_numpy(o.name) for o in result.get_response().outputs})


MULTI_INPUT = {"deepfm"}  # models whose instances a client names input by input


def rows_body(case: Case) -> dict[str, Any]:
    """TF Serving's row format: one instance per batch row, an object keyed by input name for a model of several."""
    if len(case.inputs) == 1 and case.model not in MULTI_INPUT:
        return {"instances": next(iter(case.inputs.values())).tolist()}
    rows = len(next(iter(case.inputs.values())))
    return {"instances": [{name: array[i].tolist() for name, array in case.inputs.items()} for i in range(rows)]}


def predictions(document: dict[str, Any]) -> Answer:
    return Answer({"y": np.array(document["predictions"], np.float32)})


def tfs_rest(server: ServerProcess, case: Case) -> Answer:
    response = requests.post(f"{server.base}/v1/models/{case.model}:predict", json=rows_body(case), timeout=30)
    if response.status_code != 200:
        return http_error(response)
    return predictions(response.json())


def sagemaker(server: ServerProcess, case: Case) -> Answer:
    response = requests.post(f"{server.sagemaker}/invocations", json=rows_body(case), timeout=30, headers={
        "X-Amzn-SageMaker-Custom-Attributes": f"tfs-model-name={case.model}", "Accept": "application/json"})
    if response.status_code != 200:
        return http_error(response)
    return predictions(response.json())


ADAPTERS: dict[str, Callable[[ServerProcess, Case], Answer]] = {
    V2_JSON: v2_json, V2_BINARY: v2_binary, V2_GRPC: v2_grpc, TFS_REST: tfs_rest, SAGEMAKER: sagemaker,
}


@pytest.mark.parametrize(("case", "protocol"), [
    pytest.param(case, protocol, id=f"{case.id}-{protocol}")
    for case in CASES for protocol in sorted(case.protocols)
])
def test_case(example_server: ServerProcess, case: Case, protocol: str) -> None:
    answer = ADAPTERS[protocol](example_server, case)
    if isinstance(case.expect, ErrorKind):
        assert (answer.kind, answer.outputs) == (case.expect, {}), answer
        for name in case.names + (case.v2_names if protocol in TYPED else ()):
            assert name in answer.message, f"{name!r} not in {answer.message!r}"
    else:
        assert answer.kind is None, answer
        assert sorted(answer.outputs) == sorted(case.expect)
        for name, expected in case.expect.items():
            np.testing.assert_allclose(answer.outputs[name], expected, rtol=1e-6)


@pytest.mark.parametrize("case", [c for c in CASES if isinstance(c.expect, ErrorKind)], ids=lambda case: case.id)
def test_the_v2_protocols_say_the_same_words(example_server: ServerProcess, case: Case) -> None:
    """KServe V2 over JSON, binary tensors and gRPC reach one core: a refused request reads the same in all three."""
    messages = {protocol: ADAPTERS[protocol](example_server, case).message for protocol in sorted(TYPED)}
    assert len(set(messages.values())) == 1, messages
