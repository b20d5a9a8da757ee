"""modelhost.client against a real modelhost server: answers, splitting, deadlines, errors; HTTP and gRPC,
sync and asyncio."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton_http

from modelhost.client import AsyncClient, Client, ClientError, DeadlineExceeded, RetryPolicy
from tests.onnx_models import loop_iterations_for, scale_model, slow_loop_config, slow_loop_model, write_model
from tests.server import ServerProcess

PROTOCOLS = ["http", "grpc"]
S = 64  # the slow model's X is [batch, S, S]
BLOCK_SECONDS = 0.4


def address(server: ServerProcess, protocol: str) -> str:
    return f"grpc://{server.grpc_url}" if protocol == "grpc" else f"http://{server.url}"


def infer(protocol_client: tuple[str, bool], server: ServerProcess, model: str, inputs: dict[str, np.ndarray],
          **options: Any) -> dict[str, np.ndarray]:
    """One call through the sync or the async client."""
    protocol, use_async = protocol_client
    if not use_async:
        with Client(address(server, protocol)) as client:
            return client.infer(model, inputs, **options)

    async def call() -> dict[str, np.ndarray]:
        async with AsyncClient(address(server, protocol)) as client:
            return await client.infer(model, inputs, **options)

    return asyncio.run(call())


@pytest.fixture(params=[(p, a) for p in PROTOCOLS for a in (False, True)],
                ids=lambda p: f"{p[0]}-{'async' if p[1] else 'sync'}")
def flavour(request: pytest.FixtureRequest) -> tuple[str, bool]:
    return request.param  # type: ignore[no-any-return]


def features(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 1000), dtype=np.float32)


# --------------------------------------------------------------------------- the example server's rank model


def test_answers_equal_tritonclients(example_server: ServerProcess, flavour: tuple[str, bool]) -> None:
    x = features(500)
    reference = triton_http.InferenceServerClient(example_server.url)
    tensor = triton_http.InferInput("features", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    expected = reference.infer("rank", [tensor]).as_numpy("score")
    answer = infer(flavour, example_server, "rank", {"features": x}, split=1)
    assert list(answer) == ["score"]
    np.testing.assert_array_equal(answer["score"], expected)


def test_split_answers_equal_whole_ones(example_server: ServerProcess, flavour: tuple[str, bool]) -> None:
    x = features(500, seed=1)
    whole = infer(flavour, example_server, "rank", {"features": x}, split=1)["score"]
    for parts in (2, 7):
        np.testing.assert_array_equal(infer(flavour, example_server, "rank", {"features": x}, split=parts)["score"],
                                      whole)


def test_requests_past_max_batch_size_are_split_by_the_config(example_server: ServerProcess,
                                                              flavour: tuple[str, bool]) -> None:
    x = features(2100, seed=2)  # rank's max_batch_size is 1024: three parts
    answer = infer(flavour, example_server, "rank", {"features": x})["score"]
    assert answer.shape == (2100, 1)
    np.testing.assert_array_equal(answer[:500], infer(flavour, example_server, "rank", {"features": x[:500]},
                                                      split=1)["score"])
    with pytest.raises(ClientError, match="1024"):  # sent whole, the server refuses it
        infer(flavour, example_server, "rank", {"features": x}, split=1)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_input_gets_the_servers_message(example_server: ServerProcess, protocol: str) -> None:
    with Client(address(example_server, protocol)) as client:
        with pytest.raises(ClientError) as wrong_name:
            client.infer("rank", {"feature": features(2)})
        assert wrong_name.value.status == (400 if protocol == "http" else "INVALID_ARGUMENT")
        assert "feature" in wrong_name.value.message
        with pytest.raises(ClientError) as wrong_type:
            client.infer("rank", {"features": features(2).astype(np.float64)})
        assert "FP64" in wrong_type.value.message and "FP32" in wrong_type.value.message
        with pytest.raises(ClientError) as unknown:
            client.infer("no_such_model", {"features": features(2)})
        assert unknown.value.status == (404 if protocol == "http" else "NOT_FOUND")
        assert "no_such_model" in unknown.value.message
        np.testing.assert_array_equal(client.infer("rank", {"features": features(3)})["score"].shape, (3, 1))


def test_json_tensors_equal_binary_ones(example_server: ServerProcess) -> None:
    x = features(20, seed=3)
    with Client(example_server.url, binary=False) as json_client, Client(example_server.url) as binary_client:
        as_json = json_client.infer("rank", {"features": x})["score"]
        np.testing.assert_allclose(as_json, binary_client.infer("rank", {"features": x})["score"], rtol=1e-6)


def test_threads_share_one_client(example_server: ServerProcess) -> None:
    with Client(example_server.url) as client, ThreadPoolExecutor(8) as pool:
        inputs = [features(50, seed=i) for i in range(32)]
        answers = list(pool.map(lambda x: client.infer("rank", {"features": x})["score"], inputs))
        for x, answer in zip(inputs, answers):
            np.testing.assert_array_equal(answer, client.infer("rank", {"features": x})["score"])


# --------------------------------------------------------------------------- a server of its own: slow models


@dataclass
class Served:
    server: ServerProcess
    block_iterations: int  # ITERATIONS that hold the slow model's one instance ~BLOCK_SECONDS


SCALE_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    repo: Path = tmp_path_factory.mktemp("client_repo")
    write_model(repo, "slow", slow_loop_model(S, batched=True), slow_loop_config(S, max_batch_size=4,
                                                                                  extra="dynamic_batching { }"))
    write_model(repo, "scale", scale_model(3.0), SCALE_CONFIG)
    target = 'parameters { key: "target_p99_ms" value: { string_value: "100" } }'
    write_model(repo, "targeted", slow_loop_model(S, batched=True), slow_loop_config(S, max_batch_size=1,
                                                                                      extra=target))
    server = ServerProcess(repo, "--model-control-mode", "explicit", "--load-model", "*").wait_ready()
    try:
        with Client(server.url) as client:
            iterations = loop_iterations_for(BLOCK_SECONDS, lambda n: slow_call(client, n))
        yield Served(server, iterations)
    finally:
        server.stop()


def slow_call(client: Client, iterations: int, **options: Any) -> dict[str, np.ndarray]:
    x = np.zeros((1, S, S), np.float32)
    return client.infer("slow", {"X": x, "ITERATIONS": np.array([[iterations]], np.int64)}, **options)


def executions(client: Client, model: str) -> tuple[int, int]:
    stats = client.statistics(model)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_late_request_is_dropped_by_the_server_not_run(served: Served, protocol: str) -> None:
    with Client(address(served.server, protocol)) as client, ThreadPoolExecutor(1) as pool:
        before = executions(client, "slow")
        blocker = pool.submit(slow_call, client, served.block_iterations)
        time.sleep(0.1)  # the blocker holds the one instance; the next request queues behind it
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            slow_call(client, 5, timeout=0.15)
        assert time.monotonic() - started < BLOCK_SECONDS  # answered at its deadline, not after the blocker
        blocker.result(timeout=30)
        time.sleep(0.3)
        assert executions(client, "slow") == (before[0] + 1, before[1] + 1)  # only the blocker ran


def test_async_deadline_drops_the_request_too(served: Served) -> None:
    async def scenario() -> None:
        async with AsyncClient(served.server.url) as client:
            x = np.zeros((1, S, S), np.float32)
            blocker = asyncio.ensure_future(client.infer(
                "slow", {"X": x, "ITERATIONS": np.array([[served.block_iterations]], np.int64)}))
            await asyncio.sleep(0.1)
            with pytest.raises(DeadlineExceeded):
                await client.infer("slow", {"X": x, "ITERATIONS": np.array([[5]], np.int64)}, timeout=0.15)
            await blocker

    with Client(served.server.url) as client:
        before = executions(client, "slow")
        asyncio.run(scenario())
        time.sleep(0.3)
        assert executions(client, "slow") == (before[0] + 1, before[1] + 1)


def test_split_follows_the_models_instances(served: Served, flavour: tuple[str, bool]) -> None:
    x = np.arange(300 * 4, dtype=np.float32).reshape(300, 4)
    with Client(served.server.url) as client:
        before = executions(client, "scale")[1]
        np.testing.assert_array_equal(infer(flavour, served.server, "scale", {"INPUT0": x}, split=None)["OUTPUT0"],
                                      x * 3)
        # max_batch_size 8: at least 38 parts of at most 8 rows, each one execution (or fewer, batched)
        assert executions(client, "scale")[1] > before


def test_load_with_a_config_override_and_the_client_rereads_it(served: Served) -> None:
    x = np.ones((40, 4), np.float32)
    with Client(served.server.url) as client:
        assert client.model_config("scale")["max_batch_size"] == 8
        override = SCALE_CONFIG.replace("max_batch_size: 8", "max_batch_size: 64")
        client.load_model("scale", config=_pbtxt_to_json(override))
        try:
            assert client.model_config("scale")["max_batch_size"] == 64
            before = executions(client, "scale")[1]
            client.infer("scale", {"INPUT0": x})  # 40 rows fit now: one part
            assert executions(client, "scale")[1] == before + 1
        finally:
            client.load_model("scale", config=_pbtxt_to_json(SCALE_CONFIG))


def _pbtxt_to_json(text: str) -> dict[str, Any]:
    from google.protobuf import json_format, text_format

    from modelhost.config.model_config_pb2 import ModelConfig

    return json_format.MessageToDict(text_format.Parse(text, ModelConfig()), preserving_proto_field_name=True)


def test_a_latency_target_refuses_what_it_cannot_answer_in_time_and_the_client_retries(served: Served) -> None:
    import requests

    iterations = max(served.block_iterations // 20, 100)  # ~30 ms an execution against a 100 ms target
    x = np.zeros((1, S, S), np.float32)
    inputs = {"X": x, "ITERATIONS": np.array([[iterations]], np.int64)}
    once = Client(served.server.url, retry=RetryPolicy(attempts=1))
    with Client(served.server.url, retry=RetryPolicy(attempts=10)) as warming:
        for _ in range(5):  # the target learns the model's execution time (on a loaded box it may refuse one)
            warming.infer("targeted", inputs)
    with ThreadPoolExecutor(12) as pool:
        outcomes = list(pool.map(lambda _: _outcome(once, inputs), range(12)))
    refused = [o for o in outcomes if isinstance(o, ClientError)]
    assert refused and len(refused) < 12, outcomes
    assert all(e.status == 503 and e.retry_after is not None and "p99 target of 100 ms" in e.message
               for e in refused)
    metrics = requests.get(f"http://127.0.0.1:{served.server.metrics_port}/metrics", timeout=10).text
    assert 'modelhost_target_p99_seconds{model="targeted",version="1"} 0.1' in metrics
    assert 'modelhost_target_refused{model="targeted",version="1"}' in metrics
    with Client(served.server.url, retry=RetryPolicy(attempts=10)) as retrying, ThreadPoolExecutor(12) as pool:
        assert all(isinstance(o, dict) for o in pool.map(lambda _: _outcome(retrying, inputs), range(12)))
    once.close()


def _outcome(client: Client, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray] | ClientError:
    try:
        return client.infer("targeted", inputs)
    except ClientError as exc:
        return exc
