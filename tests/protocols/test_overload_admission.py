"""Under overload, a request to a model whose queue is full is answered from its head: its body is read
and dropped, never buffered or decoded, and the keep-alive connection stays usable."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.protocols.http_wire import Wire, request
from tests.server import ServerProcess

SLOW = '''
import time


class Model:
    def execute(self, inputs):
        time.sleep(1.5)
        return {"y": inputs["x"] * 2}
'''
CONFIG = """
backend: "python"
max_batch_size: 1
dynamic_batching { max_queue_delay_microseconds: 1 default_queue_policy { max_queue_size: 1 } }
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("repository")
    (repository / "slow" / "1").mkdir(parents=True)
    (repository / "slow" / "1" / "model.py").write_text(SLOW)
    (repository / "slow" / "config.pbtxt").write_text(CONFIG)
    process = ServerProcess(Path(repository)).wait_ready()
    yield process
    process.stop()


def test_a_full_queue_answers_before_reading_the_body(server: ServerProcess) -> None:
    url = f"{server.base}/v2/models/slow/infer"
    answers: list[requests.Response] = []

    def infer() -> None:
        answers.append(requests.post(url, json=BODY, timeout=30))

    running, queued = threading.Thread(target=infer), threading.Thread(target=infer)
    running.start()
    time.sleep(0.3)  # the first runs (1.5 s), the second waits in the queue of one
    queued.start()
    time.sleep(0.3)
    with requests.Session() as session:
        # Through the usual path: decoded, then refused by the full queue.
        refused = session.post(url, json=BODY, timeout=30)
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "1" and "max_queue_size 1" in refused.json()["error"]
        # Now the server answers from the head: a body that is not even JSON is never looked at.
        early = session.post(url, data=b"{" * 100_000, timeout=30)
        assert early.status_code == 503, early.text
        assert early.headers["retry-after"] == "1" and "max_queue_size 1" in early.json()["error"]
        running.join()
        queued.join()
        # The connection is still in step: once there is room, the next request on it is served.
        served = session.post(url, json=BODY, timeout=30)
        assert served.status_code == 200, served.text
        assert served.json()["outputs"][0]["data"] == [2.0, 4.0, 6.0, 8.0]
    assert [a.status_code for a in answers] == [200, 200]
    # With room in the queue, a bad body is read and decoded again: the 400 names the problem.
    assert requests.post(url, data=b"{" * 100, timeout=30).status_code == 400


def _fill_the_queue(url: str) -> list[threading.Thread]:
    """One request running (1.5 s), one queued (a queue of one), one refused: the server now answers at heads."""
    threads = [threading.Thread(target=lambda: requests.post(url, json=BODY, timeout=30)) for _ in range(2)]
    for thread in threads:
        thread.start()
        time.sleep(0.3)
    assert requests.post(url, json=BODY, timeout=30).status_code == 503
    return threads


def test_the_answer_comes_before_the_body_and_the_connection_stays_in_step(server: ServerProcess) -> None:
    body = b"x" * 200_000
    head = (f"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
            "Content-Type: application/json\r\n\r\n").encode()
    with Wire(server.port) as wire:
        threads = _fill_the_queue(f"{server.base}/v2/models/slow/infer")
        wire.send(head)  # the head only: the answer must not wait for the body
        early = wire.read_response()
        assert early.status == 503 and early.header("retry-after") == "1"
        assert early.header("connection") is None  # kept alive: the body is read and dropped
        wire.send(body)
        for thread in threads:
            thread.join()
        wire.send(request("POST", "/v2/models/slow/infer", json.dumps(BODY).encode()))
        served = wire.read_response()
        assert served.status == 200, served.body
        assert json.loads(served.body)["outputs"][0]["data"] == [2.0, 4.0, 6.0, 8.0]


def test_a_client_waiting_for_100_continue_gets_the_answer_instead(server: ServerProcess) -> None:
    with Wire(server.port) as wire:
        threads = _fill_the_queue(f"{server.base}/v2/models/slow/infer")
        wire.send(b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\n"
                  b"Expect: 100-continue\r\n\r\n")
        answer = wire.read_response()  # a 100 Continue first would invite a body only to drop it
        assert answer.status == 503 and answer.header("connection") == "close"
        assert wire.closed_by_server()
        for thread in threads:
            thread.join()
