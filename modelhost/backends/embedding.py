"""The `embedding` backend: a model that is a table of the process's embedding store (modelhost/embeddings),
looked up in one pass per batch, through the store's RAM cache, from disk for the rest.

    backend: "embedding"
    max_batch_size: 1024
    input  [ { name: "feat_ids"   data_type: TYPE_INT64 dims: [ 39 ] } ]
    output [ { name: "embeddings" data_type: TYPE_FP32  dims: [ 39, 64 ] } ]
    parameters { key: "pooling" value: { string_value: "sum" } }          # none (default), sum, mean
    parameters { key: "index_mode" value: { string_value: "gather" } }    # ids (default), gather

The table is the version directory's `table/` (a table directory: table_files.py), or what `default_model_filename`
names. Ids are any int64 (hashed ids); an id the table does not hold gets its default vector. With pooling, a
second input `lengths` [fields] (INT32 or INT64) says how many of a row's ids belong to each field, in order
(multi-hot fields); the ids after the last field's are padding; the output is one pooled vector per field.
`index_mode: "gather"` reads ids as ONNX Gather reads indices of a table of N rows (`modelhost embeddings extract`
writes such tables): -N..N-1, a negative one counting from the end, anything else refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from modelhost.backends.base import (
    Backend,
    InstanceSettings,
    Model,
    ModelSignature,
    RowUpdates,
    config_signature,
)
from modelhost.config.model_config_pb2 import ModelConfig
from modelhost.config.parameters import string_parameters
from modelhost.config.pbtxt import ConfigError
from modelhost.embeddings.store import TableHandle, shared_store
from modelhost.embeddings.table_files import TableError, TableMeta, current_version, read_meta
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.types import TensorSpec

POOLINGS = ("none", "sum", "mean")
INDEX_MODES = ("ids", "gather")
IDS_INPUT, LENGTHS_INPUT, OUTPUT = "ids", "lengths", "embeddings"


class EmbeddingBackend(Backend):
    name = "embedding"
    platform = "embedding"
    default_filename = "table"

    def describe(self, path: Path) -> ModelSignature:
        dim = _meta(path).dim
        return ModelSignature(inputs=(TensorSpec(IDS_INPUT, "INT64", (-1, -1)),),
                              outputs=(TensorSpec(OUTPUT, "FP32", (-1, -1, dim)),))

    def load(self, path: Path, config: ModelConfig, instance: InstanceSettings) -> Model:
        parameters = string_parameters(config, lower=True)
        pooling = parameters.get("pooling", "none")
        if pooling not in POOLINGS:
            raise ConfigError(f"parameter pooling must be one of {', '.join(POOLINGS)}, got '{pooling}'")
        index_mode = parameters.get("index_mode", "ids")
        if index_mode not in INDEX_MODES:
            raise ConfigError(f"parameter index_mode must be one of {', '.join(INDEX_MODES)}, got '{index_mode}'")
        names = [tensor.name for tensor in config.input]
        wanted = 2 if pooling != "none" else 1
        if names and len(names) != wanted:
            raise ConfigError(f"an embedding model with pooling {pooling} has {wanted} input(s) (ids"
                              f"{', lengths' if wanted == 2 else ''}), the config declares {len(names)}")
        ids_name = names[0] if names else IDS_INPUT
        lengths_name = names[1] if len(names) > 1 else LENGTHS_INPUT
        output_name = config.output[0].name if config.output else OUTPUT
        meta = _meta(path)  # a clear error for a bad table before the store opens it
        signature = _config_signature(config, meta.dim) if names or config.output else None
        handle = shared_store().open(path, config.name)
        return EmbeddingModel(handle, ids_name, lengths_name if pooling != "none" else None, output_name,
                              pooling, index_mode == "gather", signature)


class EmbeddingModel(Model):
    runs_inline = False  # a lookup may wait on the disk: never on the event loop

    def __init__(self, handle: TableHandle, ids_name: str, lengths_name: str | None, output_name: str,
                 pooling: str, gather: bool, signature: ModelSignature | None = None) -> None:
        self._handle = handle
        self._signature = signature
        self._ids = ids_name
        self._lengths = lengths_name
        self._output = output_name
        self._pooling = pooling
        self._gather = gather

    def infer(self, inputs: dict[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        ids = inputs[self._ids]
        if ids.dtype != np.int64:
            raise ModelhostError(ErrorKind.INVALID_INPUT, f"input '{self._ids}' must be INT64 ids, got {ids.dtype}")
        if ids.ndim < 1:
            raise ModelhostError(ErrorKind.INVALID_INPUT, f"input '{self._ids}' must have at least one dimension")
        if self._gather:
            ids = self._gather_rows(ids)
        if self._lengths is None:
            return {self._output: self._handle.lookup(ids)}
        return {self._output: self._pooled(ids, inputs[self._lengths])}

    def _gather_rows(self, ids: np.ndarray) -> np.ndarray:
        rows = self._handle.table.meta.rows
        if ids.size and (int(ids.min()) < -rows or int(ids.max()) >= rows):
            bad = ids[(ids < -rows) | (ids >= rows)].reshape(-1)[0]
            raise ModelhostError(ErrorKind.INVALID_INPUT, f"input '{self._ids}' holds index {int(bad)}, outside "
                                 f"[-{rows}, {rows - 1}] (the table's {rows} rows)")
        with_negatives: np.ndarray = np.where(ids < 0, ids + rows, ids)
        return with_negatives

    def _pooled(self, ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """One vector per field: the sum (or mean) of the vectors of its ids."""
        assert self._lengths is not None
        name = self._lengths
        if not np.issubdtype(lengths.dtype, np.integer):
            raise ModelhostError(ErrorKind.INVALID_INPUT, f"input '{name}' must be integers, got {lengths.dtype}")
        if ids.ndim != 2 or lengths.ndim != 2 or len(lengths) != len(ids):
            raise ModelhostError(ErrorKind.INVALID_INPUT, f"inputs '{self._ids}' [batch, ids] and '{name}' [batch, "
                                 f"fields] must be 2-D with one row each per request, got {list(ids.shape)} and "
                                 f"{list(lengths.shape)}")
        if (lengths < 0).any():
            raise ModelhostError(ErrorKind.INVALID_INPUT, f"input '{name}' holds a negative length")
        totals = lengths.sum(axis=1)
        if (totals > ids.shape[1]).any():
            row = int(np.argmax(totals > ids.shape[1]))
            raise ModelhostError(ErrorKind.INVALID_INPUT, f"input '{name}' row {row} adds up to {int(totals[row])} "
                                 f"ids, but '{self._ids}' has {ids.shape[1]} per row")
        batch, fields = lengths.shape
        ends = np.cumsum(lengths, axis=1)
        positions = np.arange(ids.shape[1])
        field_of = (positions[None, :, None] >= ends[:, None, :]).sum(axis=2)  # [batch, ids]: field, or fields
        valid = field_of < fields
        rows, columns = np.nonzero(valid)
        vectors = self._handle.lookup(ids[rows, columns])
        pooled = np.zeros((batch * fields, vectors.shape[-1]), dtype=np.float32)
        np.add.at(pooled, rows * fields + field_of[rows, columns], vectors)
        pooled = pooled.reshape(batch, fields, -1)
        if self._pooling == "mean":
            pooled /= np.maximum(lengths, 1)[:, :, None]
        return pooled

    def signature(self) -> ModelSignature | None:
        return self._signature

    def row_updates(self) -> RowUpdates | None:
        return None if self._gather else self._handle  # a Gather table's rows are its indices: no ids to update

    def unload(self) -> None:
        shared_store().release(self._handle)


def _config_signature(config: ModelConfig, dim: int) -> ModelSignature:
    """The config's tensors (the table names none), checked against what the backend takes and gives."""
    signature = config_signature(config, "config.pbtxt")
    ids, *rest = signature.inputs
    if ids.datatype != "INT64":
        raise ConfigError(f"config.pbtxt input '{ids.name}' must be TYPE_INT64 (feature ids), not {ids.datatype}")
    if rest and rest[0].datatype not in ("INT32", "INT64"):
        raise ConfigError(f"config.pbtxt input '{rest[0].name}' (lengths) must be TYPE_INT32 or TYPE_INT64")
    if len(signature.outputs) != 1 or signature.outputs[0].datatype != "FP32":
        raise ConfigError("config.pbtxt must declare one output, TYPE_FP32 (the vectors)")
    output = signature.outputs[0]
    if output.shape and output.shape[-1] not in (-1, dim):
        raise ConfigError(f"config.pbtxt output '{output.name}' ends in {output.shape[-1]}, but the table's "
                          f"vectors have {dim} values")
    return signature


def _meta(path: Path) -> TableMeta:
    try:
        return read_meta(current_version(path))
    except TableError as exc:
        raise ConfigError(str(exc).replace(str(path), path.name)) from None
