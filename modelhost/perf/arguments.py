"""What `modelhost perf` and `modelhost tune` read alike: the server's address, --processes, --shape, and the
requests a model's metadata and config (read from the server) call for."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from modelhost.client import Client
from modelhost.digits import is_digits
from modelhost.perf import inputs as request_inputs


def server_address(url: str | None, protocol: str) -> str:
    """"http://host:port" or "grpc://host:port"; the protocol's usual local port when no URL is given."""
    url = url or f"127.0.0.1:{8001 if protocol == 'grpc' else 8000}"
    return url if "://" in url else f"{protocol}://{url}"


def parse_processes(text: str) -> int | str:
    """--processes: a whole number of at least 1, or "auto"; ValueError naming the flag otherwise."""
    if text == "auto":
        return text
    if not is_digits(text) or int(text) < 1:
        raise ValueError(f"--processes takes a whole number of at least 1 or 'auto', got {text!r}")
    return int(text)


def model_requests(address: str, model: str, version: str, batch_size: int, shapes: Mapping[str, Sequence[int]],
                   input_data: str) -> tuple[dict[str, Any], list[request_inputs.Request]]:
    """The model's configuration as the server reports it, and the requests to send it. Raises ClientError
    (the server) or InputError (the inputs)."""
    with Client(address) as client:
        metadata = client.model_metadata(model, version)
        config = client.model_config(model, version)
    return config, request_inputs.model_requests(metadata, config, batch_size, shapes, input_data)


def parse_shape(text: str) -> tuple[str, list[int]]:
    """--shape NAME:D1,D2 as (name, dims); ValueError naming the flag otherwise."""
    name, _, dims = text.rpartition(":")
    try:
        values = [int(d) for d in dims.split(",")]
    except ValueError:
        values = []
    if not name or not values or any(v < 0 for v in values):
        raise ValueError(f"--shape takes NAME:D1,D2,... with non-negative dims, got {text!r}")
    return name, values
