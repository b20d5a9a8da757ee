"""Triton's system shared memory extension, spoken by tritonclient (HTTP and gRPC) with its own
tritonclient.utils.shared_memory helpers: register, status, unregister, inputs and outputs in regions, and what
a hostile client on the same host can try (keys that are paths, offsets and sizes outside the object, a region
shrunk after registration). One server with --allow-client-shm for the module; the session's example server
(flag off) answers the flag's error.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.onnx_models import (
    ADD_SUB_CONFIG,
    add_sub_model,
    loop_iterations_for,
    slow_loop_config,
    slow_loop_model,
    write_model,
)
from tests.server import ServerProcess, in_progress, pending, wait_for

BATCH, WIDTH = 2, 16
TENSOR_BYTES = BATCH * WIDTH * 4
MAX_REGIONS = 6
SLOW = 16  # the slow model's X is [batch, SLOW, SLOW]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("shm_repo")
    write_model(repo, "simple", add_sub_model(), ADD_SUB_CONFIG)
    write_model(repo, "slow", slow_loop_model(SLOW, True), slow_loop_config(SLOW, 4))
    process = ServerProcess(repo, "--allow-client-shm", "--client-shm-max-regions", str(MAX_REGIONS))
    try:
        yield process.wait_ready()
    finally:
        process.stop()


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    with httpclient.InferenceServerClient(server.url, network_timeout=30.0) as client:
        yield client


@pytest.fixture(scope="module")
def grpc_client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        yield client


@pytest.fixture(autouse=True)
def empty_registry(http: httpclient.InferenceServerClient) -> Iterator[None]:
    """Every test leaves the server with no region registered."""
    yield
    http.unregister_system_shared_memory()


@pytest.fixture
def regions() -> Iterator[list[shm.SharedMemoryRegion]]:
    made: list[shm.SharedMemoryRegion] = []
    yield made
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def _region(made: list[shm.SharedMemoryRegion], byte_size: int) -> tuple[shm.SharedMemoryRegion, str, str]:
    """A new shared memory object of `byte_size` bytes: (handle, region name, key)."""
    name = f"r{uuid.uuid4().hex[:10]}"
    handle = shm.create_shared_memory_region(name, "/" + name, byte_size, create_only=True)
    made.append(handle)
    return handle, name, "/" + name


def _operands() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    return (rng.standard_normal((BATCH, WIDTH)).astype(np.float32),
            rng.standard_normal((BATCH, WIDTH)).astype(np.float32))


def test_metadata_lists_the_extension(http: httpclient.InferenceServerClient) -> None:
    assert "system_shared_memory" in http.get_server_metadata()["extensions"]
    assert "cuda_shared_memory" not in http.get_server_metadata()["extensions"]


def test_http_inputs_and_outputs_in_regions(http: httpclient.InferenceServerClient,
                                            regions: list[shm.SharedMemoryRegion]) -> None:
    a, b = _operands()
    inputs_handle, inputs_name, inputs_key = _region(regions, 2 * TENSOR_BYTES)
    outputs_handle, outputs_name, outputs_key = _region(regions, 2 * TENSOR_BYTES + 64)
    shm.set_shared_memory_region(inputs_handle, [a, b])
    http.register_system_shared_memory(inputs_name, inputs_key, 2 * TENSOR_BYTES)
    http.register_system_shared_memory(outputs_name, outputs_key, 2 * TENSOR_BYTES, offset=64)
    assert sorted(http.get_system_shared_memory_status(), key=lambda s: s["name"]) == sorted([
        {"name": inputs_name, "key": inputs_key, "offset": 0, "byte_size": 2 * TENSOR_BYTES},
        {"name": outputs_name, "key": outputs_key, "offset": 64, "byte_size": 2 * TENSOR_BYTES},
    ], key=lambda s: s["name"])

    inputs = [httpclient.InferInput("INPUT0", [BATCH, WIDTH], "FP32").set_shared_memory(inputs_name, TENSOR_BYTES),
              httpclient.InferInput("INPUT1", [BATCH, WIDTH], "FP32").set_shared_memory(
                  inputs_name, TENSOR_BYTES, offset=TENSOR_BYTES)]
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=True)]
    outputs[0].set_shared_memory(outputs_name, TENSOR_BYTES)
    outputs[1].set_shared_memory(outputs_name, TENSOR_BYTES, offset=TENSOR_BYTES)
    result = http.infer("simple", inputs, outputs=outputs)

    # No data in the body (it is in the region), and no parameters: as Triton, whose C++ client reads
    # binary_data_size from any output that has parameters.
    assert result.get_output("OUTPUT0") == {"name": "OUTPUT0", "datatype": "FP32", "shape": [BATCH, WIDTH]}
    # The region starts 64 bytes into its object: the outputs are there.
    np.testing.assert_allclose(shm.get_contents_as_numpy(outputs_handle, np.float32, [BATCH, WIDTH], 64), a + b)
    np.testing.assert_allclose(
        shm.get_contents_as_numpy(outputs_handle, np.float32, [BATCH, WIDTH], 64 + TENSOR_BYTES), a - b)

    http.unregister_system_shared_memory(inputs_name)
    assert [s["name"] for s in http.get_system_shared_memory_status()] == [outputs_name]
    with pytest.raises(InferenceServerException, match=f"no shared memory region '{inputs_name}'"):
        http.get_system_shared_memory_status(inputs_name)
    http.unregister_system_shared_memory(inputs_name)  # unknown: no error, as Triton


def test_grpc_register_status_infer_unregister(grpc_client: grpcclient.InferenceServerClient,
                                               regions: list[shm.SharedMemoryRegion]) -> None:
    a, b = _operands()
    handle, name, key = _region(regions, TENSOR_BYTES)
    out_handle, out_name, out_key = _region(regions, TENSOR_BYTES)
    shm.set_shared_memory_region(handle, [a])
    grpc_client.register_system_shared_memory(name, key, TENSOR_BYTES)
    grpc_client.register_system_shared_memory(out_name, out_key, TENSOR_BYTES)
    status = grpc_client.get_system_shared_memory_status(name, as_json=True)
    assert status["regions"][name] == {"name": name, "key": key, "byte_size": str(TENSOR_BYTES)}

    # INPUT0 in a region, INPUT1 in raw_input_contents; OUTPUT0 into a region, OUTPUT1 in the response.
    inputs = [grpcclient.InferInput("INPUT0", [BATCH, WIDTH], "FP32"),
              grpcclient.InferInput("INPUT1", [BATCH, WIDTH], "FP32")]
    inputs[0].set_shared_memory(name, TENSOR_BYTES)
    inputs[1].set_data_from_numpy(b)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory(out_name, TENSOR_BYTES)
    result = grpc_client.infer("simple", inputs, outputs=outputs)

    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b)
    np.testing.assert_allclose(shm.get_contents_as_numpy(out_handle, np.float32, [BATCH, WIDTH]), a + b)

    grpc_client.unregister_system_shared_memory(name)
    assert list(grpc_client.get_system_shared_memory_status(as_json=True).get("regions", {})) == [out_name]
    with pytest.raises(InferenceServerException, match="no shared memory region") as caught:
        grpc_client.get_system_shared_memory_status(name)
    assert caught.value.status() == str(grpc.StatusCode.NOT_FOUND)


@pytest.mark.parametrize(("key", "offset", "byte_size", "problem"), [
    ("../etc/passwd", 0, 16, "not the name of a shared memory object"),
    ("/a/b", 0, 16, "not the name of a shared memory object"),
    ("/..", 0, 16, "not the name of a shared memory object"),
    ("/x\u0000y", 0, 16, "not the name of a shared memory object"),
    (None, 0, 16, "Unable to open shared memory region"),  # a key no object has
    ("SELF", 4096, 1, "run past the end"),  # offset past the object's end
    ("SELF", 8, 4096, "run past the end"),  # size past the end
    ("SELF", 2**64 - 1, 16, "run past the end"),  # their sum past 64 bits
    ("SELF", 0, 0, "at least 1"),
    ("/triton_python_backend_shm_region_x", 0, 16, "reserved prefix 'triton_python_backend_shm_region_'"),
    ("///", 0, 16, "invalid shm key '///'"),
])
def test_hostile_registration(http: httpclient.InferenceServerClient, regions: list[shm.SharedMemoryRegion],
                              key: str | None, offset: int, byte_size: int, problem: str) -> None:
    _, name, own_key = _region(regions, 4096)
    key = own_key if key == "SELF" else f"/missing-{uuid.uuid4().hex}" if key is None else key
    with pytest.raises(InferenceServerException, match=problem) as caught:
        http.register_system_shared_memory(name, key, byte_size, offset)
    assert caught.value.status() == "400"
    assert http.get_system_shared_memory_status() == []  # nothing registered, the server serves on


def test_symlink_in_dev_shm_is_refused(http: httpclient.InferenceServerClient, tmp_path: Path) -> None:
    target = tmp_path / "secret"
    target.write_bytes(b"x" * 64)
    link = Path("/dev/shm") / f"link-{uuid.uuid4().hex}"
    link.symlink_to(target)
    try:
        with pytest.raises(InferenceServerException, match="cannot open the shared memory object"):
            http.register_system_shared_memory("link", "/" + link.name, 64)
    finally:
        link.unlink()


@pytest.mark.parametrize(("offset", "byte_size", "problem"), [
    (TENSOR_BYTES, TENSOR_BYTES, "Invalid offset for shared memory region"),  # past the region's end
    (2**62, TENSOR_BYTES, "Invalid offset for shared memory region"),
    (4, TENSOR_BYTES, "Invalid offset \\+ byte size for shared memory region"),
    (0, TENSOR_BYTES - 4, "input byte size mismatch for input .INPUT0. for model .simple.\\. Expected 128, got 124"),
])
def test_hostile_input_offsets(http: httpclient.InferenceServerClient, regions: list[shm.SharedMemoryRegion],
                               offset: int, byte_size: int, problem: str) -> None:
    _, name, key = _region(regions, TENSOR_BYTES)
    http.register_system_shared_memory(name, key, TENSOR_BYTES)
    a, b = _operands()
    inputs = [httpclient.InferInput("INPUT0", [BATCH, WIDTH], "FP32").set_shared_memory(name, byte_size, offset),
              httpclient.InferInput("INPUT1", [BATCH, WIDTH], "FP32").set_data_from_numpy(b)]
    with pytest.raises(InferenceServerException, match=problem) as caught:
        http.infer("simple", inputs)
    assert caught.value.status() == "400"
    assert "INPUT0" in str(caught.value)


def test_output_region_too_small_or_unknown(http: httpclient.InferenceServerClient,
                                            regions: list[shm.SharedMemoryRegion]) -> None:
    _, name, key = _region(regions, TENSOR_BYTES)
    http.register_system_shared_memory(name, key, TENSOR_BYTES)
    a, b = _operands()
    inputs = [httpclient.InferInput("INPUT0", [BATCH, WIDTH], "FP32").set_data_from_numpy(a),
              httpclient.InferInput("INPUT1", [BATCH, WIDTH], "FP32").set_data_from_numpy(b)]
    small = httpclient.InferRequestedOutput("OUTPUT0")
    small.set_shared_memory(name, TENSOR_BYTES // 2)
    with pytest.raises(InferenceServerException, match="more than its shared_memory_byte_size"):
        http.infer("simple", inputs, outputs=[small])
    unknown = httpclient.InferRequestedOutput("OUTPUT0")
    unknown.set_shared_memory("nobody", TENSOR_BYTES)
    with pytest.raises(InferenceServerException, match="no shared memory region 'nobody'") as caught:
        http.infer("simple", inputs, outputs=[unknown])
    assert caught.value.status() == "404"


def test_region_shrunk_after_registration(http: httpclient.InferenceServerClient,
                                          regions: list[shm.SharedMemoryRegion]) -> None:
    handle, name, key = _region(regions, 2 * TENSOR_BYTES)
    http.register_system_shared_memory(name, key, 2 * TENSOR_BYTES)
    os.truncate(Path("/dev/shm") / key.lstrip("/"), 0)  # the hostile client shrinks its object
    a, b = _operands()
    inputs = [httpclient.InferInput("INPUT0", [BATCH, WIDTH], "FP32").set_shared_memory(name, TENSOR_BYTES),
              httpclient.InferInput("INPUT1", [BATCH, WIDTH], "FP32").set_data_from_numpy(b)]
    with pytest.raises(InferenceServerException, match="shrank after registration") as caught:
        http.infer("simple", inputs)
    assert caught.value.status() == "400"
    assert http.is_server_live()  # no SIGBUS


def test_duplicate_and_too_many_regions(http: httpclient.InferenceServerClient,
                                        regions: list[shm.SharedMemoryRegion]) -> None:
    _, name, key = _region(regions, 64)
    http.register_system_shared_memory(name, key, 64)
    with pytest.raises(InferenceServerException, match="already in manager") as caught:
        http.register_system_shared_memory(name, key, 64)
    assert caught.value.status() == "409"
    for index in range(MAX_REGIONS - 1):
        http.register_system_shared_memory(f"{name}-{index}", key, 64)
    with pytest.raises(InferenceServerException, match=f"{MAX_REGIONS} regions are registered") as caught:
        http.register_system_shared_memory(f"{name}-more", key, 64)
    assert caught.value.status() == "413"


def test_cuda_shared_memory_has_no_gpu(http: httpclient.InferenceServerClient,
                                       grpc_client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match="no GPU support") as caught:
        http.register_cuda_shared_memory("gpu", "aGFuZGxl", 0, 64)
    assert caught.value.status() == "501"
    with pytest.raises(InferenceServerException, match="no GPU support") as caught:
        grpc_client.register_cuda_shared_memory("gpu", b"aGFuZGxl", 0, 64)
    assert caught.value.status() == str(grpc.StatusCode.UNIMPLEMENTED)
    assert http.get_cuda_shared_memory_status() == []
    http.unregister_cuda_shared_memory()


def test_flag_off_names_the_flag(example_server: ServerProcess) -> None:
    answer = requests.post(f"{example_server.base}/v2/systemsharedmemory/region/r/register",
                           json={"key": "/r", "offset": 0, "byte_size": 64}, timeout=10)
    assert answer.status_code == 400
    assert "--allow-client-shm" in answer.json()["error"]
    client = httpclient.InferenceServerClient(example_server.url)
    features = httpclient.InferInput("features", [1, 1], "FP32").set_shared_memory("r", 4)
    with pytest.raises(InferenceServerException, match="--allow-client-shm"):
        client.infer("rank", [features])
    assert client.get_system_shared_memory_status() == []


def test_grpc_hostile_key_and_offset(grpc_client: grpcclient.InferenceServerClient,
                                     regions: list[shm.SharedMemoryRegion]) -> None:
    with pytest.raises(InferenceServerException, match="not the name of a shared memory object") as caught:
        grpc_client.register_system_shared_memory("up", "../../etc/passwd", 16)
    assert caught.value.status() == str(grpc.StatusCode.INVALID_ARGUMENT)
    _, name, key = _region(regions, TENSOR_BYTES)
    grpc_client.register_system_shared_memory(name, key, TENSOR_BYTES)
    inputs = [grpcclient.InferInput("INPUT0", [BATCH, WIDTH], "FP32"),
              grpcclient.InferInput("INPUT1", [BATCH, WIDTH], "FP32")]
    inputs[0].set_shared_memory(name, TENSOR_BYTES, offset=2**63 - 1)
    inputs[1].set_shared_memory(name, TENSOR_BYTES)
    with pytest.raises(InferenceServerException, match="Invalid offset for shared memory region") as caught:
        grpc_client.infer("simple", inputs)
    assert caught.value.status() == str(grpc.StatusCode.INVALID_ARGUMENT)


@pytest.mark.parametrize(("parameters", "problem"), [
    ({"shared_memory_region": "r", "shared_memory_byte_size": "128"}, "shared_memory_byte_size must be a non-negative"),
    ({"shared_memory_region": "r", "shared_memory_byte_size": 128, "shared_memory_offset": -8},
     "shared_memory_offset must be a non-negative"),
    ({"shared_memory_region": "r"}, "sets no shared_memory_byte_size"),
    ({"shared_memory_region": 7, "shared_memory_byte_size": 128}, "must be the name of a registered region"),
])
def test_malformed_region_parameters(server: ServerProcess, parameters: dict[str, object], problem: str) -> None:
    def tensor(name: str, **fields: object) -> dict[str, object]:
        return {"name": name, "datatype": "FP32", "shape": [BATCH, WIDTH], **fields}

    in_region = {"inputs": [tensor("INPUT0", parameters=parameters), tensor("INPUT1", data=[0.0] * 32)]}
    into_region = {"inputs": [tensor("INPUT0", data=[0.0] * 32), tensor("INPUT1", data=[0.0] * 32)],
                   "outputs": [{"name": "OUTPUT0", "parameters": parameters}]}
    for body in (in_region, into_region):
        answer = requests.post(f"{server.base}/v2/models/simple/infer", json=body, timeout=10)
        assert answer.status_code == 400
        assert problem in answer.json()["error"]


def test_an_input_with_data_and_a_region_is_refused(server: ServerProcess) -> None:
    # Triton refuses an input that names a region and carries data too, rather than pick one.
    region = {"shared_memory_region": "r", "shared_memory_byte_size": TENSOR_BYTES}
    other = {"name": "INPUT1", "datatype": "FP32", "shape": [BATCH, WIDTH], "data": [0.0] * (BATCH * WIDTH)}
    json_data = {"inputs": [{**other, "name": "INPUT0", "parameters": region}, other]}
    answer = requests.post(f"{server.base}/v2/models/simple/infer", json=json_data, timeout=10)
    assert answer.status_code == 400 and "also carries data" in answer.json()["error"]

    header = json.dumps({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [BATCH, WIDTH],
         "parameters": {**region, "binary_data_size": TENSOR_BYTES}}, other]}).encode()
    answer = requests.post(f"{server.base}/v2/models/simple/infer", data=header + bytes(TENSOR_BYTES), timeout=10,
                           headers={"Inference-Header-Content-Length": str(len(header))})
    assert answer.status_code == 400 and "also carries data" in answer.json()["error"]


def steady(predicate: Callable[[], bool], what: str, hold: float = 0.2, timeout: float = 10.0) -> None:
    """Wait until `predicate` has held for `hold` seconds on end."""
    deadline = time.monotonic() + timeout
    since = None
    while time.monotonic() < deadline:
        if not predicate():
            since = None
        elif since is None:
            since = time.monotonic()
        elif time.monotonic() - since >= hold:
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_unregister_while_a_request_holds_its_view(server: ServerProcess, http: httpclient.InferenceServerClient,
                                                   regions: list[shm.SharedMemoryRegion]) -> None:
    x = np.arange(SLOW * SLOW, dtype=np.float32).reshape(1, SLOW, SLOW)
    handle, name, key = _region(regions, x.nbytes)
    shm.set_shared_memory_region(handle, [x])
    http.register_system_shared_memory(name, key, x.nbytes)

    def body(iterations: int, x_entry: dict[str, object]) -> dict[str, object]:
        return {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, SLOW, SLOW], **x_entry},
                           {"name": "ITERATIONS", "datatype": "INT64", "shape": [1, 1], "data": [iterations]}]}

    url = f"{server.base}/v2/models/slow/infer"
    zeros = {"data": [0.0] * (SLOW * SLOW)}
    blocker = body(loop_iterations_for(1.5, lambda n: requests.post(url, json=body(n, zeros), timeout=60)), zeros)
    with ThreadPoolExecutor(2) as pool:
        # The model's one instance runs the blocker: the server has it and has not queued it, for longer than its
        # decoding on the loop could take (its instance thread may be slow to wake on a busy machine, so a queue of
        # one is not yet proof that it runs). Then the shm request waits in the queue, decoded, holding its view.
        running = pool.submit(requests.post, url, json=blocker, timeout=60)
        steady(lambda: (in_progress(server), pending(server, "slow")) == (1, 0), "the blocker to run")
        held = pool.submit(requests.post, url, json=body(1, {"parameters": {
            "shared_memory_region": name, "shared_memory_byte_size": x.nbytes}}), timeout=60)
        wait_for(lambda: pending(server, "slow") == 1, 10, "the shm request to queue")
        http.unregister_system_shared_memory(name)  # the region goes; its mapping stays with the request
        assert http.get_system_shared_memory_status() == []
        answer = held.result()
        assert running.result().status_code == 200
    assert answer.status_code == 200, answer.text
    np.testing.assert_array_equal(np.array(answer.json()["outputs"][0]["data"]).reshape(x.shape), x + 1)
