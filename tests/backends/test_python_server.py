"""Python models end to end: a real server (tests/server.py), real HTTP clients.

One server (module scope) serves:
- `batcher`: in process, dynamic batching; execute takes a moment and returns the batch size it ran;
- `fragile`: isolated in a worker process; input 666 makes it exit, 888 makes it hang past its 1 s timeout;
- `broken`: a model.py that fails to import, so that model alone is UNAVAILABLE with the reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from tests.server import ServerProcess, wait_for

BATCHER_CONFIG = """
backend: "python"
max_batch_size: 16
input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "batch" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 20000 }
"""
BATCHER = """
import time
import numpy as np

class Model:
    def execute(self, inputs):
        x = inputs["x"]
        time.sleep(0.02)  # long enough for concurrent requests to queue behind a batch
        return {"y": x * 2, "batch": np.full((len(x), 1), len(x), np.int32)}
"""
FRAGILE_CONFIG = """
backend: "python"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "pid" data_type: TYPE_INT64 dims: [ 1 ] } ]
parameters { key: "isolation" value: { string_value: "process" } }
parameters { key: "execute_timeout_seconds" value: { string_value: "1" } }
"""
FRAGILE = """
import os, time
from pathlib import Path
import numpy as np

class Model:
    def initialize(self, args):
        self.directory = Path(args["model_directory"])

    def execute(self, inputs):
        x = inputs["x"]
        if (x == 666).any():
            os._exit(3)
        if (x == 888).any():
            time.sleep(60)
        return {"pid": np.full((len(x), 1), os.getpid(), np.int64)}

    def finalize(self):
        (self.directory / f"finalized_{os.getpid()}").write_text("")
"""
BROKEN_CONFIG = FRAGILE_CONFIG


def write_model(repo: Path, name: str, config: str, code: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    (repo / name / "1" / "model.py").write_text(code)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("python_repo")
    write_model(repo, "batcher", BATCHER_CONFIG, BATCHER)
    write_model(repo, "fragile", FRAGILE_CONFIG, FRAGILE)
    write_model(repo, "broken", BROKEN_CONFIG, "1 / 0\n")
    process = ServerProcess(repo).wait_ready()
    yield process
    process.stop()


def infer(server: ServerProcess, model: str, x: np.ndarray) -> requests.Response:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}
    return requests.post(f"{server.base}/v2/models/{model}/infer", json=body, timeout=30)


def output(response: requests.Response, name: str) -> np.ndarray:
    assert response.status_code == 200, response.text
    entry = next(o for o in response.json()["outputs"] if o["name"] == name)
    return np.array(entry["data"]).reshape(entry["shape"])


def fragile_pid(server: ServerProcess) -> int:
    return int(output(infer(server, "fragile", np.ones((1, 1), np.float32)), "pid")[0, 0])


def test_dynamic_batching_batches_a_python_model(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url, concurrency=16)
    try:
        requests_ = []
        for index in range(32):
            x = httpclient.InferInput("x", [1, 2], "FP32")
            x.set_data_from_numpy(np.array([[index, -index]], np.float32))
            requests_.append((index, client.async_infer("batcher", [x])))
        batches = []
        for index, pending in requests_:
            result = pending.get_result()
            np.testing.assert_array_equal(result.as_numpy("y"), [[2 * index, -2 * index]])
            batches.append(int(result.as_numpy("batch")[0, 0]))
    finally:
        client.close()
    assert max(batches) > 1, batches  # the scheduler batched; the model ran what it was given
    stats = requests.get(f"{server.base}/v2/models/batcher/stats", timeout=5).json()["model_stats"][0]
    seen: dict[int, int] = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
    assert sum(size * count for size, count in seen.items()) == 32
    assert set(batches) <= set(seen)


def test_isolated_crash_fails_that_request_only(server: ServerProcess) -> None:
    before = fragile_pid(server)
    response = infer(server, "fragile", np.array([[666.0]], np.float32))
    assert response.status_code == 500
    assert response.json()["error"] == (
        f"Python model 'fragile' version 1 instance 0: its worker process (pid {before}) exited with code 3 "
        "while running this batch; the worker is restarting")
    # Logged before the answer, read from the server's pipe by a thread here: it may arrive a moment later.
    wait_for(lambda: "exited with code 3" in server.printed, timeout=5, what="the crash in the log")
    assert output(infer(server, "batcher", np.ones((1, 2), np.float32)), "y").tolist() == [[2.0, 2.0]]
    assert fragile_pid(server) not in (before, server.process.pid)


def test_isolated_hang_times_out(server: ServerProcess) -> None:
    before = fragile_pid(server)
    with ThreadPoolExecutor(1) as pool:
        hung = pool.submit(infer, server, "fragile", np.array([[888.0]], np.float32))
        # The server keeps serving other models while that instance waits on its worker.
        assert output(infer(server, "batcher", np.ones((1, 2), np.float32)), "y").tolist() == [[2.0, 2.0]]
        response = hung.result()
    assert response.status_code == 504
    assert "did not answer within 1 s (execute_timeout_seconds)" in response.json()["error"]
    assert fragile_pid(server) != before


def test_model_py_that_fails_to_import_fails_alone(server: ServerProcess) -> None:
    index = requests.post(f"{server.base}/v2/repository/index", json={}, timeout=5).json()
    states: dict[str, Any] = {entry["name"]: entry for entry in index}
    assert states["broken"]["state"] == "UNAVAILABLE"
    assert "failed to import: ZeroDivisionError: division by zero (model.py line 1)" in states["broken"]["reason"]
    assert states["batcher"]["state"] == states["fragile"]["state"] == "READY"


def test_stopping_the_server_finalizes_and_ends_workers(tmp_path: Path, start_server: Any) -> None:
    write_model(tmp_path, "fragile", FRAGILE_CONFIG, FRAGILE)
    server = start_server(tmp_path)
    worker = fragile_pid(server)
    server.stop()
    assert server.process.returncode == 0, server.output
    assert (tmp_path / "fragile" / f"finalized_{worker}").exists()
    wait_for(lambda: not os.path.exists(f"/proc/{worker}"), timeout=5, what=f"worker {worker} to be gone")
