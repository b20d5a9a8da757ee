"""--workers N: several server processes share the HTTP port; each has its own models and metrics."""

from __future__ import annotations

import signal
import socket

import requests
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from tests.server import ServerProcess, free_port

TINY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}


def two_free_ports() -> int:
    """A port p with p + 1 free too: worker i serves metrics on --metrics-port + i."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports")


def tiny_count(port: int) -> float:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "nv_inference_count" and sample.labels["model"] == "tiny":
                return sample.value
    raise AssertionError("no nv_inference_count for tiny")


def test_two_workers_share_the_port_and_stop_cleanly(tmp_path) -> None:  # type: ignore[no-untyped-def]
    metrics = two_free_ports()
    server = ServerProcess(None, "--workers", "2", "--metrics-port", str(metrics), cache_dir=tmp_path).wait_ready()
    server.metrics_port = metrics
    try:
        # The HTTP port answers once either worker is up; each worker binds its metrics port when it is.
        for port in (metrics, metrics + 1):
            server.wait_ready(path=f"http://127.0.0.1:{port}/metrics")
        sent = 0
        for _ in range(40):  # a new connection each time, so the kernel spreads them over the workers
            response = requests.post(f"{server.base}/v2/models/tiny/infer", json=TINY, timeout=10,
                                     headers={"Connection": "close"})
            assert response.status_code == 200, response.text
            assert response.json()["outputs"][0]["data"] == [3.0, 5.0, 7.0, 9.0]
            sent += 1
        counts = [tiny_count(server.metrics_port), tiny_count(server.metrics_port + 1)]
        assert sum(counts) == sent
        assert all(count > 0 for count in counts), counts  # both workers served
    finally:
        server.signal(signal.SIGTERM)
        output = server.stop()
    assert server.process.returncode == 0, output
    assert "worker 0" in output and "worker 1" in output


def test_statistics_answer_for_every_worker_whichever_answers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # perf_analyzer reads statistics before and after a run over its own connection: whichever worker that
    # lands on, the counts must be the server's, or its deltas go backwards.
    server = ServerProcess(None, "--workers", "2", cache_dir=tmp_path).wait_ready()
    try:
        for _ in range(40):  # new connections: the kernel spreads them over the workers
            response = requests.post(f"{server.base}/v2/models/tiny/infer", json=TINY, timeout=10,
                                     headers={"Connection": "close"})
            assert response.status_code == 200, response.text
        seen = set()
        for _ in range(12):
            response = requests.get(f"{server.base}/v2/models/tiny/stats", headers={"Connection": "close"},
                                    timeout=10)
            assert response.status_code == 200, response.text
            seen.add(response.json()["model_stats"][0]["inference_count"])
            with grpcclient.InferenceServerClient(server.grpc_url) as client:  # a new channel: any worker
                stats = client.get_inference_statistics("tiny", as_json=True)
            seen.add(int(stats["model_stats"][0]["inference_count"]))
        assert seen == {40}
        everything = requests.get(f"{server.base}/v2/models/stats", timeout=10).json()["model_stats"]
        assert [s["name"] for s in everything] == sorted({s["name"] for s in everything})  # one entry each
    finally:
        server.signal(signal.SIGTERM)
        output = server.stop()
    assert server.process.returncode == 0, output


def test_workers_must_be_positive() -> None:
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "modelhost", "serve", "--workers", "0"], capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 2
    assert "--workers must be at least 1" in result.stderr
