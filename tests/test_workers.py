"""--workers N: several server processes share the ports; each has its own models, and statistics and metrics
answer for all of them."""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path

import requests
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

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


def test_two_workers_share_the_port_and_stop_cleanly(tmp_path) -> None:  # type: ignore[no-untyped-def]
    metrics = free_port()
    workers_tmp = tmp_path / "tmp"
    workers_tmp.mkdir()
    server = ServerProcess(None, "--workers", "2", "--metrics-port", str(metrics), cache_dir=tmp_path,
                           env={"TMPDIR": str(workers_tmp)}).wait_ready()
    try:
        server.wait_ready(path=f"http://127.0.0.1:{metrics}/metrics")
        sent = send_until_both_served(server, workers_tmp)
        # Every worker listens on the metrics port and answers for the whole server, whichever a scrape reaches.
        assert {tiny_count(metrics) for _ in range(12)} == {sent}
        counts = own_counts(workers_tmp)
        assert sum(counts) == sent and all(count > 0 for count in counts), counts  # both workers served
    finally:
        server.signal(signal.SIGTERM)
        output = server.stop()
    assert server.process.returncode == 0, output
    assert "worker 0" in output and "worker 1" in output


def test_statistics_answer_for_every_worker_whichever_answers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # perf_analyzer reads statistics before and after a run over its own connection: whichever worker that
    # lands on, the counts must be the server's, or its deltas go backwards.
    workers_tmp = tmp_path / "tmp"
    workers_tmp.mkdir()
    server = ServerProcess(None, "--workers", "2", cache_dir=tmp_path, env={"TMPDIR": str(workers_tmp)}).wait_ready()
    try:
        sent = send_until_both_served(server, workers_tmp)
        seen = set()
        for _ in range(12):
            response = requests.get(f"{server.base}/v2/models/tiny/stats", headers={"Connection": "close"},
                                    timeout=10)
            assert response.status_code == 200, response.text
            seen.add(response.json()["model_stats"][0]["inference_count"])
            with grpcclient.InferenceServerClient(server.grpc_url) as client:  # a new channel: any worker
                stats = client.get_inference_statistics("tiny", as_json=True)
            seen.add(int(stats["model_stats"][0]["inference_count"]))
        assert seen == {sent}
        assert all(count > 0 for count in own_counts(workers_tmp))  # so each answer was a sum
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
