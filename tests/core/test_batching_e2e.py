"""Dynamic batching end to end: a real server, real clients, ONNX models from tests/onnx_models.py.

One server (module scope) serves three models:
- `batching`: the add/sub model, max_batch_size 16, a 2 ms queue delay, one instance;
- `queue1`: a slow model (a Loop of MatMuls whose trip count each request sets), max_queue_size 1;
- `queued`: the same slow model with two priority levels and allow_timeout_override.
A slow request holds the single instance busy so that later requests queue; the queue depth is
read from the metrics endpoint (nv_inference_pending_request_count), so waits are on events,
bounded, and sleeps short.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import requests
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.onnx_models import (
    ADD_SUB_CONFIG,
    add_sub_model,
    loop_iterations_for,
    slow_loop_config,
    slow_loop_model,
    write_model,
)
from tests.server import ServerProcess, pending, wait_for

S = 64  # the slow model's X is [batch, S, S]; each loop iteration is a batched S^3 MatMul
BLOCK_SECONDS = 0.5  # how long a blocking request holds the slow model's instance

BATCHING_CONFIG = ADD_SUB_CONFIG.replace("max_batch_size: 8", "max_batch_size: 16") + """
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching { max_queue_delay_microseconds: 2000 }
"""

SLOW_CONFIG = slow_loop_config(S, max_batch_size=4, extra="dynamic_batching { %s }")
QUEUE1 = "default_queue_policy { max_queue_size: 1 }"
QUEUED = "priority_levels: 2 default_priority_level: 2 default_queue_policy { allow_timeout_override: true }"


@dataclass
class Served:
    server: ServerProcess
    add_sub: ort.InferenceSession  # the reference, in process
    block_iterations: int  # ITERATIONS that hold the slow instance ~BLOCK_SECONDS


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    repo: Path = tmp_path_factory.mktemp("batching_repo")
    add_sub = add_sub_model()
    write_model(repo, "batching", add_sub, BATCHING_CONFIG)
    write_model(repo, "queue1", slow_loop_model(S, batched=True), SLOW_CONFIG % QUEUE1)
    write_model(repo, "queued", slow_loop_model(S, batched=True), SLOW_CONFIG % QUEUED)
    server = ServerProcess(repo).wait_ready()
    try:
        # Calibrate on the server itself: what it costs per loop iteration, there, now.
        x = np.zeros((1, S, S), np.float32)

        def run(n: int) -> None:
            assert infer_slow(server, "queued", x, n).status_code == 200

        iterations = loop_iterations_for(BLOCK_SECONDS, run)
        session = ort.InferenceSession(add_sub.SerializeToString(), providers=["CPUExecutionProvider"])
        yield Served(server, session, iterations)
    finally:
        server.stop()


# --------------------------------------------------------------------------- helpers


def slow_body(x: np.ndarray, iterations: int, parameters: dict[str, Any] | None = None) -> bytes:
    document: dict[str, Any] = {"inputs": [
        {"name": "X", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()},
        {"name": "ITERATIONS", "datatype": "INT64", "shape": [len(x), 1], "data": [iterations] * len(x)},
    ]}
    if parameters is not None:
        document["parameters"] = parameters
    return json.dumps(document).encode()


def infer_slow(server: ServerProcess, model: str, x: np.ndarray, iterations: int,
               parameters: dict[str, Any] | None = None) -> requests.Response:
    return requests.post(f"{server.base}/v2/models/{model}/infer", data=slow_body(x, iterations, parameters),
                         headers={"Content-Type": "application/json"}, timeout=20)


def slow_result(response: requests.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    assert output["name"] == "Y" and output["datatype"] == "FP32"
    return np.array(output["data"], np.float32).reshape(output["shape"])


def unique_x(tag: int, rows: int = 1) -> np.ndarray:
    return np.full((rows, S, S), float(tag), np.float32) + np.arange(S, dtype=np.float32) / 128


def model_stats(server: ServerProcess, model: str) -> dict[str, Any]:
    response = requests.get(f"{server.base}/v2/models/{model}/stats", timeout=5)
    assert response.status_code == 200, response.text
    (stat,) = response.json()["model_stats"]
    return stat


def counts(server: ServerProcess, model: str) -> tuple[int, int]:
    stat = model_stats(server, model)
    return stat["execution_count"], stat["inference_count"]


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(8) as executor:
        yield executor


def block(pool: ThreadPoolExecutor, served: Served, model: str) -> Future[requests.Response]:
    """Start a request that holds `model`'s only instance ~BLOCK_SECONDS; return once it runs (not queued)."""
    future = pool.submit(infer_slow, served.server, model, unique_x(99), served.block_iterations)
    time.sleep(0.05)  # it reaches the server and the idle instance takes it
    assert not future.done(), "the blocking request finished already: calibration is off"
    # On a busy machine the instance thread (below the event loop's priority) may take a moment to start it.
    wait_for(lambda: pending(served.server, model) == 0, timeout=BLOCK_SECONDS / 2, what="the blocking request to run")
    return future


# --------------------------------------------------------------------------- batching under load


THREADS = 32
PER_THREAD = 20


def test_batches_form_under_concurrency_and_every_caller_gets_its_own_outputs(served: Served) -> None:
    server = served.server
    stats_client = httpclient.InferenceServerClient(server.url)
    before = stats_client.get_inference_statistics(model_name="batching")["model_stats"][0]
    rows_sent = [0] * THREADS
    failures: list[str] = []
    start = threading.Barrier(THREADS)

    def check(a: np.ndarray, b: np.ndarray, out0: np.ndarray, out1: np.ndarray) -> None:
        want0, want1 = served.add_sub.run(None, {"INPUT0": a, "INPUT1": b})
        np.testing.assert_array_equal(out0, want0)
        np.testing.assert_array_equal(out1, want1)

    def caller(index: int) -> None:
        rng = np.random.default_rng(index)
        client = httpclient.InferenceServerClient(server.url, network_timeout=20) if index % 2 == 0 else None
        session = requests.Session()
        try:
            start.wait(timeout=10)
            for i in range(PER_THREAD):
                rows = int(rng.integers(1, 4))
                a = (index * 1000 + i * 10 + np.arange(rows * 16) / 64).reshape(rows, 16).astype(np.float32)
                b = rng.standard_normal((rows, 16)).astype(np.float32)
                if client is not None:  # tritonclient, binary tensors
                    inputs = [httpclient.InferInput("INPUT0", [rows, 16], "FP32"),
                              httpclient.InferInput("INPUT1", [rows, 16], "FP32")]
                    inputs[0].set_data_from_numpy(a)
                    inputs[1].set_data_from_numpy(b)
                    result = client.infer("batching", inputs)
                    check(a, b, result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1"))
                else:  # requests, JSON tensors
                    body = {"inputs": [
                        {"name": "INPUT0", "datatype": "FP32", "shape": [rows, 16], "data": a.ravel().tolist()},
                        {"name": "INPUT1", "datatype": "FP32", "shape": [rows, 16], "data": b.ravel().tolist()}]}
                    response = session.post(f"{server.base}/v2/models/batching/infer", json=body, timeout=20)
                    assert response.status_code == 200, response.text
                    outputs = {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"])
                               for o in response.json()["outputs"]}
                    check(a, b, outputs["OUTPUT0"], outputs["OUTPUT1"])
                rows_sent[index] += rows
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(f"caller {index}: {exc!r}")
        finally:
            session.close()
            if client is not None:
                client.close()

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "callers still running after 60 s"
    assert not failures, failures[:5]

    after = stats_client.get_inference_statistics(model_name="batching")["model_stats"][0]
    stats_client.close()
    requests_sent = THREADS * PER_THREAD

    def delta(*path: str) -> int:
        def read(stat: dict[str, Any]) -> int:
            value: Any = stat
            for key in path:
                value = value.get(key, 0) if isinstance(value, dict) else 0
            return int(value)
        return read(after) - read(before)

    assert delta("inference_stats", "success", "count") == requests_sent
    assert delta("inference_stats", "fail", "count") == 0
    assert delta("inference_stats", "queue", "count") == requests_sent
    assert delta("inference_count") == sum(rows_sent)
    executions = delta("execution_count")
    assert 0 < executions <= requests_sent // 2, f"{executions} executions for {requests_sent} requests"

    def batch_counts(stat: dict[str, Any]) -> dict[int, int]:
        return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stat.get("batch_stats", [])}

    old, new = batch_counts(before), batch_counts(after)
    grown = {size: new[size] - old.get(size, 0) for size in new if new[size] != old.get(size, 0)}
    assert sum(grown.values()) == executions
    assert sum(size * n for size, n in grown.items()) == sum(rows_sent)
    assert max(grown) > 3 and max(grown) <= 16, grown  # real batches, never above max_batch_size


# --------------------------------------------------------------------------- statistics JSON


MODEL_STAT_KEYS = {"name", "version", "last_inference", "inference_count", "execution_count", "inference_stats",
                   "response_stats", "batch_stats", "memory_usage"}
INFERENCE_STAT_KEYS = {"success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
                       "cache_hit", "cache_miss"}


def check_model_stat(stat: dict[str, Any]) -> None:
    assert set(stat) == MODEL_STAT_KEYS, sorted(stat)
    assert isinstance(stat["version"], str)
    for key in ("last_inference", "inference_count", "execution_count"):
        assert isinstance(stat[key], int) and stat[key] >= 0
    assert set(stat["inference_stats"]) == INFERENCE_STAT_KEYS
    for duration in stat["inference_stats"].values():
        assert set(duration) == {"count", "ns"} and all(isinstance(v, int) and v >= 0 for v in duration.values())
    for batch in stat["batch_stats"]:
        assert set(batch) == {"batch_size", "compute_input", "compute_infer", "compute_output"}
        assert isinstance(batch["batch_size"], int) and batch["batch_size"] >= 1
    assert isinstance(stat["response_stats"], dict) and isinstance(stat["memory_usage"], list)


def test_statistics_have_tritons_shape(served: Served) -> None:
    server = served.server
    x = unique_x(5)
    sent_ms = time.time() * 1000
    np.testing.assert_array_equal(slow_result(infer_slow(server, "queue1", x, 3)), x + 1)
    client = httpclient.InferenceServerClient(server.url)
    try:
        every = client.get_inference_statistics()["model_stats"]
        assert [(s["name"], s["version"]) for s in every] == [("batching", "1"), ("queue1", "1"), ("queued", "1")]
        for stat in every:
            check_model_stat(stat)
        (one,) = client.get_inference_statistics(model_name="queue1")["model_stats"]
        (versioned,) = client.get_inference_statistics(model_name="queue1", model_version="1")["model_stats"]
        for stat in (one, versioned):
            assert stat["name"] == "queue1" and stat["version"] == "1"
            assert stat["inference_count"] >= 1 and stat["execution_count"] >= 1
            assert stat["inference_stats"]["success"]["count"] >= 1 and stat["inference_stats"]["success"]["ns"] > 0
            assert sent_ms - 1000 <= stat["last_inference"] <= time.time() * 1000 + 1000
        with pytest.raises(InferenceServerException) as info:
            client.get_inference_statistics(model_name="nope")
        assert info.value.status() == "404"
        assert "Request for unknown model: 'nope' is not found" in info.value.message()
    finally:
        client.close()
    raw = requests.get(f"{server.base}/v2/models/nope/stats", timeout=5)
    assert raw.status_code == 404 and set(raw.json()) == {"error"}
    everything = requests.get(f"{server.base}/v2/models/stats", timeout=5)
    assert everything.status_code == 200 and set(everything.json()) == {"model_stats"}


# --------------------------------------------------------------------------- queue policy over HTTP


def test_full_queue_is_rejected_at_once_with_503_and_retry_after(served: Served,
                                                                 pool: ThreadPoolExecutor) -> None:
    server = served.server
    before = counts(server, "queue1")
    blocker = block(pool, served, "queue1")
    queued = pool.submit(infer_slow, server, "queue1", unique_x(1), 1)
    wait_for(lambda: pending(server, "queue1") == 1, what="the second request to queue")
    started = time.monotonic()
    overflow = infer_slow(server, "queue1", unique_x(2), 1)
    elapsed = time.monotonic() - started
    assert overflow.status_code == 503, overflow.text
    assert elapsed < BLOCK_SECONDS / 2 and not blocker.done(), "the overflow was not rejected at once"
    retry_after = overflow.headers.get("Retry-After")
    assert retry_after is not None and retry_after.isdigit() and int(retry_after) >= 1, overflow.headers
    assert set(overflow.json()) == {"error"} and "max_queue_size 1" in overflow.json()["error"]
    # the server keeps serving: the running and the queued request complete, and new ones are accepted
    np.testing.assert_array_equal(slow_result(blocker.result(timeout=20)), unique_x(99) + 1)
    np.testing.assert_array_equal(slow_result(queued.result(timeout=20)), unique_x(1) + 1)
    np.testing.assert_array_equal(slow_result(infer_slow(server, "queue1", unique_x(3), 1)), unique_x(3) + 1)
    executions, inferences = counts(server, "queue1")
    assert (executions - before[0], inferences - before[1]) == (3, 3)  # the rejected one never ran


def test_request_timeout_expires_a_queued_request_with_504(served: Served, pool: ThreadPoolExecutor) -> None:
    server = served.server
    before = counts(server, "queued")
    blocker = block(pool, served, "queued")
    started = time.monotonic()
    expired = infer_slow(server, "queued", unique_x(1), 1, parameters={"timeout": 100_000})
    elapsed = time.monotonic() - started
    assert expired.status_code == 504, expired.text
    assert 0.09 <= elapsed < BLOCK_SECONDS and not blocker.done()
    assert set(expired.json()) == {"error"} and "timed out" in expired.json()["error"]
    assert pending(server, "queued") == 0
    slow_result(blocker.result(timeout=20))
    executions, inferences = counts(server, "queued")
    assert (executions - before[0], inferences - before[1]) == (1, 1)  # it never ran


@pytest.mark.parametrize("priority, accepted", [(1, True), (2, True), (0, True), (3, False), (-1, False),
                                                ("high", False), (1.5, False), (True, False)])
def test_priority_parameter_is_checked(served: Served, priority: Any, accepted: bool) -> None:
    x = unique_x(7)
    response = infer_slow(served.server, "queued", x, 1, parameters={"priority": priority})
    if accepted:
        np.testing.assert_array_equal(slow_result(response), x + 1)
    else:
        assert response.status_code == 400, response.text
        assert "priority" in response.json()["error"]


def _disconnect_while_queued(served: Served, pool: ThreadPoolExecutor, reset: bool) -> None:
    server = served.server
    before = counts(server, "queued")
    blocker = block(pool, served, "queued")
    body = slow_body(unique_x(1), 1)
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    try:
        sock.sendall(b"POST /v2/models/queued/infer HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        wait_for(lambda: pending(server, "queued") == 1, what="the request to queue")
        if reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        sock.close()
    try:
        wait_for(lambda: pending(server, "queued") == 0, timeout=BLOCK_SECONDS / 3, what="the request to be dropped")
        assert not blocker.done()
    finally:
        slow_result(blocker.result(timeout=20))
        time.sleep(0.02)  # the gone client's request, were it kept, would be taken and run now
        wait_for(lambda: pending(server, "queued") == 0, what="the queue to empty")
        x = unique_x(2)
        np.testing.assert_array_equal(slow_result(infer_slow(server, "queued", x, 1)), x + 1)  # still serving
    executions, inferences = counts(server, "queued")
    assert (executions - before[0], inferences - before[1]) == (2, 2), "the gone client's request ran"


def test_client_reset_while_queued_drops_its_request(served: Served, pool: ThreadPoolExecutor) -> None:
    _disconnect_while_queued(served, pool, reset=True)


def test_client_close_while_queued_drops_its_request(served: Served, pool: ThreadPoolExecutor) -> None:
    """An ordinary close (FIN, what requests/tritonclient do on a client timeout), not only a reset."""
    _disconnect_while_queued(served, pool, reset=False)


def test_an_empty_request_does_not_break_the_batch_it_joins(served: Served, pool: ThreadPoolExecutor) -> None:
    """A request of batch size 0, queued with another, is batched with it: the other must not fail."""
    server = served.server
    blocker = block(pool, served, "queued")
    empty = pool.submit(infer_slow, server, "queued", np.zeros((0, S, S), np.float32), 1)
    x = unique_x(4, rows=2)
    full = pool.submit(infer_slow, server, "queued", x, 1)
    wait_for(lambda: pending(server, "queued") == 2, what="both requests to queue")
    slow_result(blocker.result(timeout=20))
    response = full.result(timeout=20)
    np.testing.assert_array_equal(slow_result(response), x + 1)
    answer = empty.result(timeout=20)
    if answer.status_code == 200:
        assert slow_result(answer).shape == (0, S, S)
    else:
        assert answer.status_code == 400, answer.text
