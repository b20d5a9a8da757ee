"""An HTTP request's body as TorchServe hands it to a handler (tsfs §A1.3): its parameters, each with the content
type it came with. A raw body is one parameter `body`; `multipart/form-data` one per form field (a later field of
the same name replaces an earlier one); `application/x-www-form-urlencoded` one per field, with no content type.
Multipart bodies are parsed by python-multipart."""

from __future__ import annotations

from urllib.parse import parse_qsl

from modelhost.errors import invalid

BODY = "body"
MULTIPART = "multipart/form-data"
FORM = "application/x-www-form-urlencoded"
MAX_PARTS = 1000  # form fields in one request


def media_type(content_type: str) -> str:
    """The MIME type without its parameters, as TorchServe keys decoding on it ("application/json")."""
    return content_type.split(";", 1)[0].strip().lower()


def request_parameters(content_type: str, body: bytes) -> dict[str, tuple[str, bytes]]:
    """Parameter name -> (content type, value) for a request with this Content-Type header ("" when none);
    INVALID_INPUT for a form body that does not parse."""
    media = media_type(content_type)
    if media == MULTIPART:
        return _multipart(content_type, body)
    if media == FORM:
        try:
            # Percent-escapes decoded as latin-1: one character per byte, so the value's bytes come back exactly.
            fields = parse_qsl(body.decode("ascii"), keep_blank_values=True, max_num_fields=MAX_PARTS,
                               encoding="latin-1")
        except ValueError as exc:  # UnicodeDecodeError included: a form body is ASCII
            raise invalid(f"the {FORM} body does not parse: {exc}") from None
        return {name.encode("latin-1").decode("utf-8", "replace"): ("", value.encode("latin-1"))
                for name, value in fields}
    return {BODY: (media, body)}


def _multipart(content_type: str, body: bytes) -> dict[str, tuple[str, bytes]]:
    from python_multipart.exceptions import MultipartParseError
    from python_multipart.multipart import MultipartParser, MultipartState, parse_options_header

    _, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    if not boundary:
        raise invalid(f"the {MULTIPART} body has no boundary in its Content-Type")
    parts: dict[str, tuple[str, bytes]] = {}
    headers: dict[bytes, bytes] = {}
    field: list[bytes] = []
    value: list[bytes] = []
    data: list[bytes] = []
    count = 0

    def on_part_begin() -> None:
        nonlocal count
        count += 1
        if count > MAX_PARTS:
            raise invalid(f"the {MULTIPART} body has more than {MAX_PARTS} parts")
        headers.clear()
        data.clear()

    def on_header_field(chunk: bytes, start: int, end: int) -> None:
        field.append(chunk[start:end])

    def on_header_value(chunk: bytes, start: int, end: int) -> None:
        value.append(chunk[start:end])

    def on_header_end() -> None:
        headers[b"".join(field).lower()] = b"".join(value)
        field.clear()
        value.clear()

    def on_part_data(chunk: bytes, start: int, end: int) -> None:
        data.append(chunk[start:end])

    def on_part_end() -> None:
        _, disposition = parse_options_header(headers.get(b"content-disposition", b""))
        name = disposition.get(b"name")
        if name is None:
            raise invalid(f"a part of the {MULTIPART} body has no name in its Content-Disposition")
        part_type = headers.get(b"content-type", b"").decode("latin-1")
        parts[name.decode("utf-8", "replace")] = (media_type(part_type), b"".join(data))

    parser = MultipartParser(boundary, {
        "on_part_begin": on_part_begin, "on_header_field": on_header_field, "on_header_value": on_header_value,
        "on_header_end": on_header_end, "on_part_data": on_part_data, "on_part_end": on_part_end,
    }, max_header_count=32)
    try:
        written = parser.write(body)
        parser.finalize()
    except MultipartParseError as exc:
        raise invalid(f"the {MULTIPART} body does not parse: {exc}") from None
    if written != len(body) or parser.state != MultipartState.END:
        raise invalid(f"the {MULTIPART} body ends before its closing boundary")
    return parts
