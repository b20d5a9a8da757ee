"""Triton Python-backend model.py files (`TritonPythonModel`, `import triton_python_backend_utils as pb_utils`)
served as they are, end to end: one server (module scope), tritonclient over HTTP and gRPC.

The models are written in the style of python_backend's examples (add_sub, bls, decoupled repeat):
- `add_sub`: OUTPUT0 = INPUT0 + INPUT1 (+ the request's parameter `offset`), OUTPUT1 = INPUT0 - INPUT1, dtypes
  read from the config with get_output_config_by_name / triton_string_to_numpy; an INPUT0 of all -1 answers an
  InferenceResponse(error=...) with INVALID_ARG (naming the request's id), an INPUT0 of all -2 raises in execute;
- `per_request`: dynamic batching; each response says how many requests its execute got (the requests of a batch
  come one by one, each with its own batch dimension);
- `bls`: calls add_sub with InferenceRequest(...).exec(), and with async_exec() from `async def execute`, or
  repeat with exec(decoupled=True);
- `add_sub_isolated`, `repeat_isolated`, `bls_isolated`: the same model.py files, each instance in a worker process;
- `auto_add_sub`, `auto_isolated`, `auto_no_config`: add_sub whose config.pbtxt lists no tensors (or which has no
  config.pbtxt): its auto_complete_config adds them, max_batch_size 8 and dynamic batching; `auto_conflict`: its
  config.pbtxt says INPUT0 is INT32, which auto_complete_config contradicts (the load fails, as in Triton);
- `metrics`, `metrics_isolated`: count their requests, keep the last value and observe each value in custom metrics
  (pb_utils.MetricFamily), labelled by model;
- `loader` (and `loader_isolated`, test_triton_model_loading_api.py's): run the model loading API on the ACTION
  they get ("ready m", "load m", "unload m", "upload m": load m from a config and a model.py it sends) and answer
  what it returned or raised;
- `repeat`: decoupled; sends IN's elements one response each from a thread of its own, then the final flag
  alone; at an element -n it waits until request.is_cancelled(), then writes the file cancelled<n>; more than
  4 elements raise a TritonError (INVALID_ARG).
"""

from __future__ import annotations

import json
import queue
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.backends.test_python_server import write_model
from tests.server import ServerProcess, wait_for

ADD_SUB_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
ADD_SUB = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        self.name = args["model_name"]
        out0 = pb_utils.get_output_config_by_name(self.model_config, "OUTPUT0")
        out1 = pb_utils.get_output_config_by_name(self.model_config, "OUTPUT1")
        self.dtype0 = pb_utils.triton_string_to_numpy(out0["data_type"])
        self.dtype1 = pb_utils.triton_string_to_numpy(out1["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            if (in0 == -2).all():
                raise ValueError("INPUT0 of -2 breaks this model")
            if (in0 == -1).all():
                where = f" in request {request.request_id()}" if request.request_id() else ""
                error = pb_utils.TritonError("INPUT0 must not be all -1" + where, pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            offset = json.loads(request.parameters()).get("offset", 0)
            out0 = pb_utils.Tensor("OUTPUT0", (in0 + in1 + offset).astype(self.dtype0))
            out1 = pb_utils.Tensor("OUTPUT1", (in0 - in1).astype(self.dtype1))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out0, out1]))
        return responses

    def finalize(self):
        pb_utils.Logger.log_info(f"{self.name} finalized")
"""
PER_REQUEST_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "requests" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 200000 }
"""
PER_REQUEST = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        count = len(requests)
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            out = np.full(x.shape, count * 100 + x.shape[0], np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("requests", out)]))
        return responses
"""
ONE_ROW = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("requests", np.full((1,), 7, np.int32))])
                for _ in requests]
"""
ASKED_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "A" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "B" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 300000 }
"""
ASKED = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            names = request.requested_output_names()
            rows = pb_utils.get_input_tensor_by_name(request, "x").as_numpy().shape[0]
            out = np.full((rows, 1), len(requests) * 10 + len(names), np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(name, out) for name in names]))
        return responses
"""
BLS_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "MODE" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
BLS = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
            if mode == "stream":  # a decoupled model's responses: OUTPUT0 is the sum of their OUTs
                in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy().astype(np.int32)
                call = pb_utils.InferenceRequest(model_name="repeat", requested_output_names=["OUT"],
                                                 inputs=[pb_utils.Tensor("IN", in0)])
                outs = [pb_utils.get_output_tensor_by_name(r, "OUT").as_numpy()[0]
                        for r in call.exec(decoupled=True) if r.output_tensors()]
                total = np.full(4, sum(outs) * 100 + len(outs), np.float32)
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", total)]))
                continue
            call = pb_utils.InferenceRequest(
                model_name="add_sub" if mode != "missing" else "no_such_model",
                requested_output_names=["OUTPUT1"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                        pb_utils.get_input_tensor_by_name(request, "INPUT1")])
            answer = await call.async_exec() if mode == "async" else call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            out = pb_utils.get_output_tensor_by_name(answer, "OUTPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out * 10)]))
        return responses
"""
REPEAT_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]
"""
REPEAT = """
import threading
import time
from pathlib import Path
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.directory = Path(args["model_repository"])

    def execute(self, requests):
        for request in requests:
            if pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().size > 4:
                raise pb_utils.TritonError("IN holds at most 4 values", pb_utils.TritonError.INVALID_ARG)
            threading.Thread(target=self.send, args=(request,), daemon=True).start()
        return None

    def send(self, request):
        sender = request.get_response_sender()
        values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        for index, value in enumerate(values):
            if value < 0:  # a slow, long stream: stops when the client goes away
                while not request.is_cancelled():
                    time.sleep(0.01)
                (self.directory / f"cancelled{-value}").write_text("")
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            out = pb_utils.Tensor("OUT", np.array([value], np.int32))
            idx = pb_utils.Tensor("IDX", np.array([index], np.uint32))
            sender.send(pb_utils.InferenceResponse([out, idx]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""
AUTO_COMPLETE = ADD_SUB.replace("class TritonPythonModel:\n", """class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        import os, pathlib
        pathlib.Path(__file__).parent.parent.joinpath("completed_in").write_text(str(os.getpid()))
        assert auto_complete_model_config.as_dict()["name"]
        for name in ("INPUT0", "INPUT1"):
            auto_complete_model_config.add_input({"name": name, "data_type": "TYPE_FP32", "dims": [4]})
        for name in ("OUTPUT0", "OUTPUT1"):
            auto_complete_model_config.add_output({"name": name, "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.set_max_batch_size(8)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

""")
AUTO_CONFLICT_CONFIG = """
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]
"""
METRICS_CONFIG = """
backend: "python"
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ] output [ { name: "count" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
METRICS = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        labels = {"model": args["model_name"]}
        self.families = [
            pb_utils.MetricFamily(name="custom_requests", description="Requests the model saw",
                                  kind=pb_utils.MetricFamily.COUNTER),
            pb_utils.MetricFamily(name="custom_last_value", description="The last value",
                                  kind=pb_utils.MetricFamily.GAUGE),
            pb_utils.MetricFamily(name="custom_value", description="Values seen",
                                  kind=pb_utils.MetricFamily.HISTOGRAM)]
        self.requests = self.families[0].Metric(labels=labels)
        self.last = self.families[1].Metric(labels=labels)
        self.values = self.families[2].Metric(labels=labels, buckets=[1, 2.5, 10])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = float(pb_utils.get_input_tensor_by_name(request, "x").as_numpy()[0])
            self.requests.increment(1)
            self.last.set(x)
            self.values.observe(x)
            try:
                self.requests.set(0)
            except pb_utils.TritonModelException:
                pass
            else:
                raise AssertionError("a counter cannot be set")
            count = np.array([self.requests.value()], np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("count", count)]))
        return responses
"""
LOADER_CONFIG = """
backend: "python"
input [ { name: "ACTION" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "RESULT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
LOADER = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            action, name = pb_utils.get_input_tensor_by_name(request, "ACTION").as_numpy()[0].decode().split()
            try:
                if action == "ready":
                    result = str(pb_utils.is_model_ready(name))
                elif action == "load":
                    result = str(pb_utils.load_model(model_name=name))
                elif action == "unload":
                    result = str(pb_utils.unload_model(name))
                else:
                    tensor = {"data_type": "TYPE_FP32", "dims": [1]}
                    config = json.dumps({"backend": "python", "input": [{"name": "x", **tensor}],
                                         "output": [{"name": "y", **tensor}]})
                    code = b"class Model:\\n    def execute(self, inputs):\\n        return {'y': inputs['x']}\\n"
                    result = str(pb_utils.load_model(name, config=config, files={"file:1/model.py": code}))
            except pb_utils.TritonModelException as exc:
                result = "error: " + str(exc)
            out = pb_utils.Tensor("RESULT", np.array([result.encode()], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""

ISOLATED = 'parameters { key: "isolation" value: { string_value: "process" } }\n'


PARAMETERS_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "KEYS" data_type: TYPE_STRING dims: [ -1 ] } ]
"""
PARAMETERS = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        keys = [sorted(json.loads(request.parameters())) for request in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("KEYS", np.array(k or [""], dtype=object))]) for k in keys]
"""

PARAMETERS_ENSEMBLE_CONFIG = """
platform: "ensemble"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "KEYS" data_type: TYPE_STRING dims: [ -1 ] } ]
ensemble_scheduling { step [ { model_name: "parameters" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "KEYS" value: "KEYS" } } ] }
"""
PARTIAL_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 1 ] optional: true } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
PARTIAL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):  # an output for each input given, as Triton's qa/L0_optional_input's model
        responses = []
        for request in requests:
            given = [(i, pb_utils.get_input_tensor_by_name(request, f"INPUT{i}")) for i in (0, 1)]
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor(f"OUTPUT{i}", t.as_numpy() * 2) for i, t in given if t is not None]))
        return responses
"""
PARTIAL_ENSEMBLE_CONFIG = """
platform: "ensemble"
max_batch_size: 0
input [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
        { name: "B" data_type: TYPE_FP32 dims: [ 1 ] optional: true } ]
output [ { name: "C" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "D" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "partial" model_version: -1
    input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
    output_map { key: "OUTPUT0" value: "a2" } output_map { key: "OUTPUT1" value: "b2" } },
  { model_name: "partial" model_version: -1
    input_map { key: "INPUT0" value: "a2" } input_map { key: "INPUT1" value: "b2" }
    output_map { key: "OUTPUT0" value: "C" } output_map { key: "OUTPUT1" value: "D" } } ] }
"""
SEQUENCE_CONFIG = """
backend: "python"
max_batch_size: 0
sequence_batching { max_sequence_idle_microseconds: 60000000 }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "WHO" data_type: TYPE_STRING dims: [ 3 ] } ]
"""
SEQUENCE = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("WHO", np.array(
            [str(r.correlation_id()), str(r.flags()), str(r.timeout())], dtype=object))]) for r in requests]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("triton_python_repo")
    write_model(repo, "add_sub", ADD_SUB_CONFIG, ADD_SUB)
    write_model(repo, "parameters", PARAMETERS_CONFIG, PARAMETERS)
    write_model(repo, "partial", PARTIAL_CONFIG, PARTIAL)
    write_model(repo, "sequence_who", SEQUENCE_CONFIG, SEQUENCE)
    write_model(repo, "sequence_who_isolated", SEQUENCE_CONFIG + ISOLATED, SEQUENCE)
    (repo / "partial_ensemble" / "1").mkdir(parents=True)
    (repo / "partial_ensemble" / "config.pbtxt").write_text(PARTIAL_ENSEMBLE_CONFIG)
    (repo / "parameters_ensemble" / "1").mkdir(parents=True)
    (repo / "parameters_ensemble" / "config.pbtxt").write_text(PARAMETERS_ENSEMBLE_CONFIG)
    write_model(repo, "per_request", PER_REQUEST_CONFIG, PER_REQUEST)
    write_model(repo, "asked", ASKED_CONFIG, ASKED)
    write_model(repo, "one_row", PER_REQUEST_CONFIG, ONE_ROW)
    write_model(repo, "asked_isolated", ASKED_CONFIG + ISOLATED, ASKED)
    write_model(repo, "bls", BLS_CONFIG, BLS)
    write_model(repo, "repeat", REPEAT_CONFIG, REPEAT)
    write_model(repo, "add_sub_isolated", ADD_SUB_CONFIG + ISOLATED, ADD_SUB)
    write_model(repo, "repeat_isolated", REPEAT_CONFIG + ISOLATED, REPEAT)
    write_model(repo, "bls_isolated", BLS_CONFIG + ISOLATED, BLS)
    write_model(repo, "loader", LOADER_CONFIG, LOADER)
    write_model(repo, "metrics", METRICS_CONFIG, METRICS)
    write_model(repo, "metrics_isolated", METRICS_CONFIG + ISOLATED, METRICS)
    write_model(repo, "auto_add_sub", 'backend: "python"\n', AUTO_COMPLETE)
    write_model(repo, "auto_isolated", 'backend: "python"\n' + ISOLATED, AUTO_COMPLETE)
    write_model(repo, "auto_conflict", AUTO_CONFLICT_CONFIG, AUTO_COMPLETE)
    write_model(repo, "auto_no_config", "", AUTO_COMPLETE)
    (repo / "auto_no_config" / "config.pbtxt").unlink()
    process = ServerProcess(repo)
    process.repository = repo
    try:
        yield process.wait_ready()
    finally:
        process.stop()


def _add_sub_inputs(module: Any, in0: np.ndarray) -> list[Any]:
    inputs = [module.InferInput("INPUT0", [4], "FP32"), module.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(in0)
    inputs[1].set_data_from_numpy(np.ones(4, np.float32))
    return inputs


@pytest.mark.parametrize(("module", "model"), [(httpclient, "add_sub"), (grpcclient, "add_sub"),
                                               (httpclient, "add_sub_isolated")], ids=["http", "grpc", "isolated"])
def test_add_sub(server: ServerProcess, module: Any, model: str) -> None:
    client = module.InferenceServerClient(server.url if module is httpclient else server.grpc_url)
    in0 = np.arange(4, dtype=np.float32)
    result = client.infer(model, _add_sub_inputs(module, in0))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), in0 + 1)
    result = client.infer(model, _add_sub_inputs(module, in0), parameters={"offset": 10})  # request.parameters()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), in0 + 11)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), in0 - 1)


@pytest.mark.parametrize("model", ["parameters", "parameters_ensemble"])
@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_model_sees_the_requests_own_parameters_not_those_the_server_reads(server: ServerProcess, module: Any,
                                                                            model: str) -> None:
    """As Triton (its qa/L0_parameters): sequence, priority, timeout and binary_data_output are the server's; the
    rest reach the model, through an ensemble's steps too."""
    client = module.InferenceServerClient(server.url if module is httpclient else server.grpc_url)
    inputs = [module.InferInput("INPUT0", [1], "FP32")]
    inputs[0].set_data_from_numpy(np.ones(1, np.float32))
    result = client.infer(model, inputs, parameters={"key1": 1, "key2": "two"}, priority=1, timeout=10**7)
    assert result.as_numpy("KEYS").tolist() == [b"key1", b"key2"]


@pytest.mark.parametrize(("model", "given", "answered"), [("partial", "INPUT0", "OUTPUT0"),
                                                          ("partial_ensemble", "A", "C"),
                                                          ("partial_ensemble", "B", "D")])
def test_a_response_may_hold_some_outputs(server: ServerProcess, model: str, given: str, answered: str) -> None:
    """As Triton: the outputs a Triton Python model leaves out are absent from the answer, and an ensemble's
    later step takes them as missing optional inputs (its qa/L0_optional_input)."""
    client = httpclient.InferenceServerClient(server.url)
    tensor = httpclient.InferInput(given, [1], "FP32").set_data_from_numpy(np.array([1.5], np.float32))
    result = client.infer(model, [tensor])
    assert [output["name"] for output in result.get_response()["outputs"]] == [answered]
    expected = 3.0 if model == "partial" else 6.0
    np.testing.assert_array_equal(result.as_numpy(answered), [expected])


@pytest.mark.parametrize("model", ["sequence_who", "sequence_who_isolated"])
def test_a_sequence_request_tells_its_correlation_id_flags_and_timeout(server: ServerProcess, model: str) -> None:
    """request.correlation_id(), flags() and timeout() as Triton's Python backend gives them."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.ones(1, np.float32))
    answers = [client.infer(model, [tensor], sequence_id=sid, sequence_start=start, sequence_end=end,
                            timeout=timeout).as_numpy("WHO").tolist()
               for sid, start, end, timeout in ((42, True, False, 0), (42, False, False, 10**7), (42, False, True, 0),
                                                ("conv-7", True, True, 0))]
    assert answers == [[b"42", b"1", b"0"], [b"42", b"0", b"10000000"], [b"42", b"2", b"0"], [b"conv-7", b"3", b"0"]]


def test_triton_prefixed_parameters_are_refused_in_tritons_words(server: ServerProcess) -> None:
    body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}],
            "parameters": {"triton_injected": "x"}}
    answer = requests.post(f"{server.base}/v2/models/parameters/infer", json=body, timeout=30)
    assert answer.status_code == 400
    assert "'triton_injected'" in answer.json()["error"] and "reserved for Triton usage" in answer.json()["error"]


@pytest.mark.parametrize("model", ["add_sub", "add_sub_isolated"])
def test_error_response_and_raise(server: ServerProcess, model: str) -> None:
    # The model's own InferenceResponse(error=TritonError(..., INVALID_ARG)) is a 400 with its message; an
    # exception from execute fails the request with 500 naming it, and the server goes on.
    body = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [-1, -1, -1, -1]},
                       {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 1, 1, 1]}]}
    answer = requests.post(f"{server.base}/v2/models/{model}/infer", json=body, timeout=10)
    assert answer.status_code == 400
    assert answer.json() == {"error": "INPUT0 must not be all -1"}
    body["inputs"][0]["data"] = [-2, -2, -2, -2]
    answer = requests.post(f"{server.base}/v2/models/{model}/infer", json=body, timeout=10)
    assert answer.status_code == 500
    assert "ValueError: INPUT0 of -2 breaks this model" in answer.json()["error"]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as raised:
        client.infer(model, _add_sub_inputs(grpcclient, np.full(4, -1, np.float32)), request_id="r7")
    assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert raised.value.message() == "INPUT0 must not be all -1 in request r7"  # the model sees the request's id


def test_requests_of_a_batch_come_one_by_one(server: ServerProcess) -> None:
    # Concurrent requests batch (the queue delay holds them), yet execute sees one InferenceRequest per client
    # request, each with its own rows: a request of 2 rows answers [n * 100 + 2] on both rows.
    client = httpclient.InferenceServerClient(server.url, concurrency=4)

    def call(rows: int) -> np.ndarray:
        data = httpclient.InferInput("x", [rows, 1], "INT32")
        data.set_data_from_numpy(np.zeros((rows, 1), np.int32))
        return client.infer("per_request", [data]).as_numpy("requests")

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(call, [1, 2, 3, 2]))
    for rows, answer in zip([1, 2, 3, 2], answers, strict=True):
        assert answer.shape == (rows, 1)
        assert set(answer.reshape(-1) % 100) == {rows}
    assert max(int(answer[0, 0]) // 100 for answer in answers) > 1  # some execute got several requests


def test_a_response_is_its_requests_whatever_its_shape(server: ServerProcess) -> None:
    # As Triton (its qa/python_models/init_args): [1] answered to a [2, 1] request of a [-1, 1] output passes as
    # the model gave it.
    client = httpclient.InferenceServerClient(server.url)
    data = httpclient.InferInput("x", [2, 1], "INT32")
    data.set_data_from_numpy(np.zeros((2, 1), np.int32))
    assert client.infer("one_row", [data]).as_numpy("requests").tolist() == [7]


@pytest.mark.parametrize("model", ["asked", "asked_isolated"])
def test_requests_asking_for_other_outputs_batch_and_each_sees_its_own(server: ServerProcess, model: str) -> None:
    # As Triton: the outputs asked for do not split a batch, and each request's requested_output_names() are its own.
    client = httpclient.InferenceServerClient(server.url, concurrency=3)
    asked = [["A"], ["B"], ["B", "A"]]

    def call(names: list[str]) -> httpclient.InferResult:
        data = httpclient.InferInput("x", [2, 1], "INT32")
        data.set_data_from_numpy(np.zeros((2, 1), np.int32))
        return client.infer(model, [data], outputs=[httpclient.InferRequestedOutput(n) for n in names])

    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(call, asked))
    for names, answer in zip(asked, answers, strict=True):
        assert sorted(o["name"] for o in answer.get_response()["outputs"]) == sorted(names)
        for name in names:
            assert set(answer.as_numpy(name).reshape(-1) % 10) == {len(names)}
    assert max(int(answer.as_numpy(names[0])[0, 0]) // 10 for names, answer in zip(asked, answers)) > 1


@pytest.mark.parametrize(("model", "mode"), [("bls", "sync"), ("bls", "async"), ("bls_isolated", "sync"),
                                           ("bls_isolated", "async")])
def test_bls(server: ServerProcess, model: str, mode: str) -> None:
    client = httpclient.InferenceServerClient(server.url)
    inputs = _add_sub_inputs(httpclient, np.arange(4, dtype=np.float32))
    chosen = httpclient.InferInput("MODE", [1], "BYTES")
    chosen.set_data_from_numpy(np.array([mode.encode()], dtype=np.object_))
    result = client.infer(model, [*inputs, chosen])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), (np.arange(4) - 1) * 10)


@pytest.mark.parametrize("model", ["bls", "bls_isolated"])
def test_bls_to_a_decoupled_model(server: ServerProcess, model: str) -> None:
    client = httpclient.InferenceServerClient(server.url)
    chosen = httpclient.InferInput("MODE", [1], "BYTES")
    chosen.set_data_from_numpy(np.array([b"stream"], dtype=np.object_))
    result = client.infer(model, [*_add_sub_inputs(httpclient, np.array([1, 2, 3, 4], np.float32)), chosen])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [1004] * 4)  # 4 responses summing to 10


@pytest.mark.parametrize("model", ["bls", "bls_isolated"])
def test_bls_to_a_missing_model_is_the_callers_error(server: ServerProcess, model: str) -> None:
    client = httpclient.InferenceServerClient(server.url)
    chosen = httpclient.InferInput("MODE", [1], "BYTES")
    chosen.set_data_from_numpy(np.array([b"missing"], dtype=np.object_))
    with pytest.raises(InferenceServerException, match="no_such_model"):
        client.infer(model, [*_add_sub_inputs(httpclient, np.zeros(4, np.float32)), chosen])


def _stream(server: ServerProcess, values: list[int], model: str = "repeat", **options: Any) -> list[Any]:
    """Every callback of one decoupled request over ModelStreamInfer, up to its final response."""
    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    data = grpcclient.InferInput("IN", [len(values)], "INT32")
    data.set_data_from_numpy(np.array(values, np.int32))
    client.async_stream_infer(model, [data], request_id="r1", **options)
    received = []
    while True:
        answer = answers.get(timeout=10)
        received.append(answer)
        if isinstance(answer, InferenceServerException) or not options:
            if len(received) == len(values) + (1 if options else 0) or isinstance(answer, Exception):
                break
            continue
        if answer.get_response().parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()
    return received


@pytest.mark.parametrize("model", ["repeat", "repeat_isolated"])
def test_decoupled_over_grpc_stream(server: ServerProcess, model: str) -> None:
    received = _stream(server, [7, 8, 9], model)
    assert [int(r.as_numpy("OUT")[0]) for r in received] == [7, 8, 9]
    assert [int(r.as_numpy("IDX")[0]) for r in received] == [0, 1, 2]
    assert {r.get_response().id for r in received} == {"r1"}


def test_decoupled_final_flag(server: ServerProcess) -> None:
    received = _stream(server, [5, 6], enable_empty_final_response=True)
    finals = [r.get_response().parameters["triton_final_response"].bool_param for r in received]
    assert finals == [False, False, True]
    assert not received[-1].get_response().outputs  # the final flag alone: an empty response
    assert _stream(server, [], enable_empty_final_response=True)[0].get_response().parameters[
        "triton_final_response"].bool_param  # zero responses, then the final flag


def test_decoupled_refuses_unary_infer(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    data = grpcclient.InferInput("IN", [1], "INT32")
    data.set_data_from_numpy(np.array([1], np.int32))
    with pytest.raises(InferenceServerException, match="decoupled") as raised:
        client.infer("repeat", [data])
    assert raised.value.status() == "StatusCode.UNIMPLEMENTED"
    body = {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}]}
    answer = requests.post(f"{server.base}/v2/models/repeat/infer", json=body, timeout=10)
    assert answer.status_code == 501 and "decoupled" in answer.json()["error"]


def test_decoupled_model_raising_fails_its_stream_request(server: ServerProcess) -> None:
    (error,) = _stream(server, [1, 2, 3, 4, 5])
    assert isinstance(error, InferenceServerException)
    assert error.message() == "IN holds at most 4 values"
    answer = requests.post(f"{server.base}/v2/models/repeat/generate_stream", json={"IN": [1, 2, 3, 4, 5]},
                           timeout=10)
    assert answer.status_code == 400 and answer.json() == {"error": "IN holds at most 4 values"}


def test_generate_stream_sse(server: ServerProcess) -> None:
    answer = requests.post(f"{server.base}/v2/models/repeat/generate_stream", json={"IN": [3, 4]}, stream=True,
                           timeout=10)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line.removeprefix(b"data: ")) for line in answer.iter_lines() if line]
    assert [(e["OUT"], e["IDX"]) for e in events] == [(3, 0), (4, 1)]
    assert {e["model_name"] for e in events} == {"repeat"}


def test_generate_non_streaming(server: ServerProcess) -> None:
    body = {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1]}
    answer = requests.post(f"{server.base}/v2/models/add_sub/generate", json=body, timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"model_name": "add_sub", "model_version": "1", "OUTPUT0": [2, 3, 4, 5],
                             "OUTPUT1": [0, 1, 2, 3]}
    body = {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1], "MODE": "sync", "parameters": {"temperature": 0}}
    answer = requests.post(f"{server.base}/v2/models/bls/generate", json=body, timeout=10)
    assert answer.json()["OUTPUT0"] == [0, 10, 20, 30]  # a string for a BYTES input, a parameter beside
    answer = requests.post(f"{server.base}/v2/models/repeat/generate", json={"IN": [1, 2]}, timeout=10)
    assert answer.status_code == 400 and "sent more than one response" in answer.json()["error"]
    answer = requests.post(f"{server.base}/v2/models/add_sub/generate", json={"INPUT0": [1], "x": [1]}, timeout=10)
    assert answer.status_code == 400 and "'x'" in answer.json()["error"]


def test_client_leaving_cancels_the_request(server: ServerProcess) -> None:
    # The model streams until request.is_cancelled(); the client closing its HTTP stream, or its gRPC stream,
    # cancels it (the model says so with a file), and later streams are served as usual.
    answer = requests.post(f"{server.base}/v2/models/repeat/generate_stream", json={"IN": [1, -1]}, stream=True,
                           timeout=10)
    lines = answer.iter_lines()
    assert json.loads(next(line for line in lines if line).removeprefix(b"data: "))["OUT"] == 1
    answer.close()
    wait_for(lambda: (server.repository / "repeat" / "cancelled1").exists(), what="the model to see the cancel")

    _cancel_a_grpc_stream(server, "repeat", 2)

    # A client that leaves before the first response (the handler still waits for it) cancels it too.
    body = json.dumps({"IN": [-3]}).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as connection:
        connection.sendall(b"POST /v2/models/repeat/generate_stream HTTP/1.1\r\nhost: x\r\ncontent-length: "
                           + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(0.2)
    wait_for(lambda: (server.repository / "repeat" / "cancelled3").exists(), what="the model to see the cancel")



@pytest.mark.parametrize("model", ["auto_add_sub", "auto_isolated", "auto_no_config"])
def test_auto_complete_config(server: ServerProcess, model: str) -> None:
    # The config the model completed is the one served: its tensors, max_batch_size 8 and the dynamic batcher.
    client = httpclient.InferenceServerClient(server.url)
    config = client.get_model_config(model)
    assert [t["name"] for t in config["input"]] == ["INPUT0", "INPUT1"]
    assert [(t["data_type"], t["dims"]) for t in config["output"]] == [("TYPE_FP32", [4])] * 2
    assert config["max_batch_size"] == 8 and "dynamic_batching" in config
    in0 = np.arange(8, dtype=np.float32).reshape(2, 4)
    inputs = [httpclient.InferInput("INPUT0", [2, 4], "FP32"), httpclient.InferInput("INPUT1", [2, 4], "FP32")]
    inputs[0].set_data_from_numpy(in0)
    inputs[1].set_data_from_numpy(np.ones((2, 4), np.float32))
    np.testing.assert_array_equal(client.infer(model, inputs).as_numpy("OUTPUT0"), in0 + 1)
    completed_in = int((server.repository / model / "completed_in").read_text())
    assert (completed_in == server.process.pid) == (model != "auto_isolated")  # isolated: in a worker


def test_auto_complete_config_contradicting_the_config_fails_the_load(server: ServerProcess) -> None:
    index = requests.post(f"{server.base}/v2/repository/index", json={}, timeout=5).json()
    entry = next(e for e in index if e["name"] == "auto_conflict")
    assert entry["state"] == "UNAVAILABLE", entry
    assert ("unable to load model 'auto_conflict', configuration expects datatype TYPE_INT32 for input 'INPUT0', "
            "model provides TYPE_FP32") in entry["reason"]


@pytest.mark.parametrize("model", ["metrics", "metrics_isolated"])
def test_custom_metrics_on_the_metrics_port(server: ServerProcess, model: str) -> None:
    # The model's counter, gauge and histogram are on /metrics, labelled as it labels them; an isolated model's
    # reach the server with its replies.
    client = httpclient.InferenceServerClient(server.url)
    for value, count in ((2.0, 1), (20.0, 2)):
        data = httpclient.InferInput("x", [1], "FP32")
        data.set_data_from_numpy(np.array([value], np.float32))
        assert client.infer(model, [data]).as_numpy("count")[0] == count
    text = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples
               if s.labels.get("model") == model}
    labels = (("model", model),)
    assert samples[("custom_requests", labels)] == 2
    assert samples[("custom_last_value", labels)] == 20
    buckets = {le: samples[("custom_value_bucket", (("le", le), *labels))] for le in ("1", "2.5", "10", "+Inf")}
    assert buckets == {"1": 0, "2.5": 1, "10": 1, "+Inf": 2}
    assert samples[("custom_value_count", labels)] == 2 and samples[("custom_value_sum", labels)] == 22
    assert "# HELP custom_requests Requests the model saw" in text


def test_client_leaving_cancels_the_request_in_an_isolated_worker(server: ServerProcess) -> None:
    # is_cancelled() in the worker asks the server, which knows the client left: the model sees it and ends its
    # stream, and the worker serves the next request.
    _cancel_a_grpc_stream(server, "repeat_isolated", 4)


def _cancel_a_grpc_stream(server: ServerProcess, model: str, mark: int) -> None:
    """A gRPC stream to `model` that the client cancels after the first response: the model, waiting for
    is_cancelled(), writes cancelled<mark>; the next request is served."""
    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    data = grpcclient.InferInput("IN", [2], "INT32")
    data.set_data_from_numpy(np.array([5, -mark], np.int32))
    client.async_stream_infer(model, [data])
    assert int(answers.get(timeout=10).as_numpy("OUT")[0]) == 5
    client.stop_stream(cancel_requests=True)
    wait_for(lambda: (server.repository / model / f"cancelled{mark}").exists(), what="the model to see the cancel")
    assert [int(r.as_numpy("OUT")[0]) for r in _stream(server, [3], model=model)] == [3]


def model_loading_call(url: str, model: str, action: str) -> str:
    """What the loader model answers to ACTION `action`."""
    client = httpclient.InferenceServerClient(url)
    data = httpclient.InferInput("ACTION", [1], "BYTES")
    data.set_data_from_numpy(np.array([action.encode()], dtype=np.object_))
    return str(client.infer(model, [data]).as_numpy("RESULT")[0].decode())


def test_model_loading_api_outside_explicit_mode(server: ServerProcess, model: str = "loader") -> None:
    # is_model_ready answers in any mode; load and unload follow the model control mode's rules, as a client's
    # requests do (test_triton_model_loading_api.py: explicit mode).
    assert model_loading_call(server.url, model, "ready add_sub") == "True"
    assert model_loading_call(server.url, model, "ready no_such_model") == "False"
    for action in ("load add_sub", "unload add_sub"):
        answer = model_loading_call(server.url, model, action)
        assert answer.startswith("error: explicit model load / unload is not allowed"), answer
    assert model_loading_call(server.url, model, "ready add_sub") == "True"
