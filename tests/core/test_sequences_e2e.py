"""The sequence batcher end to end: one real server, tritonclient over HTTP and gRPC.

Models, built here:
- `accumulator` (ONNX, direct, 4 slots): START/END/READY (int32) and CORRID (uint64) control inputs and an
  implicit int32 state; OUTPUT is the sequence's running sum, FLAGS = START + 2*END + 4*READY, CORRID_OUT the id;
- `oneslot`: the same file with max_batch_size 1 (one slot) and a 300 ms idle timeout, for the backlog;
- `pystate` (Python, oldest): a string CORRID, bool START, and an fp32 [2] state;
- `plain`: an ONNX identity without a sequence batcher;
- `slotted`, `queued` (Python, direct, 4 slots) and `triton_slotted` (the same in Triton's Python API): a
  running total per batch row kept in the model, READY's column and the padding rows' contents returned;
- `filestate` (Python): a TYPE_STRING state whose initial value is an `initial_state` `data_file`;
- `stateful_ensemble` (accumulator, then plain) and `stateless_ensemble` (plain alone).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.onnx_models import ACCUMULATOR_CONTROLS as CONTROLS
from tests.onnx_models import accumulator_model, identity_model, write_model
from tests.server import ServerProcess

ACCUMULATOR_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: %d
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "FLAGS" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "CORRID_OUT" data_type: TYPE_UINT64 dims: [ 1 ] }
]
sequence_batching {
  max_sequence_idle_microseconds: %d
  direct { max_queue_delay_microseconds: 1000 }
%s
}
"""
PYSTATE_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "id" data_type: TYPE_STRING dims: [ 1 ] } ]
sequence_batching {
  oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 1000 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }
  ]
  state [ { input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_FP32 dims: [ 2 ]
            initial_state [ { name: "zeros" data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } ] } ]
}
"""
PYSTATE = """
import numpy as np

class Model:
    def execute(self, inputs):
        assert inputs["START"].dtype == np.bool_ and inputs["START"].shape == (len(inputs["x"]), 1)
        acc = inputs["ACC_IN"] + inputs["x"]
        return {"y": acc, "ACC_OUT": acc, "id": inputs["CORRID"]}
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sequence_repo")


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    repo = repository
    model = accumulator_model()
    write_model(repo, "accumulator", model, ACCUMULATOR_CONFIG % (4, 5_000_000, CONTROLS))
    write_model(repo, "oneslot", model, ACCUMULATOR_CONFIG % (1, 300_000, CONTROLS))
    write_model(repo, "reloaded", model, ACCUMULATOR_CONFIG % (4, 5_000_000, CONTROLS))
    write_model(repo, "plain", identity_model(TensorProto.INT32, dims=(1,)),
                'platform: "onnxruntime_onnx" max_batch_size: 4 '
                'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ] '
                'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]')
    (repo / "pystate" / "1").mkdir(parents=True)
    (repo / "pystate" / "config.pbtxt").write_text(PYSTATE_CONFIG)
    (repo / "pystate" / "1" / "model.py").write_text(PYSTATE)
    (repo / "pystate_shown" / "1").mkdir(parents=True)
    (repo / "pystate_shown" / "config.pbtxt").write_text(PYSTATE_CONFIG.replace(
        'output [ { name: "y"', 'output [ { name: "ACC_OUT" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "y"'))
    (repo / "pystate_shown" / "1" / "model.py").write_text(PYSTATE)
    (repo / "pinned" / "1").mkdir(parents=True)
    (repo / "pinned" / "config.pbtxt").write_text(PINNED_CONFIG)
    (repo / "pinned" / "1" / "model.py").write_text(PINNED)
    # `slotted` runs a lone request on the event loop (padded there), `queued` always on its instance's thread.
    for name, inline_us, code in (("slotted", 100_000, SLOTTED), ("queued", 0, SLOTTED),
                                  ("triton_slotted", 0, TRITON_SLOTTED)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(SLOTTED_CONFIG + INLINE % inline_us)
        (repo / name / "1" / "model.py").write_text(code)
    (repo / "filestate" / "1").mkdir(parents=True)
    (repo / "filestate" / "initial_state").mkdir()
    (repo / "filestate" / "initial_state" / "greeting").write_bytes(len(b"hello").to_bytes(4, "little") + b"hello")
    (repo / "filestate" / "config.pbtxt").write_text(FILESTATE_CONFIG)
    (repo / "filestate" / "1" / "model.py").write_text(FILESTATE)
    for name, config in (("stateful_ensemble", STATEFUL_ENSEMBLE), ("stateless_ensemble", STATELESS_ENSEMBLE)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
    process = ServerProcess(repo, "--model-control-mode", "explicit", "--load-model", "*").wait_ready()
    yield process
    process.stop()


PINNED_CONFIG = """
backend: "python"
max_batch_size: 2
instance_group [ { count: 2 } ]
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "total" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "instance" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
"""
# Keeps each sequence's total in the instance itself (no implicit state), as Triton's stateful Python models do.
PINNED = """
import numpy as np

class Model:
    def initialize(self, args):
        self.index = args["model_instance_index"]
        self.totals = {}

    def execute(self, inputs):
        totals = []
        for x, start, corrid in zip(inputs["x"], inputs["START"], inputs["CORRID"]):
            key = int(corrid[0])
            if key == 0:  # a padding row of a direct batch (core/sequence_slots.py): no sequence
                totals.append([0.0])
                continue
            self.totals[key] = (0.0 if start[0] else self.totals[key]) + float(x[0])
            totals.append([self.totals[key]])
        rows = len(totals)
        return {"total": np.array(totals, np.float32), "instance": np.full((rows, 1), self.index, np.int32)}
"""

SLOTTED_CONFIG = """
backend: "python"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "total" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "row" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "ready" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "padding" data_type: TYPE_INT32 dims: [ 1 ] }
]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  direct { }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
"""
INLINE = 'parameters { key: "inline_max_microseconds" value: { string_value: "%d" } }\n'
# A model of Triton's direct kind: it keeps each batch slot's running total in itself, by batch row, and trusts
# READY to tell a padding row. `ready` is the batch's READY column as a bit mask (bit i: row i), `padding` the
# sum of everything the padding rows carry (x, START, CORRID): 0 when they are clean.
SLOTTED = """
import numpy as np

class Model:
    def initialize(self, args):
        self.totals = np.zeros(4, np.int64)

    def execute(self, inputs):
        x, start, ready, corrid = (inputs[name][:, 0] for name in ("x", "START", "READY", "CORRID"))
        assert ready.dtype == np.bool_
        rows = len(x)
        for row in range(rows):
            if ready[row]:
                self.totals[row] = (0 if start[row] else self.totals[row]) + x[row]
        mask = sum(1 << row for row in range(rows) if ready[row])
        padding = int(x[~ready].sum() + start[~ready].sum() + corrid[~ready].sum())
        column = lambda values: np.asarray(values, np.int32).reshape(rows, 1)
        return {"total": column(self.totals[:rows]), "row": column(range(rows)),
                "ready": column([mask] * rows), "padding": column([padding] * rows)}
"""

# A TYPE_STRING state whose initial value is read from the model directory's initial_state/greeting.
FILESTATE_CONFIG = """
backend: "python"
max_batch_size: 2
input [ { name: "word" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "said" data_type: TYPE_STRING dims: [ 1 ] } ]
sequence_batching {
  state [ { input_name: "SAID_IN" output_name: "SAID_OUT" data_type: TYPE_STRING dims: [ 1 ]
            initial_state [ { name: "greeting" data_type: TYPE_STRING dims: [ 1 ] data_file: "greeting" } ] } ]
}
"""
FILESTATE = """
import numpy as np

class Model:
    def execute(self, inputs):
        said = np.array([[s[0] + b" " + w[0]] for s, w in zip(inputs["SAID_IN"], inputs["word"])], dtype=object)
        return {"said": said, "SAID_OUT": said}
"""

# An ensemble whose step is a sequence model (the sequence parameters pass to it), and one without any.
STATEFUL_ENSEMBLE = """
platform: "ensemble"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "DOUBLED" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "accumulator" model_version: -1 input_map { key: "INPUT" value: "IN" }
    output_map { key: "OUTPUT" value: "SUM" } },
  { model_name: "plain" model_version: -1 input_map { key: "INPUT0" value: "SUM" }
    output_map { key: "OUTPUT0" value: "DOUBLED" } }
] }
"""
STATELESS_ENSEMBLE = (
    'platform: "ensemble" max_batch_size: 4 input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ] '
    'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ] ensemble_scheduling { step [ { model_name: '
    '"plain" model_version: -1 input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } } ] }'
)

# The same in Triton's Python API: a batch's requests come one by one, the padding ones among them.
TRITON_SLOTTED = """
import numpy as np
import triton_python_backend_utils as pb_utils

def value(request, name):
    return int(pb_utils.get_input_tensor_by_name(request, name).as_numpy()[0, 0])

class TritonPythonModel:
    def initialize(self, args):
        self.totals = [0] * 4

    def execute(self, requests):
        ready = [bool(value(r, "READY")) for r in requests]
        mask = sum(1 << row for row, flag in enumerate(ready) if flag)
        padding = sum(value(r, "x") + value(r, "START") + value(r, "CORRID")
                      for r, flag in zip(requests, ready) if not flag)
        responses = []
        for row, (request, flag) in enumerate(zip(requests, ready)):
            if flag:
                self.totals[row] = (0 if value(request, "START") else self.totals[row]) + value(request, "x")
            outputs = [pb_utils.Tensor(name, np.array([[number]], np.int32)) for name, number in
                       (("total", self.totals[row]), ("row", row), ("ready", mask), ("padding", padding))]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
"""


def step(client: Any, module: Any, model: str, value: int, sequence_id: int | str, start: bool = False,
         end: bool = False) -> Any:
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], np.int32))
    return client.infer(model, [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end)


def summary(result: Any) -> tuple[int, int, int]:
    return (int(result.as_numpy("OUTPUT")[0, 0]), int(result.as_numpy("FLAGS")[0, 0]),
            int(result.as_numpy("CORRID_OUT")[0, 0]))


def test_interleaved_sequences_over_http_and_grpc(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.url)
    rpc = grpcclient.InferenceServerClient(server.grpc_url)
    big = 2**63 + 5  # past int64: JSON carries it as is
    try:
        assert summary(step(http, httpclient, "accumulator", 1, 11, start=True)) == (1, 1 + 4, 11)
        assert summary(step(rpc, grpcclient, "accumulator", 10, 12, start=True)) == (10, 5, 12)
        assert summary(step(http, httpclient, "accumulator", 100, big, start=True)) == (100, 5, big)
        assert summary(step(rpc, grpcclient, "accumulator", 2, 11)) == (3, 4, 11)
        assert summary(step(http, httpclient, "accumulator", 20, 12)) == (30, 4, 12)
        assert summary(step(rpc, grpcclient, "accumulator", 3, 11, end=True)) == (6, 2 + 4, 11)
        assert summary(step(http, httpclient, "accumulator", 200, big, end=True)) == (300, 6, big)
        assert summary(step(rpc, grpcclient, "accumulator", 30, 12, end=True)) == (60, 6, 12)
        # Ended: the id is free for a new sequence, which starts from the initial state.
        assert summary(step(http, httpclient, "accumulator", 7, 11, start=True, end=True)) == (7, 7, 11)
    finally:
        http.close()
        rpc.close()


def test_an_id_past_int64_over_grpc_uint64_param(server: ServerProcess) -> None:
    """tritonclient sends ids as int64_param; a client may send uint64_param, and ids up to 2**64-1 work."""
    sequence_id = 2**64 - 3
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for value, start, end, total in ((4, True, False, 4), (5, False, True, 9)):
            request = service_pb2.ModelInferRequest(model_name="accumulator")
            tensor = request.inputs.add(name="INPUT", datatype="INT32", shape=[1, 1])
            tensor.contents.int_contents.append(value)
            request.parameters["sequence_id"].uint64_param = sequence_id
            request.parameters["sequence_start"].bool_param = start
            request.parameters["sequence_end"].bool_param = end
            response = stub.ModelInfer(request)
            outputs = {o.name: raw for o, raw in zip(response.outputs, response.raw_output_contents)}
            assert np.frombuffer(outputs["OUTPUT"], np.int32).tolist() == [total]
            assert np.frombuffer(outputs["CORRID_OUT"], np.uint64).tolist() == [sequence_id]


def test_a_grpc_stream_of_interleaved_sequences_keeps_each_in_order(server: ServerProcess) -> None:
    """The way Triton's clients usually drive sequences: every request on one stream, none awaited."""
    answers: list[tuple[int, int]] = []
    finished = threading.Event()
    expected = 2 * 5

    def callback(result: Any, error: Any) -> None:
        answers.append((-1, -1) if error is not None else summary(result)[::2])
        if len(answers) == expected:
            finished.set()

    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback)
        for index in range(5):
            for sequence_id in (31, 32):
                tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
                tensor.set_data_from_numpy(np.array([[sequence_id - 30]], np.int32))
                client.async_stream_infer("accumulator", [tensor], sequence_id=sequence_id,
                                          sequence_start=index == 0, sequence_end=index == 4)
        assert finished.wait(10), answers
        client.stop_stream()
    finally:
        client.close()
    for sequence_id in (31, 32):
        step_value = sequence_id - 30
        assert [total for total, sid in answers if sid == sequence_id] == [step_value * n for n in range(1, 6)]


def test_a_sequence_keeps_to_its_instance_whose_own_state_it_needs(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.url)

    def send(x: float, sequence_id: int, start: bool = False) -> tuple[float, int]:
        tensor = httpclient.InferInput("x", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[x]], np.float32))
        result = http.infer("pinned", [tensor], sequence_id=sequence_id, sequence_start=start)
        return float(result.as_numpy("total")[0, 0]), int(result.as_numpy("instance")[0, 0])

    try:
        answers = [send(1, 41, start=True), send(10, 42, start=True), send(100, 43, start=True)]
        for _ in range(2):
            answers += [send(1, 41), send(10, 42), send(100, 43)]
    finally:
        http.close()
    assert [total for total, _ in answers] == [1, 10, 100, 2, 20, 200, 3, 30, 300]
    instances = [instance for _, instance in answers]
    assert instances == instances[:3] * 3 and len(set(instances[:3])) == 2  # each keeps its own; both used


def test_concurrent_sequences_keep_their_order(server: ServerProcess) -> None:
    errors: list[BaseException] = []

    def run(sequence_id: int) -> None:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            total = 0
            for index in range(1, 9):
                total += index * sequence_id
                result = step(client, grpcclient, "accumulator", index * sequence_id, sequence_id,
                              start=index == 1, end=index == 8)
                assert summary(result)[0] == total
        except BaseException as exc:  # noqa: BLE001 - re-raised on the test's thread
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(101, 107)]  # 6 sequences, 4 slots
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors


def test_python_model_with_string_ids_and_implicit_state(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.url)
    rpc = grpcclient.InferenceServerClient(server.grpc_url)

    def send(client: Any, module: Any, x: list[float], sequence_id: str, **flags: bool) -> tuple[list[float], bytes]:
        tensor = module.InferInput("x", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.array([x], np.float32))
        result = client.infer("pystate", [tensor], sequence_id=sequence_id, **flags)
        return result.as_numpy("y")[0].tolist(), result.as_numpy("id")[0, 0]

    try:
        assert send(http, httpclient, [1, 2], "alpha", sequence_start=True) == ([1, 2], b"alpha")
        assert send(rpc, grpcclient, [5, 5], "beta", sequence_start=True) == ([5, 5], b"beta")
        assert send(rpc, grpcclient, [1, 1], "alpha") == ([2, 3], b"alpha")
        assert send(http, httpclient, [1, 1], "beta", sequence_end=True) == ([6, 6], b"beta")
        # A second START of an open sequence begins it anew (Triton ends the earlier one early).
        assert send(http, httpclient, [4, 4], "alpha", sequence_start=True) == ([4, 4], b"alpha")
        assert send(rpc, grpcclient, [1, 0], "alpha", sequence_end=True) == ([5, 4], b"alpha")
    finally:
        http.close()
        rpc.close()


def test_a_state_output_the_config_lists_as_an_output_may_be_asked_for(server: ServerProcess) -> None:
    # As Triton (qa/L0_implicit_state test_request_output, test_request_output_not_allowed).
    client = httpclient.InferenceServerClient(server.url)

    def send(model: str, x: list[float], names: list[str], **flags: bool) -> httpclient.InferResult:
        tensor = httpclient.InferInput("x", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.array([x], np.float32))
        return client.infer(model, [tensor], outputs=[httpclient.InferRequestedOutput(n) for n in names],
                            sequence_id="shown", **flags)

    try:
        first = send("pystate_shown", [1, 2], ["ACC_OUT", "y"], sequence_start=True)
        assert first.as_numpy("ACC_OUT").tolist() == [[1, 2]] and first.as_numpy("y").tolist() == [[1, 2]]
        second = send("pystate_shown", [1, 1], ["y"])
        assert second.as_numpy("y").tolist() == [[2, 3]] and second.as_numpy("ACC_OUT") is None
        third = send("pystate_shown", [1, 1], ["ACC_OUT"], sequence_end=True)  # the state went on meanwhile
        assert third.as_numpy("ACC_OUT").tolist() == [[3, 4]] and third.as_numpy("y") is None
        message = error_of(send, "pystate", [1, 2], ["ACC_OUT"], sequence_start=True, sequence_end=True)
        assert "unexpected inference output 'ACC_OUT' for model 'pystate'" in message
    finally:
        client.close()


def error_of(call: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(InferenceServerException) as caught:
        call(*args, **kwargs)
    return str(caught.value.message())


def test_refused_requests(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.url)
    rpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for client, module in ((http, httpclient), (rpc, grpcclient)):
            assert error_of(step, client, module, "accumulator", 1, 0) == (
                "inference request to model 'accumulator' must specify a non-zero or non-empty correlation ID")
            assert error_of(step, client, module, "accumulator", 1, 999) == (
                "inference request for sequence 999 to model 'accumulator' must specify the START flag on the "
                "first request of the sequence")
            tensor = module.InferInput("INPUT0", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[1]], np.int32))
            assert error_of(client.infer, "plain", [tensor], sequence_id=5,
                            sequence_start=True) == (
                "request parameter 'sequence_id' is for sequence models; model 'plain' has no sequence_batching "
                "in its configuration")
            tensor = module.InferInput("INPUT", [2, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[1], [2]], np.int32))
            assert "must specify batch-size 1" in error_of(
                client.infer, "accumulator", [tensor], sequence_id=7, sequence_start=True)
        assert "is a string, but this model's CONTROL_SEQUENCE_CORRID is uint64" in error_of(
            step, http, httpclient, "accumulator", 1, "text", start=True)
        body = {"inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [1]}],
                "parameters": {"sequence_id": 3, "sequence_start": "yes"}}
        answer = requests.post(f"{server.base}/v2/models/accumulator/infer", json=body, timeout=10)
        assert answer.status_code == 400
        assert answer.json()["error"] == "request parameter 'sequence_start' must be a boolean, got 'yes'"
        # The control and state inputs are the server's: the model's metadata lists the client's input only.
        metadata = http.get_model_metadata("accumulator")
        assert [i["name"] for i in metadata["inputs"]] == ["INPUT"]
        assert [o["name"] for o in metadata["outputs"]] == ["OUTPUT", "FLAGS", "CORRID_OUT"]
    finally:
        http.close()
        rpc.close()


def test_backlog_waits_for_a_slot_and_idle_sequences_are_released(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.url)
    try:
        assert summary(step(http, httpclient, "oneslot", 1, 1, start=True))[0] == 1  # takes the only slot
        done: list[tuple[int, float]] = []
        started = time.monotonic()

        def second() -> None:
            client = httpclient.InferenceServerClient(server.url)
            try:
                done.append((summary(step(client, httpclient, "oneslot", 5, 2, start=True))[0],
                             time.monotonic() - started))
            finally:
                client.close()

        waiter = threading.Thread(target=second)
        waiter.start()
        waiter.join(5)
        # Sequence 2 waited in the backlog until sequence 1, abandoned, idled out (300 ms) and freed the slot.
        assert done and done[0][0] == 5 and done[0][1] >= 0.25, done
        assert error_of(step, http, httpclient, "oneslot", 1, 1).startswith(
            "inference request for sequence 1 to model 'oneslot' must specify the START flag")
        assert summary(step(http, httpclient, "oneslot", 1, 2, end=True))[0] == 6
    finally:
        http.close()


def test_a_reload_finishes_open_sequences_on_the_old_version(server: ServerProcess, repository: Path) -> None:
    http = httpclient.InferenceServerClient(server.url)

    def version_and_summary(value: int, sequence_id: int, **flags: bool) -> tuple[str, tuple[int, int, int]]:
        result = step(http, httpclient, "reloaded", value, sequence_id, **flags)
        return result.get_response()["model_version"], summary(result)

    try:
        assert version_and_summary(1, 21, start=True) == ("1", (1, 5, 21))
        # Version 2 answers READY with 8 where version 1 answers 4.
        write_model(repository, "reloaded", accumulator_model(ready=8), None, version=2)
        http.load_model("reloaded")
        assert version_and_summary(2, 21) == ("1", (3, 4, 21))  # goes on where it started
        assert version_and_summary(10, 22, start=True) == ("2", (10, 9, 22))  # a new one starts on the new
        assert version_and_summary(3, 21, end=True) == ("1", (6, 6, 21))
        assert version_and_summary(20, 22, end=True) == ("2", (30, 10, 22))
        assert error_of(step, http, httpclient, "reloaded", 1, 21).startswith(
            "inference request for sequence 21 to model 'reloaded' must specify the START flag")
    finally:
        http.close()


def slotted_step(client: Any, module: Any, value: int, sequence_id: int, start: bool = False,
                 end: bool = False, model: str = "slotted") -> tuple[int, int, int, int]:
    """(total, row, READY mask, padding sum) of one request to `slotted` (or `queued`)."""
    tensor = module.InferInput("x", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], np.int32))
    result = client.infer(model, [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end)
    return tuple(int(result.as_numpy(name)[0, 0]) for name in ("total", "row", "ready", "padding"))  # type: ignore


def test_direct_puts_each_sequence_at_its_slots_batch_row_with_not_ready_padding(server: ServerProcess) -> None:
    """One request at a time: each runs on the event loop (`slotted` allows it), padded up to its row there."""
    http = httpclient.InferenceServerClient(server.url)
    try:
        # Three sequences take slots 0, 1, 2 of the one instance, in turn.
        assert slotted_step(http, httpclient, 5, 61, start=True) == (5, 0, 0b1, 0)
        assert slotted_step(http, httpclient, 7, 62, start=True) == (7, 1, 0b10, 0)  # row 0 padded, not ready
        assert slotted_step(http, httpclient, 9, 63, start=True) == (9, 2, 0b100, 0)
        assert slotted_step(http, httpclient, 1, 63) == (10, 2, 0b100, 0)  # its total: the model's row 2 state
        assert slotted_step(http, httpclient, 1, 61, end=True) == (6, 0, 0b1, 0)  # slot 0 frees
        assert slotted_step(http, httpclient, 2, 62) == (9, 1, 0b10, 0)
        # A new sequence takes the lowest free slot (Triton's order): the freed 0, then 3.
        assert slotted_step(http, httpclient, 4, 64, start=True) == (4, 0, 0b1, 0)
        assert slotted_step(http, httpclient, 3, 65, start=True) == (3, 3, 0b1000, 0)
        for sequence_id in (62, 63, 64, 65):
            slotted_step(http, httpclient, 0, sequence_id, end=True)
    finally:
        http.close()


def test_direct_interleaved_sequences_batch_by_slot(server: ServerProcess) -> None:
    """Four sequences at once over gRPC: batches hold several of them, each always at its own row, so the
    per-row totals the model keeps are each sequence's own."""
    errors: list[BaseException] = []
    seen: list[tuple[int, int, int]] = []  # (sequence, row, READY mask)

    def run(sequence_id: int) -> None:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            expected = 0
            for index in range(12):
                value = sequence_id * 100 + index
                expected += value
                total, row, mask, padding = slotted_step(client, grpcclient, value, sequence_id, start=index == 0,
                                                         end=index == 11, model="queued")
                assert (total, padding) == (expected, 0) and mask >> row & 1
                seen.append((sequence_id, row, mask))
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=run, args=(sequence_id,)) for sequence_id in (71, 72, 73, 74)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    rows = {sequence_id: {row for sid, row, _ in seen if sid == sequence_id} for sequence_id in (71, 72, 73, 74)}
    assert all(len(found) == 1 for found in rows.values()) and len({*map(min, rows.values())}) == 4
    assert any(bin(mask).count("1") > 1 for _, _, mask in seen)  # some batches held several sequences


def test_a_string_state_starts_from_its_initial_state_data_file(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.url)

    def say(word: bytes, sequence_id: int, start: bool = False) -> bytes:
        tensor = httpclient.InferInput("word", [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[word]], dtype=object))
        return http.infer("filestate", [tensor], sequence_id=sequence_id, sequence_start=start).as_numpy("said")[0, 0]

    try:
        assert say(b"big", 81, start=True) == b"hello big"
        assert say(b"new", 82, start=True) == b"hello new"
        assert say(b"world", 81) == b"hello big world"
        assert say(b"day", 82) == b"hello new day"
    finally:
        http.close()


def test_an_ensemble_passes_its_sequence_to_its_sequence_step(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.url)
    rpc = grpcclient.InferenceServerClient(server.grpc_url)

    def send(client: Any, module: Any, model: str, value: int, **sequence: Any) -> Any:
        tensor = module.InferInput("IN", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[value]], np.int32))
        return client.infer(model, [tensor], **sequence)

    try:
        # Two interleaved sequences through the ensemble, one over each protocol: each keeps its own sum.
        sums = []
        for index, value in enumerate((1, 2, 3)):
            for client, module, sequence_id in ((http, httpclient, 91), (rpc, grpcclient, 92)):
                result = send(client, module, "stateful_ensemble", value * sequence_id, sequence_id=sequence_id,
                              sequence_start=index == 0, sequence_end=index == 2)
                sums.append(int(result.as_numpy("SUM")[0, 0]))
                assert int(result.as_numpy("DOUBLED")[0, 0]) == sums[-1]  # the next, stateless, step ran too
        assert sums == [91, 92, 91 * 3, 92 * 3, 91 * 6, 92 * 6]
        assert error_of(send, http, httpclient, "stateful_ensemble", 1, sequence_id=91) == (
            "ensemble 'stateful_ensemble' step 1 (model 'accumulator'): inference request for sequence 91 to "
            "model 'accumulator' must specify the START flag on the first request of the sequence")
        assert "must specify a non-zero or non-empty correlation ID" in error_of(
            send, http, httpclient, "stateful_ensemble", 1)
        for client, module in ((http, httpclient), (rpc, grpcclient)):
            assert error_of(send, client, module, "stateless_ensemble", 1, sequence_id=5, sequence_start=True) == (
                "request parameter 'sequence_id' is for sequence models; ensemble 'stateless_ensemble' has no step "
                "whose model has sequence_batching")
        assert int(send(http, httpclient, "stateless_ensemble", 4).as_numpy("OUT")[0, 0]) == 4
    finally:
        http.close()
        rpc.close()


def test_direct_hands_a_triton_python_model_its_padding_rows_as_requests(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.url)
    try:
        assert slotted_step(http, httpclient, 5, 101, start=True, model="triton_slotted") == (5, 0, 0b1, 0)
        assert slotted_step(http, httpclient, 7, 102, start=True, model="triton_slotted") == (7, 1, 0b10, 0)
        assert slotted_step(http, httpclient, 2, 101, model="triton_slotted") == (7, 0, 0b1, 0)
        assert slotted_step(http, httpclient, 1, 102, end=True, model="triton_slotted") == (8, 1, 0b10, 0)
        slotted_step(http, httpclient, 0, 101, end=True, model="triton_slotted")
    finally:
        http.close()
