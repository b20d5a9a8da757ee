"""The requests a load test sends: made from the model's metadata (random or zero data) or read from files of
real requests (perf_analyzer's JSON input data, V2 request bodies, .npy / .npz arrays)."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from modelhost.errors import ModelhostError
from modelhost.protocols.kserve_v2.codec import decode_infer_request
from modelhost.types import DATATYPE_DTYPES

Request = dict[str, np.ndarray]
RANDOM_REQUESTS = 16  # distinct random requests, sent in turn
MAX_FILE_BYTES = 2 * 1024**3


class InputError(ValueError):
    """Inputs that cannot be made: the message says which input and why."""


def request_shapes(metadata: Mapping[str, Any], max_batch_size: int, batch_size: int,
                   shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each input's (datatype, full shape): the batch dim is `batch_size` when the model batches; other
    variable dims come from `shapes` (dims without the batch dim, as perf_analyzer's --shape)."""
    result = {}
    for entry in metadata.get("inputs", []):
        name, datatype, dims = entry["name"], entry["datatype"], [int(d) for d in entry["shape"]]
        if max_batch_size > 0 and dims:
            dims = dims[1:]
        if name in shapes:
            given = list(shapes[name])
            if len(given) != len(dims) or any(d not in (-1, g) for d, g in zip(dims, given)):
                raise InputError(f"--shape {name}:{','.join(map(str, given))} does not fit input '{name}' of "
                                 f"shape {dims}")
            dims = given
        if any(d < 0 for d in dims):
            raise InputError(f"input '{name}' has variable dims {dims}: give them with --shape {name}:D1,D2,...")
        if datatype not in DATATYPE_DTYPES:
            raise InputError(f"input '{name}' is {datatype}, which this load generator cannot make")
        result[name] = (datatype, tuple([batch_size] if max_batch_size > 0 else []) + tuple(dims))
    if not result:
        raise InputError("the model's metadata lists no inputs")
    return result


def synthetic_requests(shapes: Mapping[str, tuple[str, tuple[int, ...]]], kind: str, seed: int = 0,
                       count: int = RANDOM_REQUESTS) -> list[Request]:
    """`count` requests of random data (kind "random") or one of zeros ("zero")."""
    rng = np.random.default_rng(seed)
    if kind == "zero":
        return [{name: _zeros(datatype, shape) for name, (datatype, shape) in shapes.items()}]
    return [{name: _random(rng, datatype, shape) for name, (datatype, shape) in shapes.items()}
            for _ in range(count)]


def _zeros(datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    if datatype == "BYTES":
        return np.full(shape, b"0", dtype=object)
    return np.zeros(shape, DATATYPE_DTYPES[datatype])


def _random(rng: np.random.Generator, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    dtype = DATATYPE_DTYPES[datatype]
    if datatype == "BYTES":
        return np.array([str(v).encode() for v in rng.integers(0, 1 << 30, int(np.prod(shape)))],
                        dtype=object).reshape(shape)
    if datatype == "BOOL":
        return rng.integers(0, 2, shape).astype(np.bool_)
    if dtype.kind in "iu":
        return rng.integers(0, 100, shape).astype(dtype)  # small non-negative ids fit any index input
    return rng.standard_normal(shape).astype(dtype)


def file_requests(path: Path, shapes: Mapping[str, tuple[str, tuple[int, ...]]]) -> list[Request]:
    """Requests read from `path`: .npy (the model's one input), .npz (inputs by name), or JSON: perf_analyzer's
    {"data": [{input: values | {"content", "shape"} | {"b64"}}, ...]}, a V2 request body, or a list of them."""
    if not path.is_file():
        raise InputError(f"input data file {path} does not exist")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise InputError(f"input data file {path} is over {MAX_FILE_BYTES >> 30} GiB")
    if path.suffix == ".npy":
        if len(shapes) != 1:
            raise InputError(f"a .npy file holds one input, but the model has {len(shapes)}; use .npz")
        return [{next(iter(shapes)): np.load(path, allow_pickle=False)}]
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as arrays:
            request = {name: arrays[name] for name in arrays.files}
        _check_names(request, shapes, str(path))
        return [request]
    try:
        document = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise InputError(f"{path} is not valid JSON: {exc}") from None
    if isinstance(document, dict) and "data" in document:
        return [_perf_analyzer_entry(entry, shapes, f"{path} data[{i}]") for i, entry in enumerate(document["data"])]
    bodies = document if isinstance(document, list) else [document]
    requests = []
    for index, body in enumerate(bodies):
        try:
            request = dict(decode_infer_request(orjson.dumps(body), None, "").inputs)
        except ModelhostError as exc:
            raise InputError(f"{path} request {index}: {exc.message}") from None
        _check_names(request, shapes, f"{path} request {index}")
        requests.append(request)
    if not requests:
        raise InputError(f"{path} holds no requests")
    return requests


def model_requests(metadata: Mapping[str, Any], config: Mapping[str, Any], batch_size: int,
                   shapes: Mapping[str, Sequence[int]], input_data: str) -> list[Request]:
    """The requests to send a model described by its V2 metadata and config: `input_data` is "random", "zero"
    or a file (file_requests)."""
    specs = request_shapes(metadata, int(config.get("max_batch_size", 0) or 0), batch_size, shapes)
    if input_data in ("random", "zero"):
        return synthetic_requests(specs, input_data)
    return file_requests(Path(input_data), specs)


def _perf_analyzer_entry(entry: Any, shapes: Mapping[str, tuple[str, tuple[int, ...]]], where: str) -> Request:
    if not isinstance(entry, dict):
        raise InputError(f"{where} must be an object of input name -> data")
    request = {}
    for name, value in entry.items():
        if name not in shapes:
            raise InputError(f"{where} has input '{name}', which the model does not have")
        datatype, shape = shapes[name]
        dtype = DATATYPE_DTYPES[datatype]
        if isinstance(value, dict) and "b64" in value:
            array = np.frombuffer(base64.b64decode(value["b64"]), dtype)
        elif isinstance(value, dict):
            array = np.asarray(value.get("content", []), dtype)
            shape = tuple(value.get("shape", shape))
        else:
            array = np.asarray(value, dtype)
        try:
            request[name] = array.reshape(shape) if array.ndim <= 1 else array
        except ValueError:
            raise InputError(f"{where}: input '{name}' has {array.size} values, which do not make shape "
                             f"{list(shape)}") from None
    _check_names(request, shapes, where)
    return request


def _check_names(request: Request, shapes: Mapping[str, Any], where: str) -> None:
    missing = sorted(set(shapes) - set(request))
    if missing:
        raise InputError(f"{where} lacks input(s) {', '.join(missing)}")
