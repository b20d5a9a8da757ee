"""The model repository Triton's Python client examples expect, generated (used by triton_client_examples.py).

Each model has the name, tensors, datatypes and shapes the examples send, and the arithmetic they check
(mirroring Triton's example and QA models as the examples see them): ONNX graphs through onnx.helper, and a
Python `model.py` for the decoupled `repeat_int32`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
INT32, INT8, STRING = TensorProto.INT32, TensorProto.INT8, TensorProto.STRING
_TYPES = {INT32: "TYPE_INT32", INT8: "TYPE_INT8", STRING: "TYPE_STRING"}


def _save(repo: Path, name: str, graph: onnx.GraphProto, config: str) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="modelhost")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(repo / name / "1" / "model.onnx"))
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\n{config}')


def _io(names: list[str], elem: int, dims: str) -> str:
    return ", ".join(f'{{ name: "{n}" data_type: {_TYPES[elem]} dims: [ {dims} ] }}' for n in names)


def _add_sub_config(elem: int) -> str:
    return (f'platform: "onnxruntime_onnx"\nmax_batch_size: 8\ninput [ {_io(["INPUT0", "INPUT1"], elem, "16")} ]\n'
            f'output [ {_io(["OUTPUT0", "OUTPUT1"], elem, "16")} ]\n')


def add_sub(repo: Path, name: str, elem: int) -> None:
    """INPUT0, INPUT1 [batch, 16] -> OUTPUT0 = sum, OUTPUT1 = difference; BYTES tensors hold decimal strings
    (cast to INT32 and back, as Triton's simple_string does)."""
    def info(tensor: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(tensor, elem, ["batch", 16])

    if elem == STRING:
        nodes = [helper.make_node("Cast", ["INPUT0"], ["a"], to=INT32),
                 helper.make_node("Cast", ["INPUT1"], ["b"], to=INT32),
                 helper.make_node("Add", ["a", "b"], ["sum"]), helper.make_node("Sub", ["a", "b"], ["diff"]),
                 helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=STRING),
                 helper.make_node("Cast", ["diff"], ["OUTPUT1"], to=STRING)]
    else:
        nodes = [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
                 helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])]
    graph = helper.make_graph(nodes, name, [info("INPUT0"), info("INPUT1")], [info("OUTPUT0"), info("OUTPUT1")])
    _save(repo, name, graph, _add_sub_config(elem))


def identity(repo: Path, name: str, elem: int) -> None:
    """INPUT0 [batch, -1] -> OUTPUT0, unchanged."""
    shape: list[int | str] = ["batch", "n"]
    graph = helper.make_graph([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], name,
                              [helper.make_tensor_value_info("INPUT0", elem, shape)],
                              [helper.make_tensor_value_info("OUTPUT0", elem, shape)])
    _save(repo, name, graph, f'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
                             f'input [ {_io(["INPUT0"], elem, "-1")} ]\noutput [ {_io(["OUTPUT0"], elem, "-1")} ]\n')


def _control(name: str, kind: str) -> str:
    if kind.startswith("TYPE_"):  # the correlation ID, in that type
        return f'{{ name: "{name}" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {kind} }} ] }}'
    return f'{{ name: "{name}" control [ {{ kind: CONTROL_SEQUENCE_{kind} int32_false_true: [ 0, 1 ] }} ] }}'


def _sequence_config(controls: str, extra: str = "") -> str:
    return (f'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
            f'input [ {_io(["INPUT"], INT32, "1")} ]\noutput [ {_io(["OUTPUT"], INT32, "1")} ]\n'
            f'sequence_batching {{\n  max_sequence_idle_microseconds: 10000000\n'
            f'  control_input [ {controls} ]\n{extra}}}\n')


def _int32(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, INT32, ["batch", 1])


def sequence(repo: Path) -> None:
    """simple_sequence: OUTPUT = INPUT * READY + START (the examples expect INPUT + 1 on a sequence's first
    request, INPUT after)."""
    nodes = [helper.make_node("Mul", ["INPUT", "READY"], ["ready_input"]),
             helper.make_node("Add", ["ready_input", "START"], ["OUTPUT"])]
    graph = helper.make_graph(nodes, "simple_sequence", [_int32("INPUT"), _int32("START"), _int32("READY")],
                              [_int32("OUTPUT")])
    controls = ", ".join([_control("START", "START"), _control("READY", "READY")])
    _save(repo, "simple_sequence", graph, _sequence_config(controls))


def dyna_sequence(repo: Path) -> None:
    """simple_dyna_sequence: OUTPUT = INPUT + START + END * CORRID (the correlation ID, UINT64, is added to a
    sequence's last answer)."""
    nodes = [helper.make_node("Cast", ["CORRID"], ["corrid"], to=INT32),
             helper.make_node("Mul", ["END", "corrid"], ["end_corrid"]),
             helper.make_node("Mul", ["INPUT", "READY"], ["ready_input"]),
             helper.make_node("Add", ["ready_input", "START"], ["started"]),
             helper.make_node("Add", ["started", "end_corrid"], ["OUTPUT"])]
    corrid = helper.make_tensor_value_info("CORRID", TensorProto.UINT64, ["batch", 1])
    graph = helper.make_graph(nodes, "simple_dyna_sequence",
                              [_int32("INPUT"), _int32("START"), _int32("END"), _int32("READY"), corrid],
                              [_int32("OUTPUT")])
    controls = ", ".join([_control("START", "START"), _control("END", "END"), _control("READY", "READY"),
                          _control("CORRID", "TYPE_UINT64")])
    _save(repo, "simple_dyna_sequence", graph, _sequence_config(controls))


def string_dyna_sequence(repo: Path) -> None:
    """simple_string_dyna_sequence: an accumulator (OUTPUT = STATE * (1 - START) + INPUT, kept as implicit state)
    whose string correlation ID, a decimal number, is added to the last answer."""
    one = numpy_helper.from_array(np.array(1, np.int32), "one")
    nodes = [helper.make_node("Sub", ["one", "START"], ["carry"]),
             helper.make_node("Mul", ["STATE_IN", "carry"], ["kept"]),
             helper.make_node("Add", ["kept", "INPUT"], ["STATE_OUT"]),
             helper.make_node("Cast", ["CORRID"], ["corrid"], to=INT32),
             helper.make_node("Mul", ["END", "corrid"], ["end_corrid"]),
             helper.make_node("Add", ["STATE_OUT", "end_corrid"], ["OUTPUT"])]
    corrid = helper.make_tensor_value_info("CORRID", STRING, ["batch", 1])
    graph = helper.make_graph(nodes, "simple_string_dyna_sequence",
                              [_int32("INPUT"), _int32("START"), _int32("END"), corrid, _int32("STATE_IN")],
                              [_int32("OUTPUT"), _int32("STATE_OUT")], [one])
    controls = ", ".join([_control("START", "START"), _control("END", "END"), _control("CORRID", "TYPE_STRING")])
    state = '  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
    _save(repo, "simple_string_dyna_sequence", graph, _sequence_config(controls, state))


REPEAT_MODEL = '''
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Answers a request with one response per element of IN: OUT = IN[i] and IDX = i, each after DELAY[i]
    milliseconds; the request's final flag follows after WAIT milliseconds."""

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self._answer, args=(request,), daemon=True).start()
        return None

    def _answer(self, request):
        sender = request.get_response_sender()
        values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
        wait = pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy()
        for index, (value, delay) in enumerate(zip(values, delays)):
            time.sleep(float(delay) / 1000)
            sender.send(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.array([value], np.int32)),
                pb_utils.Tensor("IDX", np.array([index], np.uint32))]))
        time.sleep(float(wait[0]) / 1000)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

REPEAT_CONFIG = '''name: "repeat_int32"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
        { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
        { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]
'''


def repeat(repo: Path) -> None:
    (repo / "repeat_int32" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "repeat_int32" / "1" / "model.py").write_text(REPEAT_MODEL)
    (repo / "repeat_int32" / "config.pbtxt").write_text(REPEAT_CONFIG)


def _labels(classes: int) -> str:
    return "".join(f"CLASS_{i}\n" for i in range(classes))


def _classifier(name: str, source: str, scores: str, batched: bool, classes: int) -> onnx.GraphProto:
    """Image [(batch,) 3, 224, 224] -> scores [(batch,) classes(, 1, 1)]: the channel means through a 1x1
    convolution (softmax-ed when batched). The scores mean nothing; the examples only check the plumbing."""
    weights = np.random.default_rng(0).standard_normal((classes, 3, 1, 1)).astype(np.float32)
    head = [] if batched else [helper.make_node("Unsqueeze", [source, "axis0"], ["image"])]
    tail = ([helper.make_node("Flatten", ["conv"], ["flat"]), helper.make_node("Softmax", ["flat"], [scores])]
            if batched else [helper.make_node("Squeeze", ["conv", "axis0"], [scores])])
    nodes = [*head, helper.make_node("GlobalAveragePool", ["image" if head else source], ["pooled"]),
             helper.make_node("Conv", ["pooled", "weights"], ["conv"]), *tail]
    lead: list[int | str] = ["batch"] if batched else []
    return helper.make_graph(
        nodes, name, [helper.make_tensor_value_info(source, TensorProto.FLOAT, [*lead, 3, 224, 224])],
        [helper.make_tensor_value_info(scores, TensorProto.FLOAT, [*lead, classes] + ([] if batched else [1, 1]))],
        [numpy_helper.from_array(weights, "weights"), numpy_helper.from_array(np.array([0], np.int64), "axis0")])


def densenet_standin(repo: Path, classes: int = 1000) -> None:
    """densenet_onnx's interface (data_0 FP32 [3, 224, 224] -> fc6_1 [1000, 1, 1], labelled), a tiny graph."""
    _save(repo, "densenet_onnx", _classifier("densenet_onnx", "data_0", "fc6_1", False, classes), f'''\
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ {{ name: "data_0" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, 224, 224 ] }} ]
output [ {{ name: "fc6_1" data_type: TYPE_FP32 dims: [ {classes}, 1, 1 ] label_filename: "labels.txt" }} ]
''')
    (repo / "densenet_onnx" / "labels.txt").write_text(_labels(classes))


PREPROCESS_MODEL = '''
import io

import numpy as np
import triton_python_backend_utils as pb_utils
from PIL import Image


def _image(encoded):
    """An encoded image -> FP32 [3, 224, 224], scaled to [-1, 1] (Inception's scaling)."""
    image = Image.open(io.BytesIO(encoded)).convert("RGB").resize((224, 224), Image.BILINEAR)
    return (np.asarray(image, np.float32) / 127.5 - 1.0).transpose(2, 0, 1)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            encoded = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            images = np.stack([_image(row[0]) for row in encoded])
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", images)]))
        return responses
'''


def image_ensemble(repo: Path, classes: int = 1000) -> None:
    """preprocess_resnet50_ensemble: encoded image bytes -> a Python preprocessing model (PIL) -> a batched
    classifier stand-in, labelled; the interface of Triton's example ensemble, our own models."""
    preprocess = repo / "image_preprocess_nchw_3x224x224_inception"
    (preprocess / "1").mkdir(parents=True, exist_ok=True)
    (preprocess / "1" / "model.py").write_text(PREPROCESS_MODEL)
    (preprocess / "config.pbtxt").write_text(f'''name: "{preprocess.name}"
backend: "python"
max_batch_size: 128
input [ {{ name: "INPUT" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] }} ]
''')
    _save(repo, "resnet50_standin", _classifier("resnet50_standin", "data", "softmax", True, classes), f'''\
platform: "onnxruntime_onnx"
max_batch_size: 128
input [ {{ name: "data" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, 224, 224 ] }} ]
output [ {{ name: "softmax" data_type: TYPE_FP32 dims: [ {classes} ] }} ]
''')
    ensemble = repo / "preprocess_resnet50_ensemble"
    (ensemble / "1").mkdir(parents=True, exist_ok=True)
    (ensemble / "labels.txt").write_text(_labels(classes))
    (ensemble / "config.pbtxt").write_text(f'''name: "preprocess_resnet50_ensemble"
platform: "ensemble"
max_batch_size: 128
input [ {{ name: "INPUT" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ {classes} ] label_filename: "labels.txt" }} ]
ensemble_scheduling {{ step [
  {{ model_name: "{preprocess.name}" model_version: -1
    input_map {{ key: "INPUT" value: "INPUT" }} output_map {{ key: "OUTPUT" value: "image" }} }},
  {{ model_name: "resnet50_standin" model_version: -1
    input_map {{ key: "data" value: "image" }} output_map {{ key: "softmax" value: "OUTPUT" }} }}
] }}
''')


def build_repository(repo: Path) -> Path:
    """Write every model the examples use under `repo` (emptied first); return it."""
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    add_sub(repo, "simple", INT32)
    add_sub(repo, "simple_int8", INT8)
    add_sub(repo, "simple_string", STRING)
    identity(repo, "simple_identity", STRING)
    identity(repo, "custom_identity_int32", INT32)
    sequence(repo)
    dyna_sequence(repo)
    string_dyna_sequence(repo)
    repeat(repo)
    densenet_standin(repo)
    image_ensemble(repo)
    return repo


def control_repository(source: Path, repo: Path, count: int) -> Path:
    """A repository of `count` models ("simple" first) for the model-control examples, which count them."""
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    names = ["simple", *sorted(p.name for p in source.iterdir() if p.name != "simple")][:count]
    for name in names:
        shutil.copytree(source / name, repo / name)
    return repo
