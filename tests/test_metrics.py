"""Prometheus metrics on --metrics-port: Triton's names and labels, values matching the requests sent."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import requests
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from tests.onnx_models import slow_loop_model, write_model
from tests.server import ServerProcess, in_progress

TRITON_COUNTERS = (
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
)


def scrape(server: ServerProcess) -> dict[tuple[str, str], float]:
    response = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.labels.get("model") == "tiny" and "le" not in sample.labels:
                samples[(sample.name, sample.labels["version"])] = sample.value
    return samples


def test_metrics_count_what_was_sent(example_server: ServerProcess) -> None:
    before = scrape(example_server)
    client = httpclient.InferenceServerClient(example_server.url)
    rows = 0
    for batch in (1, 3, 5):
        x = np.ones((batch, 4), dtype=np.float32)
        inputs = [httpclient.InferInput("x", list(x.shape), "FP32")]
        inputs[0].set_data_from_numpy(x)
        client.infer("tiny", inputs)
        rows += batch
    failed = requests.post(f"{example_server.base}/v2/models/tiny/infer", timeout=10,
                           json={"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]})
    assert failed.status_code == 400
    after = scrape(example_server)
    for name in TRITON_COUNTERS:
        assert (name, "1") in after, name

    def delta(name: str) -> float:
        return after[(name, "1")] - before.get((name, "1"), 0.0)

    assert delta("nv_inference_request_success") == 3
    assert delta("nv_inference_request_failure") == 1
    assert delta("nv_inference_count") == rows
    assert delta("nv_inference_exec_count") == 3
    assert delta("nv_inference_compute_infer_duration_us") > 0
    assert delta("nv_inference_request_duration_us") >= delta("nv_inference_compute_infer_duration_us")
    assert after[("nv_inference_pending_request_count", "1")] == 0
    assert delta("modelhost_request_latency_seconds_count") == 4
    assert delta("modelhost_batch_size_count") == 3
    assert delta("modelhost_batch_size_sum") == rows


def test_metrics_agree_with_statistics(example_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(example_server.url)
    [stats] = client.get_inference_statistics("tiny")["model_stats"]
    metrics = scrape(example_server)
    assert metrics[("nv_inference_count", "1")] == stats["inference_count"]
    assert metrics[("nv_inference_exec_count", "1")] == stats["execution_count"]
    assert metrics[("nv_inference_request_success", "1")] == stats["inference_stats"]["success"]["count"]


def test_metrics_can_be_turned_off(start_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = start_server(tmp_path, "--metrics-port", "0")
    try:
        requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=2)
        raise AssertionError("metrics port answered although metrics are off")
    except requests.ConnectionError:
        pass


def settles_at_zero(server: ServerProcess) -> None:
    deadline = time.monotonic() + 5
    while (value := in_progress(server)) != 0:
        assert time.monotonic() < deadline, f"{value} requests still counted in progress"
        time.sleep(0.02)


def test_requests_in_progress_counts_a_running_request_and_returns_to_zero(start_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    write_model(tmp_path, "slow", slow_loop_model(64, batched=False), None)
    server = start_server(tmp_path)
    body = {"inputs": [
        {"name": "X", "datatype": "FP32", "shape": [64, 64], "data": np.zeros(64 * 64).tolist()},
        {"name": "ITERATIONS", "datatype": "INT64", "shape": [1], "data": [40000]},
    ]}
    with ThreadPoolExecutor(2) as pool:
        running = [pool.submit(requests.post, f"{server.base}/v2/models/slow/infer", json=body, timeout=60)
                   for _ in range(2)]
        deadline = time.monotonic() + 5
        while in_progress(server) < 1:
            assert time.monotonic() < deadline and not all(f.done() for f in running), "never counted in progress"
            time.sleep(0.01)
        assert [f.result().status_code for f in running] == [200, 200]
    settles_at_zero(server)


def test_requests_in_progress_forgets_requests_whose_client_left(example_server: ServerProcess) -> None:
    body = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}'
    request = (b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
    for payload in (request * 8, request[:-5], request * 3 + request[:40]):
        with socket.create_connection(("127.0.0.1", example_server.port), timeout=5) as sock:
            sock.sendall(payload)  # and leave without reading a byte
    settles_at_zero(example_server)
    assert requests.post(f"{example_server.base}/v2/models/tiny/infer", data=body, timeout=5).status_code == 200
    settles_at_zero(example_server)


def test_expositions_of_several_workers_sum_sample_by_sample() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from modelhost.metrics_sum import sum_expositions

    one = (b'# HELP nv_inference_count Rows\n# TYPE nv_inference_count untyped\n'
           b'nv_inference_count{model="a",version="1"} 3.0\nnv_inference_count{model="b",version="1"} 1.0\n'
           b'# HELP lat Latency\n# TYPE lat histogram\nlat_bucket{le="0.1",model="a"} 1.0\n'
           b'lat_bucket{le="+Inf",model="a"} 2.0\nlat_count{model="a"} 2.0\nlat_sum{model="a"} 0.25\n').decode()
    two = one.replace("3.0", "4.0").replace("0.25", "0.5").replace('model="b"', 'model="c"')
    families = {f.name: f for f in text_string_to_metric_families(sum_expositions([one, two]).decode())}
    counts = {s.labels["model"]: s.value for s in families["nv_inference_count"].samples}
    assert counts == {"a": 7.0, "b": 1.0, "c": 1.0}
    assert families["lat"].type == "histogram"
    latency = {(s.name, s.labels.get("le")): s.value for s in families["lat"].samples}
    assert latency == {("lat_bucket", "0.1"): 2.0, ("lat_bucket", "+Inf"): 4.0, ("lat_count", None): 4.0,
                       ("lat_sum", None): 0.75}
