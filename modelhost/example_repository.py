"""Deterministic generator for the built-in example model repository (Triton layout, ONNX models)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from modelhost.embeddings.extract import extract

VERSION = 2  # 2: deepfm_tiered (its tables written by modelhost/embeddings, whose code the tag does not hash)
OPSET = 17
IR_VERSION = 8

RANK_FEATURES = 1000
DEEPFM_FIELDS = 39
DEEPFM_EMBED_DIM = 16
DEEPFM_VOCAB = 100_000
MAX_BATCH_SIZE = 1024

_TRITON_TYPES: dict[int, str] = {TensorProto.FLOAT: "TYPE_FP32", TensorProto.INT64: "TYPE_INT64"}

Spec = tuple[str, int, list[int]]


def _init(name: str, array: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(array, name)


def _weights(rng: np.random.Generator, fan_in: int, fan_out: int, gain: float = 2.0) -> np.ndarray:
    weights: np.ndarray = rng.standard_normal((fan_in, fan_out)) * np.sqrt(gain / fan_in)
    return weights.astype(np.float32)


def _dense(rng: np.random.Generator, prefix: str, x: str, sizes: list[int],
           last_act: str | None) -> tuple[list[onnx.NodeProto], list[TensorProto], str]:
    """Gemm chain over sizes; Relu between layers, last_act (or nothing) after the final one."""
    nodes, inits = [], []
    for i, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:])):
        last = i == len(sizes) - 2
        w, b, y = f"{prefix}_w{i}", f"{prefix}_b{i}", f"{prefix}_fc{i}"
        inits += [_init(w, _weights(rng, fan_in, fan_out, 1.0 if last else 2.0)),
                  _init(b, np.zeros(fan_out, np.float32))]
        nodes.append(helper.make_node("Gemm", [x, w, b], [y]))
        act = last_act if last else "Relu"
        if act:
            nodes.append(helper.make_node(act, [y], [f"{y}_{act.lower()}"]))
            y = f"{y}_{act.lower()}"
        x = y
    return nodes, inits, x


def _model(name: str, nodes: list[onnx.NodeProto], inits: list[TensorProto],
           inputs: list[Spec], outputs: list[Spec]) -> onnx.ModelProto:
    def info(spec: Spec) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(spec[0], spec[1], ["batch", *spec[2]])

    graph = helper.make_graph(nodes, name, [info(s) for s in inputs], [info(s) for s in outputs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="modelhost")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def _config(name: str, inputs: list[Spec], outputs: list[Spec]) -> str:
    def tensors(specs: list[Spec]) -> str:
        return ",\n".join(
            f'  {{\n    name: "{n}"\n    data_type: {_TRITON_TYPES[t]}\n    dims: [ {", ".join(map(str, d))} ]\n  }}'
            for n, t, d in specs)

    return (f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {MAX_BATCH_SIZE}\n'
            f"input [\n{tensors(inputs)}\n]\noutput [\n{tensors(outputs)}\n]\n"
            "instance_group [\n  {\n    count: 1\n    kind: KIND_CPU\n  }\n]\n")


def _rank() -> tuple[onnx.ModelProto, list[Spec], list[Spec]]:
    inputs: list[Spec] = [("features", TensorProto.FLOAT, [RANK_FEATURES])]
    outputs: list[Spec] = [("score", TensorProto.FLOAT, [1])]
    nodes, inits, y = _dense(np.random.default_rng(1), "mlp", "features", [RANK_FEATURES, 256, 64, 1], "Sigmoid")
    nodes.append(helper.make_node("Identity", [y], ["score"]))
    return _model("rank", nodes, inits, inputs, outputs), inputs, outputs


def _deepfm() -> tuple[onnx.ModelProto, list[Spec], list[Spec]]:
    inputs: list[Spec] = [
        ("feat_ids", TensorProto.INT64, [DEEPFM_FIELDS]),
        ("feat_vals", TensorProto.FLOAT, [DEEPFM_FIELDS]),
    ]
    outputs: list[Spec] = [("prob", TensorProto.FLOAT, [1])]
    rng = np.random.default_rng(2)
    inits = [
        _init("embedding", (rng.standard_normal((DEEPFM_VOCAB, DEEPFM_EMBED_DIM)) * 0.1).astype(np.float32)),
        _init("first_order", (rng.standard_normal((DEEPFM_VOCAB, 1)) * 0.05).astype(np.float32)),
        _init("bias", np.array([-0.5], np.float32)),
        _init("vocab", np.array(DEEPFM_VOCAB, np.int64)),
        _init("axis1", np.array([1], np.int64)),
        _init("axis2", np.array([2], np.int64)),
        _init("half", np.array(0.5, np.float32)),
    ]
    node = helper.make_node
    nodes = [
        node("Unsqueeze", ["feat_vals", "axis2"], ["vals3"]),
        node("Gather", ["embedding", "feat_ids"], ["emb_raw"]),
        node("Mul", ["emb_raw", "vals3"], ["emb"]),
        # Gather accepts negative indices; shifting by -VOCAB makes ids < 0 fail its bounds check.
        node("Sub", ["feat_ids", "vocab"], ["ids_shifted"]),
        node("Gather", ["first_order", "ids_shifted"], ["w1"]),
        node("Mul", ["w1", "vals3"], ["w1x"]),
        node("ReduceSum", ["w1x", "axis1"], ["first"], keepdims=0),
        node("ReduceSum", ["emb", "axis1"], ["sum_e"], keepdims=0),
        node("Mul", ["sum_e", "sum_e"], ["sum_e_sq"]),
        node("Mul", ["emb", "emb"], ["emb_sq"]),
        node("ReduceSum", ["emb_sq", "axis1"], ["sum_sq_e"], keepdims=0),
        node("Sub", ["sum_e_sq", "sum_sq_e"], ["fm_diff"]),
        node("ReduceSum", ["fm_diff", "axis1"], ["fm_sum"], keepdims=1),
        node("Mul", ["fm_sum", "half"], ["fm"]),
        node("Flatten", ["emb"], ["dnn_in"], axis=1),
    ]
    dnn_nodes, dnn_inits, dnn = _dense(rng, "dnn", "dnn_in", [DEEPFM_FIELDS * DEEPFM_EMBED_DIM, 200, 200, 1], None)
    nodes += dnn_nodes + [
        node("Add", ["first", "fm"], ["logit0"]),
        node("Add", ["logit0", dnn], ["logit1"]),
        node("Add", ["logit1", "bias"], ["logit"]),
        node("Sigmoid", ["logit"], ["prob"]),
    ]
    return _model("deepfm", nodes, inits + dnn_inits, inputs, outputs), inputs, outputs


def _tiny() -> tuple[onnx.ModelProto, list[Spec], list[Spec]]:
    inputs: list[Spec] = [("x", TensorProto.FLOAT, [4])]
    outputs: list[Spec] = [("y", TensorProto.FLOAT, [4])]
    inits = [_init("two", np.array(2.0, np.float32)), _init("one", np.array(1.0, np.float32))]
    nodes = [helper.make_node("Mul", ["x", "two"], ["x2"]), helper.make_node("Add", ["x2", "one"], ["y"])]
    return _model("tiny", nodes, inits, inputs, outputs), inputs, outputs


MODELS = {"rank": _rank, "deepfm": _deepfm, "tiny": _tiny}


def write_example_repository(dest: Path) -> Path:
    """Write the example repository into dest (created if needed) and return dest."""
    dest = Path(dest)
    for name, build in MODELS.items():
        model, inputs, outputs = build()
        version_dir = dest / name / "1"
        version_dir.mkdir(parents=True, exist_ok=True)
        onnx.save_model(model, str(version_dir / "model.onnx"))
        (dest / name / "config.pbtxt").write_text(_config(name, inputs, outputs))
    # The same DeepFM with its embedding table in the embedding store (an ensemble: table lookup, dense network).
    extract(dest / "deepfm" / "1" / "model.onnx", dest, "deepfm_tiered", max_batch_size=MAX_BATCH_SIZE)
    return dest


def repository_tag() -> str:
    source = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
    return f"example-v{VERSION}-{source}"


def ensure_example_repository(cache_root: Path) -> Path:
    """Return cache_root/<tag>, writing it once atomically (temp dir, then rename into place)."""
    cache_root = Path(cache_root)
    target = cache_root / repository_tag()
    if target.is_dir():
        return target
    cache_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=cache_root))
    tmp.chmod(0o755)
    try:
        write_example_repository(tmp)
        os.replace(tmp, target)
    except OSError:
        if not target.is_dir():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
