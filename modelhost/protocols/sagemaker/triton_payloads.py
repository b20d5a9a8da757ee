"""The SageMaker Triton container's `/invocations` bodies <-> modelhost's KServe V2 codec (which validates them).

What the container (Triton's `sagemaker_server.cc`) reads and answers:
- application/octet-stream: the whole body is a V2 JSON inference request (AWS's examples send json.dumps of one).
- application/vnd.sagemaker-triton.binary+json;json-header-size=N: the first N bytes are the V2 JSON header and
  the rest the binary tensors its inputs' `binary_data_size` parameters claim: Triton's binary tensor extension,
  with the header's length in the Content-Type where the V2 HTTP API has Inference-Header-Content-Length.
  N must be a whole number from 1 to the body's length (the JSON cannot be empty).
The answer is the V2 response: application/json when every output is JSON, else the binary type with the JSON
header's length as json-header-size; outputs are binary where the request asks (`binary_data_output`, or an
output's `binary_data`). Accept is not consulted, as the container does not consult it. The container answers an
application/json V2 request so too, and so does modelhost when such a request asks for binary outputs.
"""

from __future__ import annotations

from modelhost.digits import is_digits
from modelhost.errors import client_value, invalid
from modelhost.protocols.kserve_v2.codec import decode_infer_request, encode_infer_response
from modelhost.protocols.sagemaker.media_types import JSON, TRITON_BINARY, media_type
from modelhost.types import InferRequest, InferResponse, RequestLimits

HEADER_SIZE = "json-header-size"


def header_size(content_type: str, body_length: int) -> int:
    """The json-header-size of a binary+json Content-Type; INVALID_INPUT naming it when missing or out of range."""
    value = None
    for parameter in content_type.split(";")[1:]:
        key, _, text = parameter.partition("=")
        if key.strip().lower() == HEADER_SIZE:
            value = text.strip().strip('"')
    if value is None:
        raise invalid(f"Content-Type {TRITON_BINARY} needs the parameter {HEADER_SIZE}=<bytes of the JSON header "
                      f"that starts the body>, e.g. '{TRITON_BINARY};{HEADER_SIZE}=120'")
    if not is_digits(value):
        raise invalid(f"Content-Type parameter {HEADER_SIZE} must be a non-negative whole number of bytes, "
                      f"got {client_value(value)}")
    size = int(value)
    if not 0 < size <= body_length:
        raise invalid(f"Content-Type parameter {HEADER_SIZE} {size} is outside the request body of {body_length} "
                      "bytes: it counts the bytes of the JSON header that starts the body (at least 1)")
    return size


def decode_triton(body: bytes, content_type: str, limits: RequestLimits) -> InferRequest:
    """The V2 request in an octet-stream or binary+json body; it names no model (the endpoint does)."""
    length = header_size(content_type, len(body)) if media_type(content_type) == TRITON_BINARY else None
    return decode_infer_request(body, length, "", limits=limits)


def asks_binary(request: InferRequest) -> bool:
    """Whether a V2 request wants any output as binary data (the request's default, or one output's)."""
    default = request.parameters.get("binary_data_output") is True
    return default or any(o.parameters.get("binary_data", default) is True for o in request.outputs or ())


def encode_triton(response: InferResponse, request: InferRequest) -> tuple[bytes, str]:
    """The V2 response body and its Content-Type, as the container answers."""
    parts, length = encode_infer_response(response, request)
    if length is None:
        return parts[0], JSON
    return b"".join(parts), f"{TRITON_BINARY};{HEADER_SIZE}={length}"
