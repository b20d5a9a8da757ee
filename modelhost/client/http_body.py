"""KServe V2 HTTP bodies, the client's side: an infer request's body parts, and the tensors of an answer.

Binary tensors (Triton's binary data extension) by default: the JSON header, then each input's bytes as its
own part, written to the socket without joining. Answers' binary outputs are numpy views of the body.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson

from modelhost.client.errors import ClientError
from modelhost.errors import ModelhostError
from modelhost.protocols.kserve_v2.codec import tensor_from_bytes, tensor_from_json, tensor_view
from modelhost.types import DATATYPE_DTYPES, datatype_of

Parts = list[bytes | memoryview]


def encode_request(
    inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None, parameters: Mapping[str, Any],
    request_id: str = "", binary: bool = True,
) -> tuple[Parts, int | None]:
    """The body's parts and, when binary parts follow the JSON header, the header's length."""
    entries = []
    chunks: Parts = []
    for name, array in inputs.items():
        entry: dict[str, Any] = {"name": name, "datatype": datatype_of(array), "shape": list(array.shape)}
        if binary:
            data = tensor_view(array)
            entry["parameters"] = {"binary_data_size": len(data)}
            chunks.append(data)
        else:
            entry["data"] = _json_data(array)
        entries.append(entry)
    document: dict[str, Any] = {}
    if request_id:
        document["id"] = request_id
    params = dict(parameters)
    if outputs is None:
        params.setdefault("binary_data_output", binary)
    if params:
        document["parameters"] = params
    document["inputs"] = entries
    if outputs is not None:
        document["outputs"] = [{"name": name, "parameters": {"binary_data": binary}} for name in outputs]
    header = orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)
    if chunks:
        return [header, *chunks], len(header)
    return [header], None


def _json_data(array: np.ndarray) -> Any:
    if array.dtype.kind in "OSU":
        return [e.decode("utf-8") if isinstance(e, bytes) else str(e) for e in array.flat]
    if array.dtype == np.float16:
        raise ClientError(0, "FP16 tensors cannot be sent as JSON; send them binary")
    return np.ascontiguousarray(array.reshape(-1))


def decode_response(body: bytes, header_length: int | None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The answer's outputs by name (in the server's order) and its JSON document less the outputs."""
    if header_length is None:
        header_length = len(body)
    if not 0 < header_length <= len(body):
        raise ClientError(0, f"the server's Inference-Header-Content-Length {header_length} is outside its "
                             f"{len(body)}-byte answer")
    view = memoryview(body)
    try:
        document = orjson.loads(view[:header_length])
    except orjson.JSONDecodeError as exc:
        raise ClientError(0, f"the server's answer is not valid JSON: {exc}") from None
    if not isinstance(document, dict) or not isinstance(document.get("outputs", []), list):
        raise ClientError(0, "the server's answer is not a V2 inference response (no 'outputs' list)")
    outputs: dict[str, np.ndarray] = {}
    offset = header_length
    try:
        for entry in document.pop("outputs", []):
            name, datatype, shape = entry["name"], entry["datatype"], tuple(entry["shape"])
            if datatype not in DATATYPE_DTYPES:
                raise ClientError(0, f"output '{name}' has datatype {datatype!r}, which this client cannot read")
            size = (entry.get("parameters") or {}).get("binary_data_size")
            if size is None:
                outputs[name] = tensor_from_json(name, datatype, shape, entry.get("data", []))
                continue
            if offset + size > len(body):
                raise ClientError(0, f"output '{name}' has {size} bytes of binary data, past the answer's end")
            outputs[name] = tensor_from_bytes(name, datatype, shape, view[offset : offset + size])
            offset += size
    except ModelhostError as exc:  # the codec's words are about a request; here the server sent it
        raise ClientError(0, f"the server's answer is malformed: {exc.message}") from None
    except (KeyError, TypeError) as exc:
        raise ClientError(0, f"the server's answer has a malformed output entry ({exc!r})") from None
    return outputs, document


def error_message(body: bytes) -> str:
    """The server's message in a V2 error answer ({"error": "..."}), or the body as text."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:1000].decode("utf-8", "replace").strip()
    if isinstance(document, dict) and isinstance(document.get("error"), str):
        return str(document["error"])
    return body[:1000].decode("utf-8", "replace").strip()
