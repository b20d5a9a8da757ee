"""Under overload, a request to a model whose queue is full is answered from its head: its body is read
and dropped, never buffered or decoded, and the keep-alive connection stays usable."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

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
