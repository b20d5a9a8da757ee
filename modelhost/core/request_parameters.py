"""A request's parameters as Triton reads them: those the server consumes, those it keeps to itself, and the rest,
which the model sees (a Triton Python model's `request.parameters()`)."""

from __future__ import annotations

from typing import Any

from modelhost.errors import invalid

# Read by the server (sequence batching, scheduling, the HTTP answer's form), not handed to the model.
CONSUMED = frozenset({"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers",
                      "binary_data_output"})
RESERVED_PREFIX = "triton_"  # the gRPC stream takes its triton_enable_empty_final_response before the core sees it


def check_reserved(parameters: dict[str, Any]) -> None:
    """INVALID_INPUT for a parameter of Triton's reserved prefix that clients may not send, in Triton's words."""
    for key in parameters:
        if key.startswith(RESERVED_PREFIX):
            raise invalid(f"request parameter '{key}': parameter keys starting with '{RESERVED_PREFIX}' are reserved "
                          "for Triton usage and should not be specified")


def model_parameters(parameters: dict[str, Any]) -> dict[str, Any]:
    """The parameters a model sees: the request's, less those the server consumes or keeps."""
    if not parameters:
        return parameters
    return {key: value for key, value in parameters.items()
            if key not in CONSUMED and not key.startswith(RESERVED_PREFIX)}
