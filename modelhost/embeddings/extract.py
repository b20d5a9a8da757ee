"""`modelhost embeddings extract`: an ONNX model whose large `Gather` tables (embedding tables: initializers of
N x D gathered by ids) move into the embedding store, written as a Triton repository of models that an ensemble
runs in turn, so that a model whose tables outgrow RAM serves through the store's cache.

    <repository>/<name>/                      the ensemble: the original model's inputs and outputs
    <repository>/<name>_index/1/model.onnx    what computes the gathered indices from the inputs, if they are not
                                              inputs themselves (DeepFM's `ids - vocab` for a second table)
    <repository>/<name>_<table>/1/table/      one embedding model per table (index_mode gather: ONNX's indices)
    <repository>/<name>_dense/1/model.onnx    the rest of the graph, taking each Gather's output as an input

The pieces are cut from the original graph (onnx.utils.Extractor), so the ensemble computes what the model did.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper, shape_inference
from onnx.utils import Extractor

from modelhost.embeddings.table_files import write_version

DEFAULT_MIN_BYTES = 1 << 20
_TYPES: dict[int, str] = {onnx.TensorProto.FLOAT: "TYPE_FP32", onnx.TensorProto.INT64: "TYPE_INT64",
          onnx.TensorProto.INT32: "TYPE_INT32", onnx.TensorProto.DOUBLE: "TYPE_FP64",
          onnx.TensorProto.FLOAT16: "TYPE_FP16", onnx.TensorProto.BOOL: "TYPE_BOOL"}


class ExtractError(Exception):
    """The model cannot be split as asked; the message says why."""


@dataclass(frozen=True, slots=True)
class GatherTable:
    initializer: str  # the table's name in the graph
    indices: str  # the tensor the Gather reads its indices from
    output: str  # the Gather's output
    rows: int
    dim: int


def find_tables(model: onnx.ModelProto, min_bytes: int = DEFAULT_MIN_BYTES) -> list[GatherTable]:
    """The Gathers along axis 0 of a 2-D initializer of at least `min_bytes`."""
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    found = []
    for node in model.graph.node:
        if node.op_type != "Gather" or node.input[0] not in initializers:
            continue
        axis = next((attribute.i for attribute in node.attribute if attribute.name == "axis"), 0)
        tensor = initializers[node.input[0]]
        if axis != 0 or len(tensor.dims) != 2:
            continue
        rows, dim = tensor.dims
        if rows * dim * 4 >= min_bytes:
            found.append(GatherTable(tensor.name, node.input[1], node.output[0], rows, dim))
    names = [table.initializer for table in found]
    if len(set(names)) != len(names):
        raise ExtractError("a table is gathered by several Gathers; extract handles one Gather per table")
    return found


def extract(model_path: Path, repository: Path, name: str, min_bytes: int = DEFAULT_MIN_BYTES,
            dtype: str = "float32", max_batch_size: int = 1024) -> list[GatherTable]:
    """Write the ensemble `name` and its models into `repository`; returns the tables moved."""
    model = shape_inference.infer_shapes(onnx.load(str(model_path)))
    tables = find_tables(model, min_bytes)
    if not tables:
        raise ExtractError(f"{model_path.name} has no Gather of a 2-D initializer of {min_bytes} bytes or more")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ExtractError(f"'{name}' is not a model name (letters, digits, _ . -)")
    initializers = {tensor.name for tensor in model.graph.initializer}
    inputs = [value for value in model.graph.input if value.name not in initializers]
    input_names = [value.name for value in inputs]
    shapes = _value_shapes(model)
    steps = []
    computed = [table.indices for table in tables if table.indices not in input_names]
    if computed:
        wanted = list(dict.fromkeys(computed))
        index_model = Extractor(model).extract_model(_needed(model, input_names, wanted), wanted)
        _write_onnx(repository / f"{name}_index", index_model, max_batch_size)
        steps.append(_step(f"{name}_index", index_model))
    for table in tables:
        vectors = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == table.initializer))
        model_name = f"{name}_{_safe(table.initializer)}"
        directory = repository / model_name
        write_version(directory / "1" / "table", np.arange(table.rows), vectors.astype(np.float32), dtype)
        index_dims = shapes.get(table.indices, [-1, -1])[1:]
        (directory / "config.pbtxt").write_text(
            f'name: "{model_name}"\nbackend: "embedding"\nmax_batch_size: {max_batch_size}\n'
            f'input [ {{ name: "index" data_type: TYPE_INT64 dims: {_dims(index_dims)} }} ]\n'
            f'output [ {{ name: "vectors" data_type: TYPE_FP32 dims: {_dims([*index_dims, table.dim])} }} ]\n'
            'parameters { key: "index_mode" value: { string_value: "gather" } }\n')
        steps.append((model_name, {"index": table.indices}, {"vectors": table.output}))
    outputs = [value.name for value in model.graph.output]
    dense = Extractor(model).extract_model(_needed(model, input_names + [t.output for t in tables], outputs), outputs)
    _write_onnx(repository / f"{name}_dense", dense, max_batch_size)
    steps.append(_step(f"{name}_dense", dense))
    _write_ensemble(repository / name, name, model, inputs, steps, max_batch_size)
    return tables


def _step(model_name: str, model: onnx.ModelProto) -> tuple[str, dict[str, str], dict[str, str]]:
    """An ensemble step whose model's tensors keep the original graph's names."""
    return (model_name, {value.name: value.name for value in model.graph.input},
            {value.name: value.name for value in model.graph.output})


def _write_onnx(directory: Path, model: onnx.ModelProto, max_batch_size: int) -> None:
    (directory / "1").mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(directory / "1" / "model.onnx"))
    (directory / "config.pbtxt").write_text(
        f'name: "{directory.name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch_size}\n')


def _write_ensemble(directory: Path, name: str, model: onnx.ModelProto, inputs: list[onnx.ValueInfoProto],
                    steps: list[tuple[str, dict[str, str], dict[str, str]]], max_batch_size: int) -> None:
    def tensors(values: list[onnx.ValueInfoProto]) -> str:
        entries = []
        for value in values:
            kind = value.type.tensor_type.elem_type
            if kind not in _TYPES:
                raise ExtractError(f"tensor '{value.name}' has an ONNX type modelhost's config cannot name ({kind})")
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in value.type.tensor_type.shape.dim][1:]
            entries.append(f'{{ name: "{value.name}" data_type: {_TYPES[kind]} dims: {_dims(dims)} }}')
        return ", ".join(entries)

    lines = [f'name: "{name}"', 'platform: "ensemble"', f"max_batch_size: {max_batch_size}",
             f"input [ {tensors(inputs)} ]", f"output [ {tensors(list(model.graph.output))} ]",
             "ensemble_scheduling {"]
    for model_name, input_map, output_map in steps:
        maps = [f'input_map {{ key: "{key}" value: "{value}" }}' for key, value in input_map.items()]
        maps += [f'output_map {{ key: "{key}" value: "{value}" }}' for key, value in output_map.items()]
        lines.append(f'  step {{ model_name: "{model_name}" model_version: -1 {" ".join(maps)} }}')
    lines.append("}")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "1").mkdir(exist_ok=True)
    (directory / "config.pbtxt").write_text("\n".join(lines) + "\n")


def _needed(model: onnx.ModelProto, sources: list[str], outputs: list[str]) -> list[str]:
    """The `sources` (tensors a piece of the graph is given) that computing `outputs` reads."""
    producer = {output: node for node in model.graph.node for output in node.output}
    given = set(sources)
    used: set[str] = set()
    pending = list(outputs)
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in given:
            used.add(name)
        elif name in producer:
            pending.extend(producer[name].input)
    return [name for name in sources if name in used]


def _value_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    shapes = {}
    for value in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        shape = value.type.tensor_type.shape
        shapes[value.name] = [d.dim_value if d.HasField("dim_value") else -1 for d in shape.dim]
    return shapes


def _dims(dims: list[int]) -> str:
    return "[ " + ", ".join(str(d) for d in dims) + " ]"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)
