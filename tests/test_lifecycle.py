"""Server lifecycle: graceful shutdown on SIGTERM/SIGINT, the built-in example repository, CLI errors."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import requests

from modelhost.example_repository import repository_tag
from tests.onnx_models import loop_iterations_for, slow_loop_config, slow_loop_model, write_model
from tests.server import ServerProcess, free_port

SIZE = 256  # X is [SIZE, SIZE]; each loop iteration is one SIZE^3 MatMul
TARGET_SECONDS = 2.0  # how long one slow inference should take on this machine

SLOW_CONFIG = slow_loop_config(SIZE, max_batch_size=0)


@pytest.fixture(scope="module")
def slow_repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A repository with the slow model, and the iteration count that makes one call take ~TARGET_SECONDS."""
    model = slow_loop_model(SIZE, batched=False)
    repo = tmp_path_factory.mktemp("slow_repo")
    write_model(repo, "slow", model, SLOW_CONFIG)

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2  # what the server gives a single instance on a 2-core machine
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    x = np.zeros((SIZE, SIZE), np.float32)
    return repo, loop_iterations_for(
        TARGET_SECONDS, lambda n: session.run(None, {"X": x, "ITERATIONS": np.array([n], np.int64)}),
        probe=300, bounds=(500, 500_000))


def slow_infer(base: str, x: np.ndarray, iterations: int) -> requests.Response:
    """Binary request (X is 256 KiB), JSON response."""
    header = json.dumps({"inputs": [
        {"name": "X", "datatype": "FP32", "shape": list(x.shape), "parameters": {"binary_data_size": x.nbytes}},
        {"name": "ITERATIONS", "datatype": "INT64", "shape": [1], "data": [iterations]},
    ]}).encode()
    return requests.post(
        f"{base}/v2/models/slow/infer", data=header + x.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header))}, timeout=120,
    )


def result_of(response: requests.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    assert output["name"] == "Y" and output["shape"] == [SIZE, SIZE]
    return np.array(output["data"], np.float32).reshape(SIZE, SIZE)


def refused(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return False
    except ConnectionRefusedError:
        return True


# --------------------------------------------------------------------------- graceful shutdown


def test_slow_model_is_slow_and_correct(start_server, slow_repository: tuple[Path, int]) -> None:  # type: ignore[no-untyped-def]
    repo, iterations = slow_repository
    server = start_server(repo)
    x = np.random.default_rng(1).random((SIZE, SIZE), dtype=np.float32)
    start = time.monotonic()
    y = result_of(slow_infer(server.base, x, iterations))
    elapsed = time.monotonic() - start
    np.testing.assert_array_equal(y, x + 1)
    assert elapsed > 0.8, f"the slow model took only {elapsed:.2f}s; shutdown tests need it in flight"


def test_sigterm_finishes_inflight_request(start_server, slow_repository: tuple[Path, int]) -> None:  # type: ignore[no-untyped-def]
    repo, iterations = slow_repository
    server = start_server(repo)
    x = np.random.default_rng(2).random((SIZE, SIZE), dtype=np.float32)
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["response"] = slow_infer(server.base, x, iterations)
        except Exception as exc:  # recorded and asserted on in the main thread
            outcome["error"] = exc
        outcome["done"] = time.monotonic()

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    time.sleep(0.5)  # the request is now inside the model (~TARGET_SECONDS long)
    assert worker.is_alive(), "request finished before SIGTERM; the slow model is too fast"
    signalled = time.monotonic()
    server.signal(signal.SIGTERM)

    time.sleep(0.3)
    assert worker.is_alive(), "in-flight request ended right after SIGTERM instead of finishing its work"
    assert server.process.poll() is None, "server exited while a request was in flight"
    assert refused(server.port), "server still accepts new connections while draining"

    worker.join(timeout=60)
    assert not worker.is_alive()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["done"] > signalled
    np.testing.assert_array_equal(result_of(outcome["response"]), x + 1)

    returncode = server.process.wait(timeout=30)
    log = server.stop()
    assert refused(server.port)
    assert "stopping: draining and unloading models" in log and "stopped" in log
    assert "Traceback" not in log, log
    assert returncode == 0, f"exit code {returncode} after SIGTERM:\n{log}"


def test_sigint_exits_zero(start_server, slow_repository: tuple[Path, int]) -> None:  # type: ignore[no-untyped-def]
    repo, _ = slow_repository
    server = start_server(repo)
    server.signal(signal.SIGINT)
    returncode = server.process.wait(timeout=30)
    log = server.stop()
    assert refused(server.port)
    assert "stopped" in log
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log
    assert returncode == 0, f"exit code {returncode} after SIGINT:\n{log}"


def test_sigterm_idle_server_exits_zero(start_server, slow_repository: tuple[Path, int]) -> None:  # type: ignore[no-untyped-def]
    repo, _ = slow_repository
    server = start_server(repo)
    server.signal(signal.SIGTERM)
    returncode = server.process.wait(timeout=30)
    log = server.stop()
    assert "stopped" in log
    assert returncode == 0, f"exit code {returncode} after SIGTERM:\n{log}"


# --------------------------------------------------------------------------- built-in example repository


def test_example_repository_is_served(example_server: ServerProcess) -> None:
    index = requests.post(example_server.base + "/v2/repository/index", timeout=10).json()
    assert {(e["name"], e["state"]) for e in index} == {
        (name, "READY") for name in ("rank", "deepfm", "tiny", "deepfm_tiered", "deepfm_tiered_dense",
                                     "deepfm_tiered_embedding")}
    metadata = requests.get(example_server.base + "/v2/models/tiny", timeout=10).json()
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0, 1, 2, 3]}]}
    response = requests.post(example_server.base + "/v2/models/tiny/infer", json=body, timeout=10)
    assert response.json()["outputs"][0]["data"] == [1.0, 3.0, 5.0, 7.0]  # 2x + 1


def test_example_startup_log_names_repository_and_port(tmp_path: Path) -> None:
    server = ServerProcess(None, cache_dir=tmp_path)
    try:
        server.wait_ready()
    finally:
        log = server.stop()
    repository = tmp_path / repository_tag()
    assert (repository / "tiny" / "config.pbtxt").is_file()
    assert f"loading models from {repository}" in log, log
    assert f"127.0.0.1:{server.port}" in log, log
    for name in ("rank", "deepfm", "tiny"):
        assert f"model {name} version 1: READY" in log


# --------------------------------------------------------------------------- CLI


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "modelhost", *args], capture_output=True, text=True, timeout=60)


def test_cli_rejects_missing_repository(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-repo"
    result = run_cli("serve", "--model-repository", str(missing), "--http-port", str(free_port()))
    assert result.returncode != 0
    assert "--model-repository" in result.stderr and str(missing) in result.stderr
    assert "not a directory" in result.stderr or "does not exist" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert not missing.exists()


def test_cli_rejects_file_as_repository(tmp_path: Path) -> None:
    file = tmp_path / "repo.txt"
    file.write_text("not a directory")
    result = run_cli("serve", "--model-repository", str(file), "--http-port", str(free_port()))
    assert result.returncode != 0
    assert str(file) in result.stderr and "not a directory" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_needs_a_command() -> None:
    result = run_cli()
    assert result.returncode == 2
    assert "serve" in result.stderr


def test_cli_version() -> None:
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip().startswith("modelhost ")


def test_port_in_use_is_a_clear_startup_error(example_server: ServerProcess, tmp_path: Path) -> None:
    result = run_cli("serve", "--model-repository", str(tmp_path), "--http-port", str(example_server.port),
                     "--grpc-port", "0", "--sagemaker-port", "0", "--metrics-port", "0")
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{example_server.port}" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert requests.get(example_server.base + "/v2/health/ready", timeout=5).status_code == 200
