"""Streamed answers (tsfs §A1.6): a handler that calls `send_intermediate_predict_response` has each intermediate
answer sent to its client as it is made, over HTTP as one chunk each and over gRPC as one message each, with the
archive made by torch-model-archiver and the handler unchanged (tests/backends/torchserve_archives.STREAMING)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import requests

from modelhost.protocols.torchserve import inference_pb2 as ipb
from tests.backends.torchserve_archives import STREAMING, make_archive
from tests.protocols.test_torchserve_grpc import Stub, inference_stub
from tests.server import TorchServeProcess

pytest.importorskip("ts")

PARTS = 4  # three intermediate answers and the final one


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TorchServeProcess]:
    root = tmp_path_factory.mktemp("torchserve_streaming")
    store = root / "store"
    store.mkdir()
    make_archive(store, "stream", STREAMING, config="minWorkers: 1\nbatchSize: 4\nmaxBatchDelay: 50\n"
                                                     "responseTimeout: 20\n")
    process = TorchServeProcess(root, "--model-store", str(store), "--models", "stream.mar",
                                properties="disable_token_authorization=true\ndefault_workers_per_model=1\n")
    process.wait_ready()
    yield process
    process.stop()


@pytest.fixture()
def inference(server: TorchServeProcess) -> Iterator[Stub]:
    with inference_stub(server) as stub:
        yield stub


def streamed(server: TorchServeProcess, word: str) -> tuple[requests.Response, list[tuple[float, bytes]]]:
    """The response to `word` and its chunks, each with the time it arrived."""
    response = requests.post(f"{server.inference}/predictions/stream", data=word.encode(), stream=True, timeout=60)
    chunks = [(time.monotonic(), chunk) for chunk in response.raw.read_chunked()]
    return response, chunks


def test_http_sends_each_intermediate_answer_as_a_chunk_when_it_is_made(server: TorchServeProcess) -> None:
    response, chunks = streamed(server, "hello")
    assert response.status_code == 200
    assert response.headers["transfer-encoding"] == "chunked" and "content-length" not in response.headers
    # The head is the first answer's: its content type and headers, with TorchServe's ts_stream_next and id.
    assert response.headers["content-type"] == "text/plain" and response.headers["ts_stream_next"] == "true"
    assert response.headers["x-request-id"]
    assert [chunk for _, chunk in chunks] == [b"hello:0;", b"hello:1;", b"hello:2;", b"hello:done"]
    # The handler pauses 0.3 s after each part: the first arrived well before the last was made.
    assert chunks[-1][0] - chunks[0][0] >= 0.5


def test_concurrent_streams_each_get_their_own_parts(server: TorchServeProcess) -> None:
    words = [f"w{index}" for index in range(6)]
    with ThreadPoolExecutor(len(words)) as pool:
        results = list(pool.map(lambda word: streamed(server, word), words))
    for word, (response, chunks) in zip(words, results, strict=True):
        assert response.status_code == 200
        assert b"".join(chunk for _, chunk in chunks) == f"{word}:0;{word}:1;{word}:2;{word}:done".encode()


def test_a_handler_failing_mid_stream_cuts_the_response_and_the_model_keeps_serving(
        server: TorchServeProcess) -> None:
    response = requests.post(f"{server.inference}/predictions/stream", data=b"fail", stream=True, timeout=60)
    assert response.status_code == 200  # the head went with the first part
    chunks = response.raw.read_chunked()
    assert next(chunks) == b"fail:0;"
    with pytest.raises(Exception) as caught:  # no terminating chunk: the client sees the response cut
        list(chunks)
    assert "IncompleteRead" in repr(caught.value) or "ProtocolError" in repr(caught.value)
    assert b"".join(chunk for _, chunk in streamed(server, "after")[1]) == b"after:0;after:1;after:2;after:done"


def test_a_client_that_leaves_mid_stream_costs_nothing_else(server: TorchServeProcess) -> None:
    response = requests.post(f"{server.inference}/predictions/stream", data=b"gone", stream=True, timeout=60)
    assert next(response.raw.read_chunked()) == b"gone:0;"
    response.close()
    assert streamed(server, "next")[1][-1][1] == b"next:done"


def test_grpc_stream_predictions_sends_each_answer_as_a_message(inference: Stub) -> None:
    request = ipb.PredictionsRequest(model_name="stream", input={"data": b"rpc"})
    answers = inference.server_stream("StreamPredictions", request, ipb.PredictionResponse)
    assert [answer.prediction for answer in answers] == [b"rpc:0;", b"rpc:1;", b"rpc:2;", b"rpc:done"]
    # A unary call has no way to send parts: it gets the final answer.
    assert inference.unary("Predictions", request, ipb.PredictionResponse).prediction == b"rpc:done"


def test_grpc_bidirectional_stream_sends_each_requests_answers_in_order(inference: Stub) -> None:
    answers = inference.stream("StreamPredictions2", [
        ipb.PredictionsRequest(model_name="stream", input={"data": b"a"}, sequence_id="s"),
        ipb.PredictionsRequest(model_name="stream", input={"data": b"fail"}, sequence_id="s"),
        ipb.PredictionsRequest(model_name="stream", input={"data": b"b"}, sequence_id="s"),
    ], ipb.PredictionResponse)
    predictions = [answer.prediction for answer in answers if not answer.HasField("status")]
    assert predictions == [b"a:0;", b"a:1;", b"a:2;", b"a:done", b"fail:0;", b"b:0;", b"b:1;", b"b:2;", b"b:done"]
    (failed,) = [answer for answer in answers if answer.HasField("status")]
    assert answers.index(failed) == PARTS + 1  # after the failed request's one part, before the next request's
    assert failed.status.code == grpc.StatusCode.UNAVAILABLE.value[0] and "asked to fail" in failed.status.message
    assert {answer.sequence_id for answer in answers} == {"s"}
