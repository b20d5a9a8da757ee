"""KServe V2 over gRPC: errors, queues and deadlines, streams, the aio client, one batch shared with HTTP,
ports, message limits and graceful shutdown (a second server with `--grpc-max-message-bytes 1MiB`)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from modelhost.cli import modelhost_settings
from modelhost.protocols.grpc_server import GrpcOptions, server_options
from tests.onnx_models import (
    ADD_SUB_CONFIG,
    add_sub_model,
    write_model,
)
from tests.protocols.grpc.models import (
    BLOCK_SECONDS,
    UNKNOWN,
    S,
    Served,
    counts,
    grpc_error,
    infer_slow,
    pair,
    simple_inputs,
    slow_inputs,
    unique_x,
)
from tests.server import ServerProcess, free_port, pending, wait_for

# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("shape, datatype", [([1, 15], "FP32"), ([1, 16], "INT32")], ids=["shape", "datatype"])
def test_bad_input_is_invalid_argument_with_the_http_message(client: grpcclient.InferenceServerClient,
                                                             served: Served, shape: list[int], datatype: str) -> None:
    array = np.zeros(shape, np.float32 if datatype == "FP32" else np.int32)
    grpc_inputs = [grpcclient.InferInput(name, shape, datatype).set_data_from_numpy(array)
                   for name in ("INPUT0", "INPUT1")]
    error = grpc_error(lambda: client.infer("simple", grpc_inputs))
    assert error.status() == "StatusCode.INVALID_ARGUMENT" and "INPUT0" in error.message()
    http = httpclient.InferenceServerClient(served.server.url)
    try:
        http_inputs = [httpclient.InferInput(name, shape, datatype).set_data_from_numpy(array)
                       for name in ("INPUT0", "INPUT1")]
        assert error.message() == grpc_error(lambda: http.infer("simple", http_inputs)).message()
    finally:
        http.close()


def test_unknown_model_and_version_are_not_found(client: grpcclient.InferenceServerClient) -> None:
    a, b = pair(3)
    error = grpc_error(lambda: client.infer("nope", simple_inputs(a, b)))
    assert error.status() == "StatusCode.NOT_FOUND" and UNKNOWN in error.message()
    error = grpc_error(lambda: client.infer("simple", simple_inputs(a, b), model_version="9"))
    assert error.status() == "StatusCode.NOT_FOUND" and "simple" in error.message()
    for version in ("²", "٣", "1x", "9" * 5000):  # digits to str.isdigit, or past what int() takes
        error = grpc_error(partial(client.get_model_metadata, "simple", version))
        assert error.status() == "StatusCode.INVALID_ARGUMENT" and "is not a number" in error.message(), version


def block(pool: ThreadPoolExecutor, served: Served) -> Any:
    """Start a gRPC request that holds the slow model's only instance ~BLOCK_SECONDS; return once it runs."""
    client = grpcclient.InferenceServerClient(served.server.grpc_url)
    future = pool.submit(infer_slow, client, unique_x(99), served.block_iterations)
    future.add_done_callback(lambda _: client.close())
    time.sleep(0.05)  # it reaches the server and the idle instance takes it at once
    assert not future.done(), "the blocking request finished already: calibration is off"
    assert pending(served.server, "slow") == 0
    return future


def test_full_queue_is_unavailable_with_retry_after(served: Served, stub: service_pb2_grpc.GRPCInferenceServiceStub
                                                    ) -> None:
    client = served.client
    before = counts(client, "slow")
    with ThreadPoolExecutor(2) as pool:
        blocker = block(pool, served)
        queued = pool.submit(infer_slow, grpcclient.InferenceServerClient(served.server.grpc_url), unique_x(1), 1)
        wait_for(lambda: pending(served.server, "slow") == 1, what="the second request to queue")
        error = grpc_error(lambda: infer_slow(client, unique_x(2), 1))
        assert error.status() == "StatusCode.UNAVAILABLE" and "max_queue_size 1" in error.message()
        request = service_pb2.ModelInferRequest(model_name="slow", raw_input_contents=[
            unique_x(3).tobytes(), np.ones((1, 1), np.int64).tobytes()])
        request.inputs.add(name="X", datatype="FP32", shape=[1, S, S])
        request.inputs.add(name="ITERATIONS", datatype="INT64", shape=[1, 1])
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request, timeout=10)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert ("retry-after", "1") in caught.value.trailing_metadata()
        assert not blocker.done(), "the overflow was not rejected at once"
        np.testing.assert_array_equal(blocker.result(timeout=20), unique_x(99) + 1)
        np.testing.assert_array_equal(queued.result(timeout=20), unique_x(1) + 1)
    executions, inferences = counts(client, "slow")
    assert (executions - before[0], inferences - before[1]) == (2, 2)  # the rejected ones never ran


def test_queue_timeout_is_deadline_exceeded(served: Served) -> None:
    client = served.client
    before = counts(client, "slow")
    with ThreadPoolExecutor(1) as pool:
        blocker = block(pool, served)
        started = time.monotonic()
        error = grpc_error(lambda: infer_slow(client, unique_x(1), 1, timeout=100_000))  # µs, a request parameter
        elapsed = time.monotonic() - started
        assert error.status() == "StatusCode.DEADLINE_EXCEEDED" and "timed out" in error.message()
        assert 0.09 <= elapsed < BLOCK_SECONDS and not blocker.done()
        blocker.result(timeout=20)
    executions, inferences = counts(client, "slow")
    assert (executions - before[0], inferences - before[1]) == (1, 1)


def test_client_deadline_drops_the_queued_request(served: Served) -> None:
    client = served.client
    before = counts(client, "slow")
    with ThreadPoolExecutor(1) as pool:
        blocker = block(pool, served)
        error = grpc_error(lambda: infer_slow(client, unique_x(1), 1, client_timeout=0.15))
        assert error.status() == "StatusCode.DEADLINE_EXCEEDED"
        wait_for(lambda: pending(served.server, "slow") == 0, timeout=BLOCK_SECONDS / 3, what="the drop")
        assert not blocker.done()
        blocker.result(timeout=20)
    time.sleep(0.05)  # the dropped request, were it kept, would be taken and run now
    executions, inferences = counts(client, "slow")
    assert (executions - before[0], inferences - before[1]) == (1, 1), "the expired request ran"
    np.testing.assert_array_equal(infer_slow(client, unique_x(2), 1), unique_x(2) + 1)  # still serving


# --------------------------------------------------------------------------- streaming


def test_stream_answers_requests_in_flight_together_with_their_ids(served: Served) -> None:
    """A slow request first, then fast ones and a bad one: the fast ones are answered while the slow one runs."""
    client = grpcclient.InferenceServerClient(served.server.grpc_url)
    answers: list[tuple[str, Any]] = []
    done = threading.Event()
    expected = 10

    def callback(result: grpcclient.InferResult | None, error: InferenceServerException | None) -> None:
        answers.append(("error", error) if result is None else (result.get_response().id, result))
        if len(answers) == expected:
            done.set()

    client.start_stream(callback)
    try:
        client.async_stream_infer("slow", slow_inputs(unique_x(5), served.block_iterations), request_id="slow")
        time.sleep(0.05)
        feeds = {f"r{i}": pair(10 + i, rows=1 + i % 3) for i in range(8)}
        for request_id, (a, b) in feeds.items():
            client.async_stream_infer("simple", simple_inputs(a, b), request_id=request_id)
        client.async_stream_infer("nope", simple_inputs(*pair(0)), request_id="bad")
        assert done.wait(timeout=20), f"{len(answers)} answers"
    finally:
        client.stop_stream()
        client.close()
    ids = [answer_id for answer_id, _ in answers]
    assert ids[-1] == "slow", ids  # everything else was answered while it ran
    assert sorted(ids[:-1]) == sorted([*feeds, "error"])
    for answer_id, answer in answers:
        if answer_id == "error":
            assert answer.message() == UNKNOWN
        elif answer_id == "slow":
            np.testing.assert_array_equal(answer.as_numpy("Y"), unique_x(5) + 1)
        else:
            a, b = feeds[answer_id]
            np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(answer.as_numpy("OUTPUT1"), a - b)


# --------------------------------------------------------------------------- tritonclient.grpc.aio


async def every_rpc_aio(url: str) -> None:
    client = grpcaio.InferenceServerClient(url)
    try:
        assert await client.is_server_live() and await client.is_server_ready()
        assert await client.is_model_ready("simple") and not await client.is_model_ready("nope")
        assert (await client.get_server_metadata()).name == "modelhost"
        assert (await client.get_model_metadata("simple")).inputs[0].name == "INPUT0"
        assert (await client.get_model_config("simple")).config.max_batch_size == 8
        assert "simple" in {m.name for m in (await client.get_model_repository_index()).models}
        assert (await client.get_inference_statistics("simple")).model_stats[0].name == "simple"
        for call in (client.load_model, client.unload_model):
            with pytest.raises(InferenceServerException) as caught:
                await call("simple")
            assert caught.value.status() == "StatusCode.UNAVAILABLE"  # Triton's refusal outside explicit mode
        a, b = pair(20, rows=2)
        result = await client.infer("simple", simple_inputs(a, b), request_id="aio")
        assert result.get_response().id == "aio"
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        with pytest.raises(InferenceServerException) as caught:
            await client.infer("nope", simple_inputs(a, b))
        assert caught.value.status() == "StatusCode.NOT_FOUND"

        feeds = {f"s{i}": pair(30 + i) for i in range(6)}

        async def requests_() -> Any:
            for request_id, (x, y) in feeds.items():
                yield {"model_name": "simple", "inputs": simple_inputs(x, y), "request_id": request_id}

        seen = {}
        async for streamed, error in client.stream_infer(requests_()):  # ends once every request is answered
            assert error is None
            seen[streamed.get_response().id] = streamed.as_numpy("OUTPUT1")
        assert set(seen) == set(feeds)
        for request_id, (x, y) in feeds.items():
            np.testing.assert_array_equal(seen[request_id], x - y)
    finally:
        await client.close()


def test_aio_client_every_rpc_and_a_stream(served: Served) -> None:
    asyncio.run(every_rpc_aio(served.server.grpc_url))


# --------------------------------------------------------------------------- one data plane for HTTP and gRPC


def test_http_and_grpc_requests_share_one_batch(served: Served) -> None:
    client = served.client
    (before,) = client.get_inference_statistics("shared").model_stats
    (a1, b1), (a2, b2) = pair(41), pair(42)
    http = httpclient.InferenceServerClient(served.server.url)
    try:
        http_inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32").set_data_from_numpy(a1),
                       httpclient.InferInput("INPUT1", [1, 16], "FP32").set_data_from_numpy(b1)]
        with ThreadPoolExecutor(2) as pool:
            over_http = pool.submit(http.infer, "shared", http_inputs)
            over_grpc = pool.submit(client.infer, "shared", simple_inputs(a2, b2))
            np.testing.assert_array_equal(over_http.result(timeout=10).as_numpy("OUTPUT0"), a1 + b1)
            np.testing.assert_array_equal(over_grpc.result(timeout=10).as_numpy("OUTPUT0"), a2 + b2)
    finally:
        http.close()
    (after,) = client.get_inference_statistics("shared").model_stats
    assert (after.execution_count - before.execution_count, after.inference_count - before.inference_count) == (1, 2)
    batches = {b.batch_size: b.compute_infer.count for b in after.batch_stats}
    assert batches.get(2, 0) - {b.batch_size: b.compute_infer.count for b in before.batch_stats}.get(2, 0) == 1


# --------------------------------------------------------------------------- ports


def test_a_busy_grpc_port_stops_the_server_with_a_clear_message(served: Served, repository: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "modelhost", "serve", "--model-repository", str(repository), "--http-port",
         str(free_port()), "--grpc-port", str(served.server.grpc_port), "--metrics-port", "0", "--sagemaker-port", "0"],
        capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert f"cannot listen on 127.0.0.1:{served.server.grpc_port} for gRPC" in result.stderr
    assert "Traceback" not in result.stderr


def test_grpc_port_0_turns_grpc_off(tmp_path: Path) -> None:
    write_model(tmp_path, "simple", add_sub_model(), ADD_SUB_CONFIG)
    server = ServerProcess(tmp_path, "--grpc-port", "0").wait_ready()
    output = server.stop()
    assert "gRPC off" in output and "gRPC listening" not in output


def test_grpc_flags_reach_the_server_options() -> None:
    settings = modelhost_settings(["serve", "--grpc-max-message-bytes", "64MiB", "--grpc-keepalive-time-seconds",
                                   "30", "--grpc-keepalive-timeout-seconds", "2.5"], {})
    assert settings.grpc_max_message_bytes == 64 * 1024**2
    options = dict(server_options(GrpcOptions(settings.grpc_max_message_bytes, settings.grpc_keepalive_time_seconds,
                                              settings.grpc_keepalive_timeout_seconds)))
    assert options["grpc.max_receive_message_length"] == options["grpc.max_send_message_length"] == 64 * 1024**2
    assert (options["grpc.keepalive_time_ms"], options["grpc.keepalive_timeout_ms"]) == (30_000, 2_500)
    assert options["grpc.so_reuseport"] == 0  # one process: a busy port is an error, not shared
    defaults = modelhost_settings(["serve"], {})
    assert defaults.grpc_max_message_bytes >= 500 * 4096 * 100  # 500 candidates x 4 KB, with room to spare
    for bad in (["--grpc-max-message-bytes", "0"], ["--grpc-max-message-bytes", "3GiB"],
                ["--grpc-keepalive-time-seconds", "-1"]):
        with pytest.raises(SystemExit) as caught:
            modelhost_settings(["serve", *bad], {})
        assert caught.value.code == 2


def test_workers_share_the_grpc_port(tmp_path: Path) -> None:
    write_model(tmp_path, "simple", add_sub_model(), ADD_SUB_CONFIG)
    server = ServerProcess(tmp_path, "--workers", "2", "--metrics-port", "0").wait_ready()
    try:
        listening = f"gRPC listening on {server.grpc_url}"
        wait_for(lambda: server.printed.count(listening) == 2, timeout=30, what="both workers")
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            a, b = pair(50)
            np.testing.assert_array_equal(client.infer("simple", simple_inputs(a, b)).as_numpy("OUTPUT0"), a + b)
        finally:
            client.close()
    finally:
        output = server.stop()
    assert server.process.returncode == 0, output


# --------------------------------------------------------------------------- limits and graceful shutdown


@pytest.fixture(scope="module")
def limited(repository: Path) -> Iterator[ServerProcess]:
    """A server with a 1 MiB gRPC message limit; test_sigterm_... (the last test here) stops it."""
    server = ServerProcess(repository, "--grpc-max-message-bytes", "1MiB").wait_ready()
    yield server
    server.stop()


def fp32_input(columns: int) -> grpcclient.InferInput:
    array = np.ones((1, columns), np.float32)
    return grpcclient.InferInput("INPUT0", [1, columns], "FP32").set_data_from_numpy(array)


def test_message_size_limits(limited: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(limited.grpc_url)
    try:
        assert client.infer("double", [fp32_input(100_000)]).as_numpy("OUTPUT0").shape == (1, 200_000)
        error = grpc_error(lambda: client.infer("double", [fp32_input(300_000)]))  # 1.2 MB received
        assert error.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert "Received message larger than max (1200034 vs. 1048576)" in error.message()
        error = grpc_error(lambda: client.infer("double", [fp32_input(200_000)]))  # 1.6 MB to send
        assert error.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert "1600038 bytes, more than the gRPC message limit of 1048576 bytes (--grpc-max-message-bytes)" in (
            error.message())
        assert client.is_server_live()
    finally:
        client.close()


def test_sigterm_stops_both_servers_at_once_and_finishes_what_is_in_flight(limited: ServerProcess,
                                                                         served: Served) -> None:
    """An HTTP request runs, a gRPC one waits behind it; on SIGTERM neither server takes new calls while both
    finish (gRPC does not wait for HTTP to drain first), and only then the models unload."""
    client = grpcclient.InferenceServerClient(limited.grpc_url)
    http = httpclient.InferenceServerClient(limited.url, network_timeout=20)
    x = unique_x(6)
    http_inputs = [httpclient.InferInput("X", [1, S, S], "FP32").set_data_from_numpy(x),
                   httpclient.InferInput("ITERATIONS", [1, 1], "INT64").set_data_from_numpy(
                       np.full((1, 1), served.block_iterations, np.int64))]
    try:
        with ThreadPoolExecutor(2) as pool:
            over_http = pool.submit(http.infer, "slow", http_inputs)
            time.sleep(0.05)
            over_grpc = pool.submit(infer_slow, client, unique_x(7), 1)
            wait_for(lambda: pending(limited, "slow") == 1, what="the gRPC request to queue")
            limited.signal(signal.SIGTERM)
            time.sleep(0.1)
            late = grpcclient.InferenceServerClient(limited.grpc_url)
            try:
                assert grpc_error(lambda: late.is_server_live(client_timeout=5)).status() == "StatusCode.UNAVAILABLE"
            finally:
                late.close()
            with pytest.raises(requests.ConnectionError):
                requests.get(limited.base + "/v2/health/live", timeout=5)
            assert not over_http.done() and not over_grpc.done()
            np.testing.assert_array_equal(over_http.result(timeout=20).as_numpy("Y"), x + 1)
            np.testing.assert_array_equal(over_grpc.result(timeout=20), unique_x(7) + 1)
    finally:
        client.close()
        http.close()
    output = limited.stop()
    assert limited.process.returncode == 0, output
    assert output.index("gRPC: no new calls") < output.index("stopping: draining and unloading models")
