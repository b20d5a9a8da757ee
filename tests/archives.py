"""Model archives for multi-model tests and benchmarks: model.tar.gz files of small ONNX models."""

from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WIDTH = 64 * 1024  # float32 weights: 256 KiB per model file


def weighted_model(offset: float, width: int = WIDTH) -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 + W, W a [width] initializer filled with `offset` (so each model answers differently)."""
    weights = numpy_helper.from_array(np.full(width, offset, np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "W"], ["OUTPUT0"])], "weighted",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", width])],
        initializer=[weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def write_archives(root: Path, count: int, width: int = WIDTH) -> None:
    """root/model-<i>.tar.gz, each holding one model.onnx at its top (a single model file layout)."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        source = root / f"src-{i}.onnx"
        onnx.save_model(weighted_model(float(i), width), str(source))
        with tarfile.open(root / f"model-{i}.tar.gz", "w:gz") as archive:
            archive.add(source, arcname="model.onnx")
        source.unlink()


def write_archive(path: Path, members: dict[str, bytes]) -> Path:
    """A model.tar.gz at `path` holding `members` (name in the archive -> content)."""
    staging = path.parent / f".staging-{path.name}"
    with tarfile.open(path, "w:gz") as archive:
        for name, content in members.items():
            staging.write_bytes(content)
            archive.add(staging, arcname=name)
    staging.unlink()
    return path
