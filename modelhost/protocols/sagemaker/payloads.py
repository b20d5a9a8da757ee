"""SageMaker `POST /invocations` bodies <-> protocol-neutral requests and responses (protocols §6.1, §6.5, §7).

Pure functions with no I/O; the front-end decodes, runs the request, and encodes for the negotiated Accept.
Content-Type is compared lower-cased without parameters; a missing one means application/json (SageMaker's
default). Every data error is ModelhostError(INVALID_INPUT) naming the field, line or instance; a type the
server cannot read or write is MediaTypeError (415 / 406). Arrays have the input's dtype, batch dim first.

Requests, and the `form` each is remembered as:
- application/json, chosen as SageMaker's TF Serving container chooses (§7.2):
  an object with "instances" or "inputs" is a TF Serving predict body ("row" / "columnar"), except that an
  "inputs" list whose items all are objects with "datatype" and "shape" is a KServe V2 inference request ("v2";
  its id, parameters and requested outputs kept; the V2 body names no model, so model_name stays "").
  A body that is not one JSON value but whose non-empty lines each are one is JSON Lines ("jsonlines").
  Any other value is row-format instances ("row"): a list whose items are lists (the container's "[[" test) or
  objects keyed by input name is the list of instances, anything else is one instance. One deliberate
  extension: a flat list of scalars for a model whose single input holds one value per row (dims [-1]) is a
  batch of those scalars, where the container would send one instance of the wrong shape.
- application/jsonlines (or application/jsonl, application/x-jsonlines, application/jsons): each non-empty line
  is one instance, a value (one input) or an object by input name ("jsonlines"). Unlike the container, a single
  line is always one instance; instance numbers in errors count the lines that hold data, from 0.
- text/csv: one instance per line for a model with one input (csv_payload) ("csv").
- application/x-npy: one array, batch first, for a model with one input (npy_payload) ("npy").
- application/x-protobuf (or application/protobuf, application/vnd.google.protobuf): a serialized
  tensorflow.serving.PredictRequest ("protobuf"); its model_spec name and version fill the request, its
  output_filter becomes the requested outputs; version labels are refused.
- application/octet-stream and application/vnd.sagemaker-triton.binary+json;json-header-size=N: the SageMaker
  Triton container's V2 requests (triton_payloads) ("triton"); answered as that container answers, whatever
  Accept says (`encode_answer`).
- application/x-npz and text/libsvm: sparse rows for a model whose one input is a float matrix of fixed width
  (sparse_payload) ("npz", "libsvm"); another model gets a 415 listing what it accepts.

Responses, by Accept (media_types.choose_accept), with the Content-Type as the client named it:
- application/json: "columnar" -> {"outputs": ...}, "v2" -> the V2 response JSON (no binary parts), every other
  form -> {"predictions": [...]} in TF Serving's row format. NaN and infinities are written as null.
- application/jsonlines: one JSON per batch row, newline-terminated: the row's TF Serving row prediction (the
  value for one output, an object by output name for several).
- text/csv: one line per batch row (csv_payload). application/x-npy: the only output (npy_payload).
- application/x-protobuf: a serialized tensorflow.serving.PredictResponse (numbers in tensor_content).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from modelhost.errors import ModelhostError, invalid
from modelhost.protocols.json_tensors import JsonNumbers
from modelhost.protocols.kserve_v2.codec import TENSOR_PATHS, decode_infer_request, encode_infer_response
from modelhost.protocols.sagemaker.csv_payload import decode_csv, encode_csv
from modelhost.protocols.sagemaker.media_types import (
    CSV,
    JSON,
    JSONLINES,
    LIBSVM,
    NPY,
    NPZ,
    OCTET_STREAM,
    PROTOBUF,
    REQUEST_TYPES,
    RESPONSE_TYPES,
    TRITON_BINARY,
    MediaTypeError,
    choose_accept,
    format_of,
    media_type,
)
from modelhost.protocols.sagemaker.npy_payload import decode_npy, encode_npy
from modelhost.protocols.sagemaker.sparse_payload import accepted_types, decode_libsvm, decode_npz, sparse_input
from modelhost.protocols.sagemaker.triton_payloads import asks_binary, decode_triton, encode_triton
from modelhost.protocols.tfserving.json_codec import (
    COLUMNAR,
    ROW,
    decode_predict_document,
    encode_predict,
    parse_json,
    parse_predict_json,
    row_predictions,
)
from modelhost.protocols.tfserving.tensor_proto import decode_predict_request, encode_predict_response
from modelhost.types import DEFAULT_LIMITS, InferRequest, InferResponse, RequestedOutput, RequestLimits, TensorSpec

__all__ = [
    "CSV", "JSON", "JSONLINES", "NPY", "PROTOBUF", "REQUEST_TYPES", "RESPONSE_TYPES", "Invocation", "MediaTypeError",
    "choose_accept", "decode_invocation", "encode_answer", "encode_invocation", "media_type",
]


TRITON = "triton"
_JSON_TENSOR_PATHS = ((), *TENSOR_PATHS)  # a bare list of rows, a V2 request's data


@dataclass(frozen=True, slots=True)
class Invocation:
    """A decoded invocation: the request (inputs filled) and how the caller spoke ("row", "csv", ...)."""

    request: InferRequest
    form: str


def decode_invocation(
    body: bytes, content_type: str | None, inputs: Sequence[TensorSpec], limits: RequestLimits = DEFAULT_LIMITS
) -> Invocation:
    """The request in an /invocations body; `inputs` are the model's input specs, `limits` bound its tensors."""
    kind = format_of(media_type(content_type) or JSON)
    if kind == JSON:
        return _decode_json(body, inputs, limits)
    if kind == JSONLINES:
        return _decode_json_lines(body, inputs, limits)
    if kind == CSV:
        spec = _only_input(inputs, CSV)
        return Invocation(InferRequest("", {spec.name: decode_csv(body, spec, limits)}), "csv")
    if kind == NPY:
        spec = _only_input(inputs, NPY)
        return Invocation(InferRequest("", {spec.name: decode_npy(body, spec, limits)}), "npy")
    if kind == PROTOBUF:
        return _decode_protobuf(body, inputs, limits)
    if kind in (OCTET_STREAM, TRITON_BINARY):
        return Invocation(decode_triton(body, content_type or "", limits), TRITON)
    if kind in (NPZ, LIBSVM):
        spec = sparse_input(inputs, kind)
        decoded = (decode_npz if kind == NPZ else decode_libsvm)(body, spec, limits)
        return Invocation(InferRequest("", {spec.name: decoded}), kind.rsplit("/", 1)[1].removeprefix("x-"))
    raise MediaTypeError(415, f"Content-Type '{content_type}' is not supported; this model accepts: "
                              f"{', '.join(accepted_types(inputs))}")


def _decode_json(body: bytes, inputs: Sequence[TensorSpec], limits: RequestLimits) -> Invocation:
    try:
        document = parse_predict_json(body, also=_JSON_TENSOR_PATHS)
    except ModelhostError:
        lines = _json_lines(body)
        if lines is None:
            raise
        return _rows(lines, inputs, "jsonlines", limits)
    if isinstance(document, dict) and ("instances" in document or "inputs" in document):
        if _is_v2(document):
            return Invocation(decode_infer_request(body, None, "", limits=limits, document=document), "v2")
        arrays, form = decode_predict_document(document, inputs, limits)
        return Invocation(InferRequest("", arrays), form)
    return _rows(_instances(document, inputs), inputs, ROW, limits)


def _decode_json_lines(body: bytes, inputs: Sequence[TensorSpec], limits: RequestLimits) -> Invocation:
    numbered = [(number, line) for number, line in enumerate(body.splitlines(), 1) if line.strip()]
    if not numbered:
        raise invalid("JSON Lines body has no lines with data; send one instance per line")
    return _rows([parse_json(line, f"line {number}") for number, line in numbered], inputs, "jsonlines", limits)


def _json_lines(body: bytes) -> list[Any] | None:
    """The values of a body whose non-empty lines (two or more) are each one JSON value, else None."""
    lines = [line for line in body.splitlines() if line.strip()]
    if len(lines) < 2:
        return None
    try:
        return [parse_json(line) for line in lines]
    except ModelhostError:
        return None


def _is_v2(document: dict[str, Any]) -> bool:
    entries = document.get("inputs")
    return (
        isinstance(entries, list)
        and bool(entries)
        and all(isinstance(e, dict) and "datatype" in e and "shape" in e for e in entries)
    )


def _instances(document: Any, inputs: Sequence[TensorSpec]) -> list[Any] | JsonNumbers:
    """A JSON value that is not a predict body as row-format instances (see the module docstring)."""
    if isinstance(document, JsonNumbers):
        if len(document.shape) == 2 or (len(inputs) == 1 and len(inputs[0].shape) == 1):
            return document  # lists of numbers, or one number per row: the list is the batch, as below
        document = document.as_list()
    if not isinstance(document, list):
        return [document]
    if not document:
        raise invalid("request body is an empty JSON list; send at least one instance")
    first = document[0]
    if isinstance(first, list) or _is_named(first):
        return document
    if len(inputs) == 1 and len(inputs[0].shape) == 1:
        return document  # one scalar per row: the list is the batch
    return [document]


def _is_named(value: Any) -> bool:
    """An object keyed by input name, as opposed to a {"b64": ...} value."""
    return isinstance(value, dict) and not (len(value) == 1 and "b64" in value)


def _rows(instances: list[Any] | JsonNumbers, inputs: Sequence[TensorSpec], form: str,
          limits: RequestLimits) -> Invocation:
    arrays, _ = decode_predict_document({"instances": instances}, inputs, limits)
    return Invocation(InferRequest("", arrays), form)


def _only_input(inputs: Sequence[TensorSpec], content_type: str) -> TensorSpec:
    """The one input a single-array format fills: the only input, or the only required one."""
    required = [spec for spec in inputs if not spec.optional]
    candidates = required or list(inputs)
    if len(candidates) != 1:
        names = ", ".join(f"'{spec.name}'" for spec in inputs) or "none"
        raise invalid(
            f"{content_type} carries one input, but the model has {len(inputs)} inputs ({names}); "
            "send application/json with an object per instance"
        )
    return candidates[0]


def _decode_protobuf(body: bytes, inputs: Sequence[TensorSpec], limits: RequestLimits) -> Invocation:
    arrays, spec, output_filter = decode_predict_request(body, inputs, limits)
    if spec.version_label:
        raise invalid(f"model_spec.version_label '{spec.version_label}' is not supported; name a version number")
    outputs = [RequestedOutput(name) for name in output_filter] or None
    return Invocation(InferRequest(spec.name, arrays, spec.version, outputs=outputs), "protobuf")


def encode_answer(response: InferResponse, invocation: Invocation, accept: str | None,
                  default_accept: str) -> tuple[bytes, str]:
    """The response body and Content-Type for the request's Accept header (None: none sent). A "triton" request, and
    a V2 JSON one that asks for binary outputs (tritonclient's bodies do by default), are answered as the SageMaker
    Triton container answers, without Accept: binary+json where outputs are binary."""
    if invocation.form == TRITON or (invocation.form == "v2" and asks_binary(invocation.request)):
        return encode_triton(response, invocation.request)
    return encode_invocation(response, invocation, choose_accept(accept, default_accept))


def encode_invocation(response: InferResponse, invocation: Invocation, accept: str) -> tuple[bytes, str]:
    """The response body for `accept` (a choose_accept result) and its Content-Type."""
    kind = media_type(accept)
    fmt = format_of(kind)
    outputs = response.outputs
    if fmt == JSON:
        body = _encode_json(response, invocation)
    elif fmt == JSONLINES:
        body = _encode_json_lines(outputs)
    elif fmt == CSV:
        body = encode_csv(outputs)
    elif fmt == NPY:
        body = encode_npy(outputs)
    elif fmt == PROTOBUF:
        body = encode_predict_response(outputs, response.model_name, response.model_version)
    else:
        raise MediaTypeError(406, f"Accept '{accept}' is not supported; supported: {', '.join(RESPONSE_TYPES)}")
    return body, kind


def _encode_json(response: InferResponse, invocation: Invocation) -> bytes:
    if invocation.form == "v2":
        # A bare request asks for no binary parts, so the header is the whole body.
        parts, _ = encode_infer_response(response, InferRequest("", {}))
        return parts[0]
    return encode_predict(response.outputs, COLUMNAR if invocation.form == COLUMNAR else ROW)


def _encode_json_lines(outputs: dict[str, np.ndarray]) -> bytes:
    rows = row_predictions(outputs)
    return b"".join(orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n" for row in rows)
