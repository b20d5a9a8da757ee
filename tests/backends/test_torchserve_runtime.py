"""TorchServe handlers, unmodified, in archives built by the real torch-model-archiver and opened by
store/mar.py, run by HandlerRuntime (backends/torchserve/runtime.py) as TorchServe's worker runs them."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("ts")
torch = pytest.importorskip("torch")

from modelhost.backends.torchserve.runtime import HandlerRequest, HandlerRuntime  # noqa: E402
from modelhost.errors import ErrorKind, ModelhostError  # noqa: E402
from modelhost.store.mar import MarModel, open_mar  # noqa: E402

# A module-level entry point, as TorchServe's custom_service.md writes one.
MODULE_HANDLE = '''
def handle(data, context):
    if data is None:  # TorchServe calls it once at load with no data
        return None
    return [{"length": len(row.get("body") or row.get("data")), "model": context.model_name,
             "batch": len(data)} for row in data]
'''
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
WRONG_COUNT = '''
def handle(data, context):
    return [] if data is not None else None
'''


class Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def archive(tmp_path: Path, handler: str, name: str = "ranker", config: str | None = None,
            serialized: Path | None = None) -> MarModel:
    source = tmp_path / f"{name}-source"
    source.mkdir()
    (source / "handler.py").write_text(textwrap.dedent(handler))
    command = ["torch-model-archiver", "--model-name", name, "--version", "3.0", "--handler",
               str(source / "handler.py"), "--export-path", str(tmp_path)]
    if config is not None:
        (source / "model-config.yaml").write_text(config)
        command += ["--config-file", str(source / "model-config.yaml")]
    if serialized is not None:
        command += ["--serialized-file", str(serialized)]
    subprocess.run(command, check=True, capture_output=True)
    return open_mar(tmp_path / f"{name}.mar", tmp_path / f"{name}-unpacked", 1 << 26)


def runtime(model: MarModel, batch_size: int = 8) -> HandlerRuntime:
    return HandlerRuntime(model.root, model.manifest.model_name, model.manifest.handler, batch_size)


def test_module_level_handle_gets_the_whole_batch(tmp_path: Path) -> None:
    handler = runtime(archive(tmp_path, MODULE_HANDLE, name="counter"))
    requests = [HandlerRequest({"body": bytearray(b"abc")}, request_id="a"),
                HandlerRequest({"data": b"hello"}, request_id="b")]
    responses = handler.run(requests)
    assert [json.loads(r.body) for r in responses] == [{"length": 3, "model": "counter", "batch": 2},
                                                        {"length": 5, "model": "counter", "batch": 2}]
    assert responses[0].body.startswith(b'{\n  "length"')  # JSON with TorchServe's indent of 2
    assert (responses[0].status, responses[0].content_type) == (200, None)  # no content type unless set
    assert handler.context.system_properties["batch_size"] == 8


def test_class_handler_with_yaml_manifest_headers_and_statuses(tmp_path: Path) -> None:
    model = archive(tmp_path, CLASS_HANDLER, config="batchSize: 4\nhandler:\n  scale: 10\n")
    handler = runtime(model, batch_size=model.config.batch_size)
    responses = handler.run([HandlerRequest({"body": b"1.5"}, {"x-fail": "0"}, "r1"),
                             HandlerRequest({"body": b"2"}, {"x-fail": "1"}, "r2")])
    assert [r.body for r in responses] == [b"3.0:15.0", b"3.0:20.0"]
    assert [(r.status, r.phrase, r.content_type) for r in responses] == [(200, "", "text/plain"),
                                                                         (418, "Teapot", "text/plain")]
    assert handler.context.request_ids == {0: "r1", 1: "r2"}


def test_base_handler_subclass_on_a_torchscript_model(tmp_path: Path) -> None:
    weights = tmp_path / "double.pt"
    torch.jit.script(Double()).save(str(weights))
    handler = runtime(archive(tmp_path, BASE_HANDLER, name="doubler", serialized=weights))
    responses = handler.run([HandlerRequest({"body": b"1,2"}), HandlerRequest({"body": b"0.5,-3"})])
    assert [json.loads(r.body) for r in responses] == [[2.0, 4.0], [1.0, -6.0]]  # BaseHandler's tolist()


def test_a_handler_that_returns_the_wrong_count_is_an_error_naming_it(tmp_path: Path) -> None:
    handler = runtime(archive(tmp_path, WRONG_COUNT, name="short"))
    with pytest.raises(ModelhostError) as caught:
        handler.run([HandlerRequest({"body": b"x"})])
    assert caught.value.kind is ErrorKind.INTERNAL
    assert caught.value.message == ("handler 'handler.py' of model 'short' returned 0 response(s) for a batch of 1 "
                                    "request(s); a handler returns a list with one per request")


def test_a_handler_that_raises_is_an_error_naming_it_and_the_next_batch_runs(tmp_path: Path) -> None:
    handler = runtime(archive(tmp_path, CLASS_HANDLER, config="handler:\n  scale: 1\n", name="fragile"))
    with pytest.raises(ModelhostError, match=r"handler 'handler.py' of model 'fragile' failed: ValueError"):
        handler.run([HandlerRequest({"body": b"not a number"})])
    assert handler.run([HandlerRequest({"body": b"4"})])[0].body == b"3.0:4.0"
