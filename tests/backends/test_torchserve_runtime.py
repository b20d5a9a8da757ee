"""TorchServe handlers, unmodified, in archives built by the real torch-model-archiver and opened by
store/mar.py, run by HandlerRuntime (backends/torchserve/runtime.py) as TorchServe's worker runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("ts")
torch = pytest.importorskip("torch")

from modelhost.backends.torchserve.runtime import HandlerRuntime  # noqa: E402
from modelhost.handler_messages import HandlerRequest, HandlerResponse  # noqa: E402
from modelhost.store.mar import MarModel, open_mar  # noqa: E402
from tests.backends.torchserve_archives import MODULE_HANDLE, STREAMING, make_archive  # noqa: E402

# A class with initialize and handle, reading the manifest, its YAML and setting per-request answers.
CLASS_HANDLER = '''
class Ranker:
    def initialize(self, context):
        self.scale = context.model_yaml_config["handler"]["scale"]
        self.version = context.manifest["model"]["modelVersion"]

    def handle(self, data, context):
        answers = []
        for index, row in enumerate(data):
            if context.get_request_header(index, "x-fail") == "1":
                context.set_response_status(418, "Teapot", index)
            context.set_response_content_type(index, "text/plain")
            answers.append(f"{self.version}:{float(row['body'].decode()) * self.scale}")
        return answers
'''
# BaseHandler's own flow on a TorchScript model: preprocess -> inference -> postprocess.
BASE_HANDLER = '''
import torch
from ts.torch_handler.base_handler import BaseHandler


class Doubler(BaseHandler):
    def preprocess(self, data):
        return torch.tensor([[float(v) for v in row["body"].decode().split(",")] for row in data])
'''
KINDS = '''
def handle(data, context):
    if data is None:
        return None
    row = data[0]
    answer = {name: type(value).__name__ for name, value in row.items()}
    answer["text_value"] = row["text"] if isinstance(row["text"], str) else None
    answer["json_type"] = context.get_request_header(0, "json")["content-type"]
    answer["custom"] = context.get_request_header(0, "X-Custom")
    return [answer]
'''
PREDICTION_EXCEPTION = '''
from ts.utils.util import PredictionException


def handle(data, context):
    if data is not None:
        raise PredictionException("no such item", 422)
'''
WRONG_COUNT = '''
def handle(data, context):
    return [] if data is not None else None
'''


class Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def archive(tmp_path: Path, handler: str, name: str = "ranker", config: str | None = None,
            serialized: Path | None = None) -> MarModel:
    made = make_archive(tmp_path, name, handler, version="3.0", config=config, serialized=serialized)
    return open_mar(made, tmp_path / f"{name}-unpacked", 1 << 26)


def runtime(model: MarModel, batch_size: int = 8) -> HandlerRuntime:
    return HandlerRuntime(model.root, model.manifest.model_name, model.manifest.handler, batch_size)


def test_module_level_handle_gets_the_whole_batch(tmp_path: Path) -> None:
    handler = runtime(archive(tmp_path, MODULE_HANDLE, name="counter"))
    requests = [HandlerRequest({"body": ("", b"abc")}, request_id="a"),
                HandlerRequest({"data": ("image/png", b"hello")}, request_id="b")]
    responses = handler.run(requests)
    assert [json.loads(r.body) for r in responses] == [{"length": 3, "model": "counter", "batch": 2},
                                                        {"length": 5, "model": "counter", "batch": 2}]
    assert responses[0].body.startswith(b'{\n  "length"')  # JSON with TorchServe's indent of 2
    assert (responses[0].status, responses[0].content_type) == (200, None)  # no content type unless set
    assert handler.context.system_properties["batch_size"] == 8


def test_class_handler_with_yaml_manifest_headers_and_statuses(tmp_path: Path) -> None:
    model = archive(tmp_path, CLASS_HANDLER, config="batchSize: 4\nhandler:\n  scale: 10\n")
    handler = runtime(model, batch_size=model.config.batch_size)
    responses = handler.run([HandlerRequest({"body": ("", b"1.5")}, {"x-fail": "0"}, "r1"),
                             HandlerRequest({"body": ("", b"2")}, {"x-fail": "1"}, "r2")])
    assert [r.body for r in responses] == [b"3.0:15.0", b"3.0:20.0"]
    assert [(r.status, r.phrase, r.content_type) for r in responses] == [(200, "", "text/plain"),
                                                                         (418, "Teapot", "text/plain")]
    assert handler.context.request_ids == {0: "r1", 1: "r2"}


def test_base_handler_subclass_on_a_torchscript_model(tmp_path: Path) -> None:
    weights = tmp_path / "double.pt"
    torch.jit.script(Double()).save(str(weights))
    handler = runtime(archive(tmp_path, BASE_HANDLER, name="doubler", serialized=weights))
    responses = handler.run([HandlerRequest({"body": ("", b"1,2")}), HandlerRequest({"body": ("", b"0.5,-3")})])
    assert [json.loads(r.body) for r in responses] == [[2.0, 4.0], [1.0, -6.0]]  # BaseHandler's tolist()


def test_parameters_are_decoded_by_content_type_as_torchserve_does(tmp_path: Path) -> None:
    handler = runtime(archive(tmp_path, KINDS, name="kinds"))
    (response,) = handler.run([HandlerRequest({
        "json": ("application/json", b'{"a": [1, 2]}'), "bad_json": ("application/json", b"{nope"),
        "text": ("text/plain", "caf\u00e9".encode()), "raw": ("", b"\x00\x01"), "image": ("image/png", b"png"),
    }, {"X-Custom": "yes"})])
    assert json.loads(response.body) == {
        "json": "dict", "bad_json": "bytearray", "text": "str", "raw": "bytearray", "image": "bytearray",
        "text_value": "caf\u00e9", "json_type": "application/json", "custom": "yes",
    }
    raw = HandlerRuntime(handler.context.system_properties["model_dir"], "kinds", "handler.py", 1,
                         decode_input=False)  # decode_input_request=false: every parameter as bytes
    (response,) = raw.run([HandlerRequest({"json": ("application/json", b"{}"), "text": ("text/plain", b"t"),
                                           "bad_json": ("", b""), "raw": ("", b""), "image": ("", b"")})])
    assert json.loads(response.body)["json"] == "bytearray" and json.loads(response.body)["text"] == "bytearray"


def test_a_handler_that_returns_the_wrong_count_fails_every_request_naming_it(tmp_path: Path) -> None:
    handler = runtime(archive(tmp_path, WRONG_COUNT, name="short"))
    (response,) = handler.run([HandlerRequest({"body": ("", b"x")})])
    assert (response.error, response.status) == (True, 500)
    assert response.body == (b"handler 'handler.py' of model 'short' returned 0 response(s) for a batch of 1 "
                             b"request(s); a handler returns a list with one response per request")


def test_a_handler_that_raises_fails_its_batch_as_torchserve_does_and_the_next_batch_runs(tmp_path: Path) -> None:
    handler = runtime(archive(tmp_path, CLASS_HANDLER, config="handler:\n  scale: 1\n", name="fragile"))
    responses = handler.run([HandlerRequest({"body": ("", b"not a number")}), HandlerRequest({"body": ("", b"1")})])
    assert [(r.error, r.status) for r in responses] == [(True, 503), (True, 503)]
    assert responses[0].body.startswith(b"Prediction failed: handler 'handler.py' of model 'fragile' raised ValueError")
    assert handler.run([HandlerRequest({"body": ("", b"4")})])[0].body == b"3.0:4.0"


def test_prediction_exception_sets_the_status_and_message(tmp_path: Path) -> None:
    handler = runtime(archive(tmp_path, PREDICTION_EXCEPTION, name="picky"))
    (response,) = handler.run([HandlerRequest({"body": ("", b"x")})])
    assert (response.error, response.status, response.body) == (True, 422, b"no such item")


def test_intermediate_responses_reach_their_requests_as_the_handler_sends_them(tmp_path: Path) -> None:
    handler = runtime(archive(tmp_path, STREAMING.replace("PAUSE_S = 0.3", "PAUSE_S = 0"), name="streamer"))
    parts: list[tuple[int, HandlerResponse]] = []
    # Requests from tensor APIs have no ids (the second two share ""): each still gets its own parts.
    requests = [HandlerRequest({"body": ("", word)}, request_id=rid) for word, rid in
                ((b"a", "id-a"), (b"b", ""), (b"c", ""))]
    responses = handler.run(requests, lambda index, response: parts.append((index, response)))
    assert [(index, part.body) for index, part in parts] == [
        (index, f"{word}:{step};".encode()) for step in range(3) for index, word in enumerate("abc")]
    first = parts[0][1]
    assert (first.status, first.content_type, first.error) == (200, "text/plain", False)
    assert (first.headers["x-batch"], first.headers["ts_stream_next"]) == ("3", "true")
    assert [response.body for response in responses] == [b"a:done", b"b:done", b"c:done"]
    assert responses[0].headers["ts_stream_next"] == "false"  # the last part, as TorchServe's worker marks it

    parts.clear()  # a part for one request of the batch reaches that request only
    handler.run([HandlerRequest({"body": ("", b"x")}, request_id="1"),
                 HandlerRequest({"body": ("", b"solo")}, request_id="2")], lambda i, r: parts.append((i, r)))
    assert [(index, part.body) for index, part in parts] == [(1, b"solo:0;"), (1, b"solo:1;"), (1, b"solo:2;")]

    # Without a taker (a front-end that does not stream) the parts are dropped and the final answer is all.
    assert [r.body for r in handler.run([HandlerRequest({"body": ("", b"z")})])] == [b"z:done"]
