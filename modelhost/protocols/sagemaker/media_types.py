"""The media types `/invocations` reads and writes, and Accept negotiation (protocols §6.5, §7).

Names are compared lower-cased without parameters (SageMaker's toolkit compares exact strings, so
"application/json; charset=utf-8" would fail there; here it is JSON). Aliases name the same format,
and a response carries the name the client asked for.
"""

from __future__ import annotations

JSON = "application/json"
CSV = "text/csv"
JSONLINES = "application/jsonlines"
NPY = "application/x-npy"
PROTOBUF = "application/x-protobuf"
# Request-only types: the SageMaker Triton container's two (whose answer type follows the body, not Accept),
# and the sparse rows the SDK's SparseMatrixSerializer and libsvm tools send.
OCTET_STREAM = "application/octet-stream"
TRITON_BINARY = "application/vnd.sagemaker-triton.binary+json"
NPZ = "application/x-npz"
LIBSVM = "text/libsvm"

# Other names each format answers to; "application/jsons" is what SageMaker's TF Serving container also accepts.
ALIASES = {
    "application/jsonl": JSONLINES,
    "application/x-jsonlines": JSONLINES,
    "application/jsons": JSONLINES,
    "application/protobuf": PROTOBUF,
    "application/vnd.google.protobuf": PROTOBUF,
}
RESPONSE_TYPES: tuple[str, ...] = (JSON, CSV, JSONLINES, NPY, PROTOBUF, *ALIASES)
REQUEST_TYPES: tuple[str, ...] = (*RESPONSE_TYPES, OCTET_STREAM, TRITON_BINARY, NPZ, LIBSVM)


class MediaTypeError(Exception):
    """A Content-Type the server cannot read (status 415) or an Accept it cannot satisfy (406)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def media_type(header: str | None) -> str:
    """The lower-cased type of a Content-Type or Accept entry, parameters dropped; "" for None or blank."""
    if not header:
        return ""
    return header.split(";", 1)[0].strip().lower()


def format_of(name: str) -> str:
    """The canonical name of the format a supported media type names (an alias's target, else itself)."""
    return ALIASES.get(name, name)


def choose_accept(accept: str | None, default: str) -> str:
    """The response media type for an Accept header, as the client spelled it (lower-cased, no parameters).

    A comma list is tried by q-value (q=0 excluded), then in order; `*/*` and a missing or blank header
    mean `default`; `type/*` means `default` when it matches, else the first supported type of that kind.
    Raises MediaTypeError(406) listing RESPONSE_TYPES when nothing in the header is supported.
    """
    default_type = media_type(default)
    if default_type not in RESPONSE_TYPES:
        raise MediaTypeError(
            406, f"the default Accept type '{default}' is not supported; supported: {', '.join(RESPONSE_TYPES)}"
        )
    if accept is None or not accept.strip():
        return default_type
    for candidate in _ranked(accept):
        if candidate == "*/*":
            return default_type
        if candidate.endswith("/*"):
            kind = candidate[:-1]  # "text/"
            matches = [t for t in (default_type, *RESPONSE_TYPES) if t.startswith(kind)]
            if matches:
                return matches[0]
        elif candidate in RESPONSE_TYPES:
            return candidate
    raise MediaTypeError(406, f"Accept '{accept}' names no supported type; supported: {', '.join(RESPONSE_TYPES)}")


def _ranked(accept: str) -> list[str]:
    """The media ranges of an Accept header, highest q first (stable), without those of q=0."""
    ranges: list[tuple[float, str]] = []
    for entry in accept.split(","):
        name, _, parameters = entry.partition(";")
        quality = 1.0
        for parameter in parameters.split(";"):
            key, _, value = parameter.partition("=")
            if key.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 1.0  # a malformed q-value does not hide the type
        if name.strip() and quality > 0:
            ranges.append((quality, name.strip().lower()))
    ranges.sort(key=lambda ranked: -ranked[0])
    return [name for _, name in ranges]
