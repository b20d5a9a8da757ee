"""--workers N: several server processes share the ports; each has its own models, and statistics and metrics
answer for all of them."""

from __future__ import annotations

import json
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.server import ServerProcess, free_port

TINY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}


def tiny_count(port: int) -> float:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", headers={"Connection": "close"}, timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "nv_inference_count" and sample.labels["model"] == "tiny":
                return sample.value
    raise AssertionError("no nv_inference_count for tiny")


def own_counts(workers_tmp: Path) -> list[int]:
    """Each worker's own inference count of tiny, asked on its statistics socket as the other workers ask it."""
    (directory,) = workers_tmp.glob("modelhost-workers-*")
    counts = []
    for index in range(2):
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(directory / f"{index}.sock"))
            sock.sendall(b"stats\ttiny\t\n")
            answer = b"".join(iter(lambda: sock.recv(65536), b""))
        models = json.loads(answer)  # empty from a worker whose socket is up before its models have loaded
        counts.append(models[0]["inference_count"] if models else 0)
    return counts


def send_until_both_served(server: ServerProcess, workers_tmp: Path, least: int = 40, most: int = 400) -> int:
    """Infer on a new connection each time (the kernel spreads them over the workers) until both workers have
    served some and at least `least` are sent; the number sent. wait_ready returns once one worker listens:
    the other may still be loading, and a fast server answers `least` requests before it binds."""
    def both_served() -> bool:
        try:
            return all(own_counts(workers_tmp))
        except OSError:  # a worker still starting has no statistics socket yet
            return False

    sent = 0
    while sent < least or not both_served():
        assert sent < most, f"{sent} requests and one worker served none"
        response = requests.post(f"{server.base}/v2/models/tiny/infer", json=TINY, timeout=10,
                                 headers={"Connection": "close"})
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == [3.0, 5.0, 7.0, 9.0]
        sent += 1
    return sent


class TwoWorkers:
    """One `--workers 2` server for the module's tests, and how many tiny requests they have sent it in all."""

    def __init__(self, tmp_path: Path) -> None:
        self.metrics = free_port()
        self.workers_tmp = tmp_path / "tmp"
        self.workers_tmp.mkdir()
        # Explicit mode with every model loaded at start: what the default mode serves, and loads and unloads too.
        self.server = ServerProcess(None, "--workers", "2", "--metrics-port", str(self.metrics),
                                    "--model-control-mode", "explicit", "--load-model", "*", cache_dir=tmp_path,
                                    env={"TMPDIR": str(self.workers_tmp)}).wait_ready()
        self.sent = 0

    def send_until_both_served(self) -> int:
        self.sent += send_until_both_served(self.server, self.workers_tmp)
        return self.sent


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoWorkers]:
    workers = TwoWorkers(tmp_path_factory.mktemp("two_workers"))
    yield workers
    workers.server.stop()


def test_two_workers_share_the_port(two_workers: TwoWorkers) -> None:
    metrics = two_workers.metrics
    two_workers.server.wait_ready(path=f"http://127.0.0.1:{metrics}/metrics")
    sent = two_workers.send_until_both_served()
    # Every worker listens on the metrics port and answers for the whole server, whichever a scrape reaches.
    assert {tiny_count(metrics) for _ in range(12)} == {sent}
    counts = own_counts(two_workers.workers_tmp)
    assert sum(counts) == sent and all(count > 0 for count in counts), counts  # both workers served


def test_statistics_answer_for_every_worker_whichever_answers(two_workers: TwoWorkers) -> None:
    # perf_analyzer reads statistics before and after a run over its own connection: whichever worker that
    # lands on, the counts must be the server's, or its deltas go backwards.
    server = two_workers.server
    sent = two_workers.send_until_both_served()
    seen = set()
    for _ in range(12):
        response = requests.get(f"{server.base}/v2/models/tiny/stats", headers={"Connection": "close"}, timeout=10)
        assert response.status_code == 200, response.text
        seen.add(response.json()["model_stats"][0]["inference_count"])
        with grpcclient.InferenceServerClient(server.grpc_url) as client:  # a new channel: any worker
            stats = client.get_inference_statistics("tiny", as_json=True)
        seen.add(int(stats["model_stats"][0]["inference_count"]))
    assert seen == {sent}
    assert all(count > 0 for count in own_counts(two_workers.workers_tmp))  # so each answer was a sum
    everything = requests.get(f"{server.base}/v2/models/stats", timeout=10).json()["model_stats"]
    assert [s["name"] for s in everything] == sorted({s["name"] for s in everything})  # one entry each


def on_fresh_connections(server: ServerProcess, path: str) -> list[requests.Response]:
    """GET `path` on twelve new connections, which the kernel spreads over the workers."""
    return [requests.get(f"{server.base}{path}", headers={"Connection": "close"}, timeout=10) for _ in range(12)]


def test_a_load_with_a_config_and_an_unload_reach_every_worker(two_workers: TwoWorkers) -> None:
    server = two_workers.server
    two_workers.send_until_both_served()  # both workers listen
    client = httpclient.InferenceServerClient(server.url)
    config = {"name": "tiny", "platform": "onnxruntime_onnx", "max_batch_size": 8}
    client.load_model("tiny", config=json.dumps(config))
    assert {r.json()["max_batch_size"] for r in on_fresh_connections(server, "/v2/models/tiny/config")} == {8}
    client.unload_model("tiny")
    assert {r.status_code for r in on_fresh_connections(server, "/v2/models/tiny/ready")} == {400}
    client.load_model("tiny")  # the repository's own config again
    assert {r.json()["max_batch_size"] for r in on_fresh_connections(server, "/v2/models/tiny/config")} == {1024}
    with pytest.raises(InferenceServerException) as refused:  # a bad load fails where it lands, changes nothing
        client.load_model("tiny", config='{"max_batch_size": "many"}')
    assert refused.value.status() == "400"
    assert {r.status_code for r in on_fresh_connections(server, "/v2/models/tiny/ready")} == {200}


def test_two_workers_stop_cleanly(two_workers: TwoWorkers) -> None:
    """Last of the module's tests on the shared server: SIGTERM stops both workers, and the server exits 0."""
    two_workers.server.signal(signal.SIGTERM)
    output = two_workers.server.stop()
    assert two_workers.server.process.returncode == 0, output
    assert "worker 0" in output and "worker 1" in output


def test_workers_must_be_positive() -> None:
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "modelhost", "serve", "--workers", "0"], capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 2
    assert "--workers must be at least 1" in result.stderr
