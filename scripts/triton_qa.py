"""Run Triton's own QA tests (qa/L0_*) that need no GPU, Triton-only backend or C++ client against modelhost.

    git --git-dir=<server mirror> archive HEAD qa | tar -x -C /tmp/triton-server
    PYTHONPATH=. python scripts/triton_qa.py /tmp/triton-server/qa [--only WORD]

Each suite gets the models its test.sh builds (ONNX identity models in place of Triton's generated
qa_identity_model_repository, a Python identity model in place of the `identity` test backend, the client
examples' repository from scripts/triton_client_models.py, Triton's qa_model_repository for ONNX and LibTorch made by
its qa/common/gen_qa_models.py, which needs torch, onnx and ml_dtypes) and a `modelhost serve` on ports 8000/8001
(the tests hard-code them: they must be free) with the flags test.sh gives tritonserver. Prints each test module's
unittest summary; docs/triton_compatibility.md says what differs by decision.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from onnx import TensorProto, helper

import modelhost

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton_client_models as client_models  # noqa: E402

PYTHON_IDENTITY = """import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.outputs = [output["name"] for output in json.loads(args["model_config"])["output"]]

    def execute(self, requests):
        # As Triton's identity test backend: OUTPUTi = INPUTi, zeros where an optional INPUTi was left out.
        responses = []
        for request in requests:
            given = {name: pb_utils.get_input_tensor_by_name(request, name.replace("OUTPUT", "INPUT"))
                     for name in self.outputs}
            present = [tensor.as_numpy() for tensor in given.values() if tensor is not None]
            tensors = [pb_utils.Tensor(name, tensor.as_numpy() if tensor is not None else np.zeros_like(present[0]))
                       for name, tensor in given.items() if tensor is not None or present]
            responses.append(pb_utils.InferenceResponse(tensors))
        return responses
"""


SHM_MONITOR = """class SharedMemoryManager:
    def __init__(self, name):
        raise AssertionError(f"modelhost made a Triton Python-backend region: {name}")
"""


def identity_model(repo: Path, name: str, elem: int, count: int, dims: list[int], config_type: str,
                   extra: str = "", max_batch: int = 8) -> None:
    """Triton's qa_identity_model_repository model `name`: INPUTi -> OUTPUTi unchanged."""
    (repo / name / "1").mkdir(parents=True)
    shape = (["batch"] if max_batch else []) + [f"d{i}" for i in range(len(dims))]
    graph = helper.make_graph(
        [helper.make_node("Identity", [f"INPUT{i}"], [f"OUTPUT{i}"]) for i in range(count)], name,
        [helper.make_tensor_value_info(f"INPUT{i}", elem, shape) for i in range(count)],
        [helper.make_tensor_value_info(f"OUTPUT{i}", elem, shape) for i in range(count)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(repo / name / "1" / "model.onnx"))
    dim_text = ",".join(map(str, dims))

    def tensors(prefix: str) -> str:
        return ",".join(f'{{ name: "{prefix}{i}" data_type: {config_type} dims: [{dim_text}] }}' for i in range(count))

    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch}\n'
        f"input [{tensors('INPUT')}]\noutput [{tensors('OUTPUT')}]\n{extra}")


def python_identity(repo: Path, name: str, config_type: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(PYTHON_IDENTITY)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n'
        f'input [{{ name: "INPUT0" data_type: {config_type} dims: [ -1 ] }}]\n'
        f'output [{{ name: "OUTPUT0" data_type: {config_type} dims: [ -1 ] }}]\n')


def http_repository(qa: Path, repo: Path) -> None:
    """qa/L0_http/test.sh's python_unit_test_models."""
    identity_model(repo, "onnx_zero_1_float32", TensorProto.FLOAT, 1, [-1], "TYPE_FP32")
    identity_model(repo, "onnx_zero_1_object", TensorProto.STRING, 1, [-1], "TYPE_STRING")
    identity_model(repo, "onnx_zero_1_object_1_element", TensorProto.STRING, 1, [1], "TYPE_STRING")
    identity_model(repo, "onnx_zero_1_float16", TensorProto.FLOAT16, 1, [-1, -1], "TYPE_FP16")
    identity_model(repo, "onnx_zero_3_float32", TensorProto.FLOAT, 3, [-1], "TYPE_FP32")
    identity_model(repo, "onnx_zero_1_float32_queue", TensorProto.FLOAT, 1, [-1], "TYPE_FP32",
                   "dynamic_batching { max_queue_delay_microseconds: 1000000 preferred_batch_size: [ 8 ] "
                   "default_queue_policy { max_queue_size: 1 } }")
    python_identity(repo, "simple_identity", "TYPE_STRING")
    python_identity(repo, "simple_identity_int64", "TYPE_INT64")


def examples_repository(qa: Path, repo: Path) -> None:
    client_models.build_repository(repo)
    (repo / "string_identity" / "1").mkdir(parents=True)
    graph = helper.make_graph([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "string_identity",
                              [helper.make_tensor_value_info("INPUT0", TensorProto.STRING, ["n"])],
                              [helper.make_tensor_value_info("OUTPUT0", TensorProto.STRING, ["n"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(repo / "string_identity" / "1" / "model.onnx"))
    (repo / "string_identity" / "config.pbtxt").write_text(
        'name: "string_identity"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
        'input [{ name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] }]\n'
        'output [{ name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] }]\n')


def copied(source: str) -> Callable[[Path, Path], None]:
    def build(qa: Path, repo: Path) -> None:
        shutil.copytree(qa / source, repo, dirs_exist_ok=True)
        for config in repo.glob("*/config.pbtxt"):  # test.sh makes the version directories git does not keep
            (config.parent / "1").mkdir(exist_ok=True)
            text = config.read_text()
            if 'backend: "identity"' in text:  # Triton's `identity` test backend: a Python identity
                config.write_text(text.replace('backend: "identity"', 'backend: "python"'))
                (config.parent / "1" / "model.py").write_text(PYTHON_IDENTITY)
    return build


DELAYED_IDENTITY = """import json
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.delay = int(parameters.get("execute_delay_ms", {}).get("string_value", "0")) / 1000

    def execute(self, requests):
        time.sleep(self.delay)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0",
                pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
"""


def delayed_identity(qa: Path, repo: Path) -> None:
    """L0_client_timeout's custom_identity_int32: the `identity` test backend's execute_delay_ms, in Python."""
    copied("L0_client_timeout/models")(qa, repo)
    (repo / "custom_identity_int32" / "1" / "model.py").write_text(DELAYED_IDENTITY)


def empty(qa: Path, repo: Path) -> None:
    repo.mkdir(exist_ok=True)


def generated(qa: Path, work: Path, variable: bool, kind: str = "model", ensembles: bool = False) -> Path:
    """Triton's models of one kind for ONNX and LibTorch (variable shapes where asked), made once a run by Triton's
    own generator, qa/common/gen_qa_<kind>s.py: "model" (qa_model_repository), "sequence_model"
    (qa_sequence_model_repository), "implicit_model" (qa_sequence_implicit_model_repository), "identity_model",
    "reshape_model". `ensembles`: its ensembles of them instead (qa_ensemble_model_repository's part)."""
    target = work / f"gen_qa_{kind}s{'_variable' if variable else ''}{'_ensembles' if ensembles else ''}"
    if not target.exists():
        subprocess.run([sys.executable, f"gen_qa_{kind}s.py", "--models_dir", str(target),
                        *(["--ensemble"] if ensembles else ["--onnx", "--libtorch"]),
                        *(["--variable"] if variable else [])], cwd=qa / "common", check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return target


def python_in_place_of_onnx(qa: Path, onnx_model: Path, model: Path, code: str) -> None:
    """test.sh's Python stand-in for an ONNX model: its config for the Python backend, qa/python_models/<code>."""
    (model / "1").mkdir(parents=True)
    config = (onnx_model / "config.pbtxt").read_text()
    (model / "config.pbtxt").write_text(re.sub(r"platform:.*", 'backend: "python"', config).replace("onnx", "python"))
    for labels in onnx_model.glob("*.txt"):
        shutil.copy(labels, model)
    shutil.copy(qa / "python_models" / code / "model.py", model / "1")


def sequence_models(trial: str, implicit: bool = False) -> Callable[[Path, Path], None]:
    """qa/L0_sequence_batcher/test.sh's models<trial> (0: no batching, 4 instances; 1, 2, 4: max_batch_size 4, 2, 1
    with that many instances; v: variable shapes): int32 and bool accumulators for ONNX, LibTorch and Python, or
    with `implicit` (IMPLICIT_STATE=1, as qa/L0_implicit_state runs it) ONNX and LibTorch ones keeping their sum in
    implicit state, strings too. Their KIND_GPU instance groups become KIND_CPU (this machine has no GPU)."""
    batch, count = {"0": (0, 4), "1": (4, 1), "2": (2, 2), "4": (1, 4), "v": (4, 1)}[trial]
    backends = ("onnx", "libtorch") if implicit else ("onnx", "libtorch", "python")

    def dtypes(backend: str) -> tuple[str, ...]:  # test.sh's get_datatype, and what sequence_batcher_test.py sends
        strings = implicit and (backend == "onnx" or (backend == "libtorch" and not batch))
        return ("object", "int32", "bool") if strings else ("int32", "bool")

    def build(qa: Path, repo: Path) -> None:
        source = generated(qa, repo.parent, trial == "v", "implicit_model" if implicit else "sequence_model")
        repo.mkdir()
        for backend in backends:
            for dtype in dtypes(backend):
                name = f"{backend}_{'nobatch_' if not batch else ''}sequence_{dtype}"
                model = repo / name
                if backend == "python":
                    python_in_place_of_onnx(qa, source / name.replace("python", "onnx"), model, "sequence_int32")
                else:
                    shutil.copytree(source / name, model)
                config = (model / "config.pbtxt").read_text().replace("kind: KIND_GPU", "kind: KIND_CPU")
                config = config.replace("kind: KIND_CPU", f"kind: KIND_CPU\ncount: {count}")
                if batch:
                    config = re.sub(r"(?m)^max_batch_size:.*", f"max_batch_size: {batch}", config)
                (model / "config.pbtxt").write_text(config)
    return build


def implicit_models(qa: Path, repo: Path) -> None:
    """qa/L0_implicit_state/test.sh's ONNX and LibTorch state models (without its custom C++ backend's): each
    once as generated, once with its state output also declared an output, which a client may then ask for. Their
    KIND_GPU instances run on CPU (--gpu-fallback cpu)."""
    source = generated(qa, repo.parent, False, "implicit_model")
    repo.mkdir()
    for backend, state in (("onnx", "OUTPUT_STATE"), ("libtorch", "OUTPUT_STATE__1")):
        name = f"{backend}_nobatch_sequence_int32"
        shutil.copytree(source / name, repo / name)
        allowed = repo / f"{name}_output"
        shutil.copytree(source / name, allowed)
        config = re.sub(r"(?m)^name:.*", f'name: "{allowed.name}"', (allowed / "config.pbtxt").read_text())
        declared = f'output [{{ name: "{state}" data_type: TYPE_INT32 dims: [ 1 ] }}]\n'
        (allowed / "config.pbtxt").write_text(config + declared)


def infer_models(qa: Path, repo: Path) -> None:
    """qa/L0_infer/test.sh's models for its CPU target: Triton's qa_model_repository for ONNX and LibTorch, and
    Python stand-ins of the ONNX ones (qa/python_models/add_sub, sub_add for the swapped types), each on
    KIND_CPU instances; the generated ensembles of the ONNX and LibTorch ones (their `nop_*` models a Python
    identity) and qa/ensemble_models."""
    source = generated(qa, repo.parent, False)
    repo.mkdir()
    for model in sorted(source.iterdir()):
        if "bf16" in model.name:
            continue
        shutil.copytree(model, repo / model.name)
        if model.name.startswith("onnx"):
            python = repo / model.name.replace("onnx", "python")
            (python / "1").mkdir(parents=True)
            config = re.sub(r"platform:.*", "", (model / "config.pbtxt").read_text())
            config = re.sub(r"version_policy.*", 'backend: "python"', config).replace("onnx", "python")
            (python / "config.pbtxt").write_text(config)
            shutil.copy(model / "output0_labels.txt", python)
            swapped = any(python.name in (f"python_{t}_{t}_{t}", f"python_nobatch_{t}_{t}_{t}")
                          for t in ("float32", "int32", "int16", "int8"))
            shutil.copy(qa / "python_models" / ("sub_add" if swapped else "add_sub") / "model.py", python / "1")
    for config in repo.glob("*/config.pbtxt"):
        config.write_text(config.read_text() + "instance_group [ { kind: KIND_CPU }]\n")
    for model in sorted(generated(qa, repo.parent, False, ensembles=True).iterdir()):
        if model.name.startswith("nop_"):
            nop(model, repo)
        elif "onnx" in model.name or "libtorch" in model.name:
            shutil.copytree(model, repo / model.name)
    for model in sorted((qa / "ensemble_models").iterdir()):
        shutil.copytree(model, repo / model.name)
        (repo / model.name / "1").mkdir(exist_ok=True)
    # qa/custom_models/custom_zero_1_float32 on the `identity` test backend, batching and not, as test.sh edits it.
    config = (qa / "custom_models" / "custom_zero_1_float32" / "config.pbtxt").read_text()
    config = config.replace('backend: "identity"', 'backend: "python"') + "instance_group [ { kind: KIND_CPU }]\n"
    for name, batch, dims in (("custom_zero_1_float32", 8, "-1"), ("custom_nobatch_zero_1_float32", 0, "-1, -1")):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(PYTHON_IDENTITY)
        edited = config.replace("custom_zero_1_float32", name).replace("max_batch_size: 1", f"max_batch_size: {batch}")
        (repo / name / "config.pbtxt").write_text(edited.replace("dims: [ 1 ]", f"dims: [ {dims} ]"))


def generated_models(kind: str, variable: bool = False, cpu: bool = False,
                     variable_ensembles: bool | None = None, ensembles: bool = True) -> Callable[[Path, Path], None]:
    """All of Triton's generated models of one kind (generated()) but BF16 ones, and its ensembles of them (of
    variable shapes as `variable_ensembles`, else as `variable`), as a test.sh copies them; `cpu`: KIND_CPU
    instance groups appended to the models, as its CPU target does. The ensembles' `nop_*` models are on the
    `identity` test backend: a Python identity here."""
    def build(qa: Path, repo: Path) -> None:
        repo.mkdir()
        for model in sorted(generated(qa, repo.parent, variable, kind).iterdir()):
            if "bf16" not in model.name:
                shutil.copytree(model, repo / model.name)
                if cpu:
                    config = repo / model.name / "config.pbtxt"
                    config.write_text(config.read_text() + "instance_group [ { kind: KIND_CPU }]\n")
        if not ensembles:
            return
        ensembles_variable = variable if variable_ensembles is None else variable_ensembles
        for model in sorted(generated(qa, repo.parent, ensembles_variable, kind, ensembles=True).iterdir()):
            if model.name.startswith("nop_"):
                nop(model, repo)
            else:
                shutil.copytree(model, repo / model.name, dirs_exist_ok=True)
    return build


def nop(model: Path, repo: Path) -> None:
    """A generated ensemble's `nop_*` model, on the `identity` test backend: a Python identity here."""
    shutil.copytree(model, repo / model.name, dirs_exist_ok=True)
    (repo / model.name / "1").mkdir(exist_ok=True)
    config = repo / model.name / "config.pbtxt"
    config.write_text(config.read_text().replace('backend: "identity"', 'backend: "python"'))
    (repo / model.name / "1" / "model.py").write_text(PYTHON_IDENTITY)


def with_plan_stand_ins(build: Callable[[Path, Path], None]) -> Callable[[Path, Path], None]:
    """`build`, and an ONNX copy of each ONNX model named as its TensorRT twin (plan_*): tests that try TensorRT
    first (InferVariableTest) then reach their ONNX and LibTorch parts. Counted apart in the compatibility table."""
    def stand_ins(qa: Path, repo: Path) -> None:
        build(qa, repo)
        for model in sorted(repo.glob("onnx_*")):
            twin = repo / model.name.replace("onnx", "plan", 1)
            if not twin.exists():
                shutil.copytree(model, twin)
                config = (twin / "config.pbtxt").read_text()
                (twin / "config.pbtxt").write_text(re.sub(r'(?m)^name:.*', f'name: "{twin.name}"', config))
    return stand_ins


def reshape_models(qa: Path, repo: Path) -> None:
    """qa/L0_infer_reshape/test.sh's: qa_reshape_model_repository, and `custom_*` copies of some ONNX ones on the
    `identity` test backend (a Python identity model here)."""
    generated_models("reshape_model", variable=True, variable_ensembles=False)(qa, repo)  # as Triton makes them
    for suffix in ("nobatch_zero_3_float32", "nobatch_zero_4_float32", "zero_1_float32", "zero_2_float32",
                   "zero_3_float32", "zero_4_float32", "nobatch_zero_1_int32", "nobatch_zero_2_int32",
                   "nobatch_zero_3_int32", "zero_1_int32", "zero_2_int32", "zero_3_int32"):
        if not (repo / f"onnx_{suffix}").exists():  # made for TensorRT only
            continue
        custom = repo / f"custom_{suffix}"
        (custom / "1").mkdir(parents=True)
        config = (repo / f"onnx_{suffix}" / "config.pbtxt").read_text()
        config = re.sub(r"(?m)^platform:.*", 'backend: "python"', config)
        config = re.sub(r"(?m)^name:.*", f'name: "{custom.name}"', config)
        (custom / "config.pbtxt").write_text(config + "instance_group [ { kind: KIND_CPU }]\n")
        (custom / "1" / "model.py").write_text(PYTHON_IDENTITY)


def string_models(qa: Path, repo: Path) -> None:
    """qa/L0_string_io/test.sh's: the generated onnx_zero_1_object identity and qa/python_models/string_identity
    with dims [ 8 ]."""
    repo.mkdir()
    shutil.copytree(generated(qa, repo.parent, False, "identity_model") / "onnx_zero_1_object",
                    repo / "onnx_zero_1_object")
    shutil.copytree(qa / "python_models" / "string_identity", repo / "string_identity")
    (repo / "string_identity" / "1").mkdir()
    (repo / "string_identity" / "model.py").rename(repo / "string_identity" / "1" / "model.py")
    config = repo / "string_identity" / "config.pbtxt"
    config.write_text(config.read_text().replace("[ 1 ]", "[ 8 ]"))


def nullchar_models(qa: Path, repo: Path) -> None:
    """qa/L0_nullchar_string/test.sh's: qa/python_models/string as python_string, the generated
    libtorch_nobatch_zero_1_object."""
    repo.mkdir()
    (repo / "python_string" / "1").mkdir(parents=True)
    shutil.copy(qa / "python_models" / "string" / "model.py", repo / "python_string" / "1")
    config = (qa / "python_models" / "string" / "config.pbtxt").read_text()
    (repo / "python_string" / "config.pbtxt").write_text(config.replace('name: "string"', 'name: "python_string"'))
    shutil.copytree(generated(qa, repo.parent, False, "identity_model") / "libtorch_nobatch_zero_1_object",
                    repo / "libtorch_nobatch_zero_1_object")


def output_name_models(qa: Path, repo: Path) -> None:
    """qa/L0_output_name/test.sh's: the generated *_nobatch_zero_1_float32 identities."""
    repo.mkdir()
    for model in generated(qa, repo.parent, False, "identity_model").glob("*_nobatch_zero_1_float32"):
        shutil.copytree(model, repo / model.name)


def python_test_models(qa: Path, repo: Path) -> None:
    """qa/L0_backend_python/test.sh's models for its python_test.py, from qa/python_models."""
    models = qa / "python_models"
    repo.mkdir()

    def add(name: str, source: str = "", config: str = "") -> Path:
        (repo / name / "1").mkdir(parents=True)
        shutil.copy(models / (source or name) / "model.py", repo / name / "1")
        text = config or (models / (source or name) / "config.pbtxt").read_text()
        (repo / name / "config.pbtxt").write_text(re.sub(r"(?m)^name:.*", f'name: "{name}"', text))
        return repo / name

    identity = (models / "identity_fp32" / "config.pbtxt").read_text()
    for name in ("identity_fp32", "identity_bf16", "pytorch_fp32_fp32", "delayed_model", "init_args", "optional",
                 "non_contiguous", "string", "string_fixed", "dlpack_identity"):
        add(name)
    add("identity_uint8", "identity_fp32", re.sub(r"(?m)^max_batch_size:.*", "max_batch_size: 8", identity.replace(
        "TYPE_FP32", "TYPE_UINT8")) + "dynamic_batching { preferred_batch_size: [8], "
        "max_queue_delay_microseconds: 12000000 }\n")
    add("identity_uint8_nobatch", "identity_fp32",
        re.sub(r"(?m)^max_batch_size:.*", "", identity.replace("TYPE_FP32", "TYPE_UINT8")))
    add("identity_uint32", "identity_fp32", identity.replace("TYPE_FP32", "TYPE_UINT32"))
    add("identity_bool", "identity_fp32", identity.replace("TYPE_FP32", "TYPE_BOOL"))
    default = add("default_model_name", "identity_fp32", identity + 'default_model_filename: "mymodel.py"\n')
    (default / "1" / "model.py").rename(default / "1" / "mymodel.py")


def batcher_models(variable: bool) -> Callable[[Path, Path], None]:
    """qa/L0_batcher/test.sh's models (var_models when `variable`): float32 add/sub models for ONNX, LibTorch and
    Python (qa/python_models/add_sub with the ONNX model's config), max_batch_size 8, preferred sizes 2 and 6 and
    a 10 s queue delay."""
    def build(qa: Path, repo: Path) -> None:
        source = generated(qa, repo.parent, variable)
        repo.mkdir()
        for backend in ("onnx", "libtorch", "python"):
            model = repo / f"{backend}_float32_float32_float32"
            if backend == "python":
                python_in_place_of_onnx(qa, source / "onnx_float32_float32_float32", model, "add_sub")
            else:
                shutil.copytree(source / model.name, model)
            config = (model / "config.pbtxt").read_text()
            config = re.sub(r"(?m)^max_batch_size:.*", "max_batch_size: 8", config)
            config = re.sub(r"(?m)^version_policy:.*", "version_policy: { specific { versions: [1] }}", config)
            config += "dynamic_batching { preferred_batch_size: [ 2, 6 ], max_queue_delay_microseconds: 10000000 }\n"
            (model / "config.pbtxt").write_text(config.replace("16", "-1") if variable else config)
    return build


@dataclass
class Suite:
    directory: str
    command: list[str]  # run in qa/<directory>
    repository: Callable[[Path, Path], None]
    flags: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    # Where under the suite's directory the repository goes ("": the directory), and the server's environment, its
    # "{root}" the suite's directory: for a test.sh model that checks where it was loaded from.
    place: str = ""
    server_env: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        words = [word for word in self.command if word not in ("python", "-m", "unittest", "pytest", "-q", "-v")]
        return f"{self.directory} {' '.join(words)} {' '.join(f'{k}={v}' for k, v in self.env.items())}"


def suites() -> list[Suite]:
    shm = [f"SharedMemoryTest.{name}" for name in (
        "test_invalid_create_shm", "test_valid_create_set_register", "test_unregister_before_register",
        "test_unregister_after_register", "test_reregister_after_register", "test_unregister_after_inference",
        "test_register_after_inference", "test_too_big_shm", "test_mixed_raw_shm", "test_unregisterall",
        "test_infer_offset_out_of_bound", "test_infer_byte_size_out_of_bound", "test_infer_integer_overflow",
        "test_register_out_of_bound", "test_register_reserved_names", "test_register_invalid_shm_key",
        "test_python_client_leak")]
    parameters = "parameters_test.InferenceParametersTest."
    batcher = ["test_static_batch_preferred", "test_static_batch_lt_any_preferred", "test_static_batch_not_preferred",
               "test_static_batch_gt_max_preferred", "test_multi_batch_not_preferred",
               "test_multi_batch_gt_max_preferred", "test_multi_batch_sum_gt_max_preferred",
               "test_multi_same_output0", "test_multi_same_output1", "test_multi_different_outputs",
               "test_multi_different_output_order"]
    # test_multi_batch_different_shape_allow_ragged needs Triton's custom C++ backend (its "custom" trial); the
    # DELAY tests need TRITONSERVER_DELAY_SCHEDULER, a test hook inside Triton's scheduler.
    different_shape = ["test_multi_batch_not_preferred_different_shape", "test_multi_batch_preferred_different_shape",
                       "test_multi_batch_different_shape"]
    batcher_env = {"BACKENDS": "onnx libtorch python"}
    # The NO_DELAY tests; the others need TRITONSERVER_DELAY_SCHEDULER or Triton's custom C++ sequence backend.
    sequence = ["test_simple_sequence", "test_length1_sequence", "test_batch_size", "test_no_sequence_start",
                "test_no_sequence_start2", "test_no_sequence_end", "test_no_correlation_id"]
    sequence_env = {"BACKENDS": "onnx libtorch python", "ENSEMBLES": "0", "IMPLICIT_STATE": "0",
                    "INITIAL_STATE_FILE": "0"}
    return [
        Suite("L0_http", ["python", "http_test.py"], http_repository,
              ["--model-control-mode", "explicit", "--load-model", "*"]),
        Suite("L0_http", ["python", "python_http_aio_test.py"], examples_repository,
              ["--model-control-mode", "poll", "--server-name", "triton"]),
        Suite("L0_grpc", ["python", "python_grpc_aio_test.py"], examples_repository,
              ["--model-control-mode", "poll", "--server-name", "triton", "--allow-client-shm"]),
        Suite("L0_grpc", ["python", "-m", "unittest", "python_unit_test.GrpcTest"], examples_repository),
        Suite("L0_input_validation", ["python", "-m", "unittest", "input_validation_test.InputValTest"],
              copied("L0_input_validation/models")),
        Suite("L0_input_validation", ["python", "-m", "unittest", "input_validation_test.ModelNameValidationTest"],
              empty, ["--model-control-mode", "explicit"]),
        *[Suite("L0_shared_memory", ["python", "shared_memory_test.py", test], examples_repository,
                ["--allow-client-shm"], {"CLIENT_TYPE": client}) for client in ("http", "grpc") for test in shm],
        *[Suite("L0_shared_memory", ["python", "shared_memory_test.py", "SharedMemoryTest."
                                     "test_client_shm_disabled_by_default"], examples_repository, [],
                {"CLIENT_TYPE": client}) for client in ("http", "grpc")],
        Suite("L0_logging", ["python", "logging_endpoint_test.py"], examples_repository, ["--logging-updates"]),
        *[Suite("L0_optional_input", ["python", "optional_input_test.py", f"OptionalInputTest.{test}"],
                copied("L0_optional_input/models")) for test in (
            "test_all_inputs", "test_optional_same_input", "test_optional_mix_inputs", "test_optional_mix_inputs_2",
            "test_ensemble_all_inputs", "test_ensemble_optional_same_input", "test_ensemble_optional_mix_inputs",
            "test_ensemble_optional_mix_inputs_2", "test_ensemble_optional_pipeline",
            "test_ensemble_optional_connecting_tensor")],
        *[Suite("L0_client_timeout", ["python", "client_infer_timeout_test.py", f"ClientInferTimeoutTest.{test}"],
                delayed_identity) for test in ("test_grpc_infer", "test_grpc_async_infer", "test_grpc_stream_infer",
                                               "test_http_infer", "test_http_async_infer")],
        *[Suite("L0_batcher", ["python", "batcher_test.py", f"BatcherTest.{test}"], batcher_models(kind == "VARIABLE"),
                env={**batcher_env, "BATCHER_TYPE": kind})
          for kind, tests in (("FIXED", batcher), ("VARIABLE", batcher + different_shape)) for test in tests],
        *[Suite("L0_sequence_batcher", ["python", "sequence_batcher_test.py", f"SequenceBatcherTest.{test}"],
                sequence_models(trial, implicit),
                env={**sequence_env, "NO_BATCHING": "1" if trial == "0" else "0",
                     "MODEL_INSTANCES": {"0": "4", "v": "1"}.get(trial, trial),
                     "BATCHER_TYPE": "VARIABLE" if trial == "v" else "FIXED", "TRIAL": trial,
                     **({"IMPLICIT_STATE": "1", "BACKENDS": "onnx libtorch"} if implicit else {})})
          for implicit in (False, True) for trial in ("0", "1", "2", "4", "v") for test in sequence],
        *[Suite("L0_implicit_state", ["python", "implicit_state.py", f"ImplicitStateTest.{test}"], implicit_models,
                ["--gpu-fallback", "cpu"], {"BACKENDS": "onnx libtorch"})
          for test in ("test_request_output_not_allowed", "test_request_output")],
        Suite("L0_infer", ["python", "infer_test.py"], infer_models,
              env={"BACKENDS": "onnx libtorch python", "TRITON_SERVER_CPU_ONLY": "1"}),
        Suite("L0_infer_variable", ["python", "infer_variable_test.py"], generated_models("model", True, True)),
        Suite("L0_infer_variable", ["python", "infer_variable_test.py"],
              with_plan_stand_ins(generated_models("model", True, True)), env={"PLAN": "onnx stand-ins"}),
        Suite("L0_infer_zero", ["python", "infer_zero_test.py"], generated_models("identity_model"),
              ["--gpu-fallback", "cpu"], {"BACKENDS": "onnx libtorch"}),
        Suite("L0_infer_reshape", ["python", "infer_reshape_test.py"], reshape_models, ["--gpu-fallback", "cpu"]),
        Suite("L0_server_status", ["python", "server_status_test.py", "ServerMetadataTest"],
              generated_models("model", ensembles=False), ["--repository-poll-secs", "1", "--model-control-mode",
                                                            "poll", "--gpu-fallback", "cpu", "--server-name", "triton"],
              {"TRITON_SERVER_VERSION": modelhost.__version__}),  # what Triton's container sets
        Suite("L0_string_io", ["python", "string_client_test.py", "-v"], string_models, ["--gpu-fallback", "cpu"]),
        *[Suite("L0_nullchar_string", ["python", "nullchar_string_client.py", "-m", model, *protocol], nullchar_models,
                ["--gpu-fallback", "cpu"])
          for model in ("python_string", "libtorch_nobatch_zero_1_object")
          for protocol in ([], ["-i", "grpc", "-u", "localhost:8001"])],
        Suite("L0_output_name", ["python", "output_name_test.py", "OutputNameValidationTest"], output_name_models,
              ["--gpu-fallback", "cpu"]),
        Suite("L0_backend_python", ["python", "-m", "pytest", "-q", "python_test.py"], python_test_models,
              ["--allow-client-shm"], place="qa/L0_backend_python/models", server_env={"TRITON_DIR": "{root}"}),
        Suite("L0_parameters", ["python", "-m", "unittest", parameters + "test_params"], copied("L0_parameters/"
                                                                                              "model_repository")),
        Suite("L0_parameters", ["python", "-m", "unittest", parameters + "test_params_reserved_rejected"],
              copied("L0_parameters/model_repository")),
        Suite("L0_parameters", ["python", "-m", "unittest", parameters + "test_headers"],
              copied("L0_parameters/model_repository"),
              ["--grpc-header-forward-pattern", "MY_HEADER.*", "--http-header-forward-pattern", "MY_HEADER.*"]),
        Suite("L0_parameters", ["python", "-m", "unittest", parameters + "test_grpc_header_forward_pattern_case_"
                                "sensitive"], copied("L0_parameters/model_repository"),
              ["--grpc-header-forward-pattern", "(?-i)MY_HEADER.*"]),
        Suite("L0_parameters", ["python", "-m", "unittest", parameters + "test_headers_reserved_rejected"],
              copied("L0_parameters/model_repository"),
              ["--grpc-header-forward-pattern", ".*", "--http-header-forward-pattern", ".*"]),
    ]


def ports_free() -> bool:
    for port in (8000, 8001, 8002):
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return False
    return True


def serve(repo: Path, flags: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    server = subprocess.Popen(
        [sys.executable, "-m", "modelhost", "serve", "--model-repository", str(repo), "--http-port", "8000",
         "--grpc-port", "8001", "--metrics-port", "8002", *flags],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen("http://127.0.0.1:8000/v2/health/ready", timeout=2) as answer:
                if answer.status == 200:
                    return server
        except OSError:
            pass
        if server.poll() is not None:
            break
        time.sleep(0.3)
    server.kill()
    raise SystemExit(f"modelhost did not become ready; see {log}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("qa", type=Path, help="Triton server repository's qa directory")
    parser.add_argument("--only", default="", help="run the suites whose label contains this")
    parser.add_argument("--show", action="store_true", help="print the output of each suite that fails")
    args = parser.parse_args()
    if not ports_free():
        raise SystemExit("ports 8000-8002 are taken: Triton's QA tests hard-code 8000 and 8001")
    work = Path(tempfile.mkdtemp(prefix="triton-qa-"))
    # Triton's shared memory leak probe (qa/common/shm_util.py) imports its C++ triton_shm_monitor, and watches only
    # Triton's Python-backend regions in /dev/shm, which modelhost never makes: a module that is never called.
    (work / "triton_shm_monitor.py").write_text(SHM_MONITOR)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(args.qa / "common"), str(work),
                                                         os.environ.get("PYTHONPATH", "")])}
    for index, suite in enumerate(s for s in suites() if args.only in s.label):
        root = work / f"repo{index}"
        repo = root / suite.place if suite.place else root
        repo.parent.mkdir(parents=True, exist_ok=True)
        suite.repository(args.qa, repo)
        server_env = {name: value.replace("{root}", str(root)) for name, value in suite.server_env.items()}
        server = serve(repo, suite.flags, work / f"server{index}.log", server_env)
        try:
            run = subprocess.run(suite.command, cwd=args.qa / suite.directory, env={**env, **suite.env},
                                 capture_output=True, text=True, timeout=600)
            output = (run.stdout + run.stderr).splitlines()
            lines = [line for line in output if line.startswith(("Ran ", "OK", "FAILED"))]
            pytest = [line.strip("= ") for line in output if line.startswith("=") and (" passed" in line
                                                                                     or " failed" in line)]
            summary = " ".join(pytest[-1:]) or " ".join(lines[-2:]) or f"exit status {run.returncode}"
            print(f"{suite.label}: {summary}", flush=True)
            if args.show and run.returncode:
                print("\n".join(output[-300:]), flush=True)
        finally:
            server.terminate()
            server.wait(30)
    print(f"work directory (repositories, server logs): {work}")


if __name__ == "__main__":
    main()
