"""Every KServe V2 datatype round-trips through an ONNX Identity model, in binary and in JSON.

One repository of identity models (one per datatype: INPUT0 -> OUTPUT0, max_batch_size 8,
dims [-1]) served once for the module; requests go through `tritonclient.http`, and through raw
`requests` where the client would hide what is checked.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from tests.datatype_values import extremes
from tests.onnx_models import identity_model, write_model
from tests.server import ServerProcess

# V2 datatype -> (ONNX element type, numpy dtype as tritonclient uses it)
DATATYPES: dict[str, tuple[int, type]] = {
    "BOOL": (TensorProto.BOOL, np.bool_),
    "UINT8": (TensorProto.UINT8, np.uint8),
    "UINT16": (TensorProto.UINT16, np.uint16),
    "UINT32": (TensorProto.UINT32, np.uint32),
    "UINT64": (TensorProto.UINT64, np.uint64),
    "INT8": (TensorProto.INT8, np.int8),
    "INT16": (TensorProto.INT16, np.int16),
    "INT32": (TensorProto.INT32, np.int32),
    "INT64": (TensorProto.INT64, np.int64),
    "FP16": (TensorProto.FLOAT16, np.float16),
    "FP32": (TensorProto.FLOAT, np.float32),
    "FP64": (TensorProto.DOUBLE, np.float64),
    "BYTES": (TensorProto.STRING, np.object_),
}
INTEGERS = [d for d, (_, t) in DATATYPES.items() if np.dtype(t).kind in "iu"]
FLOATS = ["FP16", "FP32", "FP64"]


def model_name(datatype: str) -> str:
    return f"identity_{datatype.lower()}"


def _config(datatype: str) -> str:
    config_type = "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"
    return (
        f'name: "{model_name(datatype)}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        f'input [ {{ name: "INPUT0" data_type: {config_type} dims: [ -1 ] }} ]\n'
        f'output [ {{ name: "OUTPUT0" data_type: {config_type} dims: [ -1 ] }} ]\n'
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("identity-repository")
    for datatype, (element_type, _) in DATATYPES.items():
        write_model(repository, model_name(datatype), identity_model(element_type), _config(datatype))
    process = ServerProcess(repository, "--strict-readiness").wait_ready()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    triton = httpclient.InferenceServerClient(server.url, network_timeout=30.0)
    yield triton
    triton.close()


def roundtrip(
    client: httpclient.InferenceServerClient, datatype: str, array: np.ndarray, binary: bool
) -> tuple[np.ndarray, dict]:
    infer_input = httpclient.InferInput("INPUT0", list(array.shape), datatype).set_data_from_numpy(array, binary)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]
    result = client.infer(model_name(datatype), [infer_input], outputs=outputs)
    return result.as_numpy("OUTPUT0"), result.get_response()


def assert_same(datatype: str, actual: np.ndarray, expected: np.ndarray, binary: bool) -> None:
    assert actual.shape == expected.shape
    if datatype == "BYTES":
        # tritonclient gives bytes for binary BYTES outputs, str for JSON ones.
        want = expected if binary else np.vectorize(lambda b: b.decode("utf-8"), otypes=[object])(expected)
        assert actual.tolist() == want.tolist()
        return
    assert actual.dtype == expected.dtype
    # Bit for bit: keeps -0.0 apart from 0.0, NaN equal to NaN, and uint64 max exact.
    assert actual.tobytes() == expected.tobytes(), (actual, expected)


def test_server_ready_with_every_datatype(client: httpclient.InferenceServerClient) -> None:
    # --strict-readiness: ready only when every identity model loaded.
    assert client.is_server_ready()
    for datatype in DATATYPES:
        metadata = client.get_model_metadata(model_name(datatype))
        assert metadata["inputs"] == [{"name": "INPUT0", "datatype": datatype, "shape": [-1, -1]}]
        assert metadata["outputs"] == [{"name": "OUTPUT0", "datatype": datatype, "shape": [-1, -1]}]


@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_roundtrip_binary(client: httpclient.InferenceServerClient, datatype: str) -> None:
    array = extremes(datatype, binary=True)
    actual, response = roundtrip(client, datatype, array, binary=True)
    [entry] = response["outputs"]
    assert entry["datatype"] == datatype and entry["shape"] == list(array.shape)
    assert "binary_data_size" in entry["parameters"]
    assert_same(datatype, actual, array, binary=True)


@pytest.mark.parametrize("datatype", [d for d in DATATYPES if d != "FP16"])
def test_roundtrip_json(client: httpclient.InferenceServerClient, datatype: str) -> None:
    array = extremes(datatype, binary=False)
    actual, response = roundtrip(client, datatype, array, binary=False)
    [entry] = response["outputs"]
    assert entry["datatype"] == datatype and entry["shape"] == list(array.shape)
    assert "data" in entry
    assert_same(datatype, actual, array, binary=False)


@pytest.mark.parametrize("datatype", ["BOOL", "INT32", "FP32", "BYTES"])
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_roundtrip_empty_tensor(client: httpclient.InferenceServerClient, datatype: str, binary: bool) -> None:
    array = np.empty((2, 0), dtype=DATATYPES[datatype][1])
    actual, response = roundtrip(client, datatype, array, binary)
    assert response["outputs"][0]["shape"] == [2, 0]
    assert actual.shape == (2, 0)


def test_bytes_with_nul_bytes_binary(client: httpclient.InferenceServerClient) -> None:
    array = np.array([[b"a\x00b", b"\x00", b"tail\x00"]], dtype=object)
    actual, _ = roundtrip(client, "BYTES", array, binary=True)
    assert actual.tolist() == array.tolist()


def test_bytes_nested_json_raw(server: ServerProcess) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [2, 2], "data": [["a", "é"], ["", "日本"]]}]}
    response = requests.post(f"{server.base}/v2/models/identity_bytes/infer", json=body, timeout=10)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == ["a", "é", "", "日本"]


def test_fp16_json_input_is_rejected_raw(server: ServerProcess) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP16", "shape": [1, 2], "data": [1.0, 2.5]}]}
    response = requests.post(f"{server.base}/v2/models/identity_fp16/infer", json=body, timeout=10)
    assert response.status_code == 400
    message = response.json()["error"]
    assert "FP16" in message and "INPUT0" in message and "JSON" in message


def test_fp16_json_input_is_rejected_tritonclient(client: httpclient.InferenceServerClient) -> None:
    array = np.array([[1.0, 2.5]], dtype=np.float16)
    with pytest.raises(InferenceServerException) as caught:
        roundtrip(client, "FP16", array, binary=False)
    assert caught.value.status() == "400"
    assert "FP16" in caught.value.message()


def test_bytes_not_utf8_binary_is_rejected(client: httpclient.InferenceServerClient, server: ServerProcess) -> None:
    """onnxruntime string tensors hold UTF-8 text: other bytes get a clear 400, and the server goes on."""
    array = np.array([[b"ok", b"\xff\xfe bad", b"\xc3"]], dtype=object)
    with pytest.raises(InferenceServerException) as caught:
        roundtrip(client, "BYTES", array, binary=True)
    assert caught.value.status() == "400"
    message = caught.value.message()
    assert "INPUT0" in message and "UTF-8" in message
    good = np.array([[b"still", b"fine"]], dtype=object)
    assert roundtrip(client, "BYTES", good, binary=True)[0].tolist() == good.tolist()


def test_uint64_max_in_json_raw(server: ServerProcess) -> None:
    """JSON integers are unbounded; Triton reads UINT64 JSON data as uint64 (values >= 2**63 included)."""
    values = [0, 1, 2**63, 2**64 - 1]
    body = {"inputs": [{"name": "INPUT0", "datatype": "UINT64", "shape": [1, 4], "data": values}]}
    response = requests.post(f"{server.base}/v2/models/identity_uint64/infer", json=body, timeout=10)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == values


@pytest.mark.parametrize("datatype", INTEGERS)
def test_json_integer_out_of_range_is_rejected(server: ServerProcess, datatype: str) -> None:
    info = np.iinfo(DATATYPES[datatype][1])
    for value in (int(info.min) - 1, int(info.max) + 1):
        body = {"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": [1, 1], "data": [value]}]}
        response = requests.post(f"{server.base}/v2/models/{model_name(datatype)}/infer",
                                 data=json.dumps(body), timeout=10)
        assert response.status_code == 400, (value, response.text)
        message = response.json()["error"]
        assert "INPUT0" in message and datatype in message, message


def _bytes_request(server: ServerProcess, shape: list[int], chunk: bytes) -> requests.Response:
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": shape,
                                     "parameters": {"binary_data_size": len(chunk)}}]}).encode()
    return requests.post(f"{server.base}/v2/models/identity_bytes/infer", data=header + chunk,
                         headers={"Inference-Header-Content-Length": str(len(header))}, timeout=10)


def _element(data: bytes) -> bytes:
    return struct.pack("<I", len(data)) + data


@pytest.mark.parametrize(
    ("shape", "chunk", "fragments"),
    [
        ([1, 2], _element(b"ab") + b"\x01\x00", ("INPUT0", "truncated", "length prefix")),
        ([1, 2], _element(b"ab") + struct.pack("<I", 100) + b"short", ("INPUT0", "100 bytes")),
        ([1, 3], _element(b"ab") + _element(b"cd"), ("INPUT0", "2 BYTES elements", "3")),
        ([1, 1], _element(b"ab") + _element(b"cd"), ("INPUT0", "2 BYTES elements", "1")),
    ],
    ids=["truncated-prefix", "element-overruns", "too-few-elements", "too-many-elements"],
)
def test_malformed_bytes_binary_is_rejected(
    server: ServerProcess, shape: list[int], chunk: bytes, fragments: tuple[str, ...]
) -> None:
    response = _bytes_request(server, shape, chunk)
    assert response.status_code == 400, response.text
    message = response.json()["error"]
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    good = _element("ok ✓".encode()) + _element(b"")
    response = _bytes_request(server, [1, 2], good)
    assert response.status_code == 200, response.text
