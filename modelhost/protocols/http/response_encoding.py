"""Compressed response bodies, the coding chosen from the request's Accept-Encoding as Triton chooses it.

Triton compresses inference responses only: of `identity`, `deflate` (a zlib stream) and `gzip` named in
Accept-Encoding, the one of highest weight (`;q=`), the first named on a tie; codings it does not know, and
weights it cannot read, are passed over. Inference-Header-Content-Length stays the uncompressed JSON's length:
the client inflates, then splits. The level is zlib's fastest: tensors' bytes barely compress at any level
(500 FP32 scores to 0.95 of their size at 1 and at 6), JSON text to half at both, and level 1 costs 0.6-0.8x
of the default's time.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Sequence

from modelhost.protocols.http.app import CODING_WBITS, HttpResponse

ACCEPT_ENCODING = b"accept-encoding"
_CODINGS = (b"identity", b"deflate", b"gzip")
_INLINE_BYTES = 32 * 1024  # larger bodies are compressed in a worker thread (zlib lets go of the GIL), off the loop


def chosen_coding(accept_encoding: bytes | None) -> str | None:
    """'gzip' or 'deflate' where the header prefers one, None where the body goes as it is."""
    if not accept_encoding:
        return None
    chosen, weight = b"identity", 0.0
    for item in accept_encoding.split(b","):
        name, _, parameters = item.partition(b";")
        name = name.strip().lower()
        if name not in _CODINGS:
            continue
        item_weight = _weight(parameters)
        if item_weight is not None and item_weight > weight:
            chosen, weight = name, item_weight
    return None if chosen == b"identity" else chosen.decode()


def _weight(parameters: bytes) -> float | None:
    for parameter in parameters.split(b";"):
        key, _, value = parameter.partition(b"=")
        if key.strip().lower() == b"q":
            try:
                weight = float(value.strip())
            except ValueError:
                return None
            return weight if 0.0 <= weight <= 1.0 else None
    return 1.0


def compressed(parts: Sequence[bytes], coding: str) -> bytes:
    size = sum(memoryview(part).nbytes for part in parts)
    # zlib's state is sized by the window and the hash table: 256 KB at its defaults, which the allocator maps and
    # unmaps on every answer. A window no larger than the body, and a table to match, compress it the same.
    window = min(zlib.MAX_WBITS, max(9, size.bit_length()))
    wbits = CODING_WBITS[coding.encode()] - zlib.MAX_WBITS + window
    compressor = zlib.compressobj(zlib.Z_BEST_SPEED, zlib.DEFLATED, wbits, max(1, min(zlib.DEF_MEM_LEVEL, window - 6)))
    pieces = [compressor.compress(part) for part in parts]
    pieces.append(compressor.flush())
    return b"".join(pieces)


async def encode_response(response: HttpResponse, accept_encoding: bytes | None) -> HttpResponse:
    """The response with its body compressed in the coding Accept-Encoding prefers, and Content-Encoding set."""
    coding = chosen_coding(accept_encoding)
    if coding is None:
        return response
    size = sum(memoryview(part).nbytes for part in response.body)
    if size > _INLINE_BYTES:
        body = await asyncio.to_thread(compressed, response.body, coding)
    else:
        body = compressed(response.body, coding)
    response.body = (body,)
    response.headers.append((b"content-encoding", coding.encode()))
    return response
