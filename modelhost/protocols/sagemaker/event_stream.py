"""The AWS event-stream binary framing that InvokeEndpointWithResponseStream answers in (content type
application/vnd.amazon.eventstream), as botocore's EventStreamBuffer decodes it.

One message: a 12-byte prelude (total length, headers length, both big-endian uint32, then the CRC32 of those
8 bytes), the headers (each: name length uint8, name, type 7 = string, value length uint16, value), the payload,
and the CRC32 of everything before it. The Runtime API's ResponseStream events: `PayloadPart` (the payload is
the part's bytes: its `Bytes` member is the event payload), and the modeled exceptions `ModelStreamError`
({"Message", "ErrorCode"}) and `InternalStreamFailure` ({"Message"}) that end a stream.
"""

from __future__ import annotations

import struct
from binascii import crc32

import orjson

CONTENT_TYPE = b"application/vnd.amazon.eventstream"
_STRING = 7
# botocore refuses larger messages: a part over this is split (a blob's parts concatenate to the whole).
MAX_PAYLOAD = 24 * 1024 * 1024
MODEL_STREAM_ERROR = "ModelStreamError"
INTERNAL_STREAM_FAILURE = "InternalStreamFailure"


def message(headers: dict[str, str], payload: bytes) -> bytes:
    """One event-stream message with string-valued headers."""
    encoded = b"".join(_header(name, value) for name, value in headers.items())
    total = 12 + len(encoded) + len(payload) + 4
    prelude = struct.pack("!II", total, len(encoded))
    head = prelude + struct.pack("!I", crc32(prelude))
    body = head + encoded + payload
    return body + struct.pack("!I", crc32(body))


def _header(name: str, value: str) -> bytes:
    key, text = name.encode(), value.encode()
    return struct.pack("!B", len(key)) + key + struct.pack("!BH", _STRING, len(text)) + text


def payload_parts(data: bytes) -> list[bytes]:
    """`data` as PayloadPart events (one, or several where it exceeds what a client decodes in one)."""
    pieces = [data[i:i + MAX_PAYLOAD] for i in range(0, len(data), MAX_PAYLOAD)] or [b""]
    headers = {":event-type": "PayloadPart", ":message-type": "event", ":content-type": "application/octet-stream"}
    return [message(headers, piece) for piece in pieces]


def stream_error(exception: str, text: str, error_code: str = "") -> bytes:
    """A modeled exception event (ModelStreamError with its ErrorCode, or InternalStreamFailure) ending a stream."""
    document: dict[str, str] = {"Message": text}
    if error_code:
        document["ErrorCode"] = error_code
    headers = {":exception-type": exception, ":message-type": "exception", ":content-type": "application/json"}
    return message(headers, orjson.dumps(document))
