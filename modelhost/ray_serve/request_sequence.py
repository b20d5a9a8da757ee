"""The sequence (Triton's sequence batching: a correlation id) a V2 inference continues, read by the ingress so
that every request of a sequence goes to the replica that holds its state.

Only V2 inference carries one: over HTTP in the request's `parameters` (the JSON body, or a binary request's
JSON header), over gRPC in ModelInferRequest's. An HTTP body is parsed only when it holds the parameter's name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from modelhost.protocols.kserve_v2 import grpc_service_pb2 as pb

SEQUENCE_ID = "sequence_id"
SEQUENCE_KWARG = "sequence"  # how the ingress hands the key to the router (PendingRequest.kwargs)
_NAME = b'"sequence_id"'
_V2_INFER = re.compile(r"/v2/models/[^/]+(/versions/[^/]+)?/infer")
_HEADER_LENGTH = b"inference-header-content-length"


def http_sequence(path: str, headers: Mapping[bytes, bytes], body: bytes) -> str:
    """The key of the sequence a V2 HTTP inference continues; "" for none, and for a request that does not parse
    (the replica answers it)."""
    if not _V2_INFER.fullmatch(path):
        return ""
    length = headers.get(_HEADER_LENGTH)
    if length is None:
        head = body
    else:
        try:
            head = body[:int(length)]
        except ValueError:
            return ""
    if _NAME not in head:
        return ""
    try:
        parameters = orjson.loads(head).get("parameters")
    except (orjson.JSONDecodeError, AttributeError):
        return ""
    return _key(parameters.get(SEQUENCE_ID)) if isinstance(parameters, dict) else ""


def grpc_sequence(request: pb.ModelInferRequest) -> str:
    if SEQUENCE_ID not in request.parameters:
        return ""
    parameter = request.parameters[SEQUENCE_ID]
    which = parameter.WhichOneof("parameter_choice")
    return _key(getattr(parameter, which)) if which in ("int64_param", "uint64_param", "string_param") else ""


def _key(value: Any) -> str:
    """0 and "" mean no sequence; a string id is kept apart from the number it may spell."""
    if isinstance(value, bool) or not value:
        return ""
    if isinstance(value, int):
        return str(value)
    return f"'{value}" if isinstance(value, str) else ""
