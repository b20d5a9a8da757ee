"""Accept-Encoding -> the response's coding, as Triton's HTTP server chooses it, and the compressed body."""

from __future__ import annotations

import asyncio
import gzip
import zlib

import numpy as np
import pytest

from modelhost.protocols.http.app import HttpResponse
from modelhost.protocols.http.response_encoding import chosen_coding, encode_response


@pytest.mark.parametrize(("accept", "coding"), [
    (None, None),
    (b"", None),
    (b"gzip", "gzip"),
    (b"deflate", "deflate"),
    (b"identity", None),
    (b"gzip, deflate", "gzip"),  # a tie goes to the first named
    (b"deflate, gzip", "deflate"),
    (b"gzip;q=0.5, deflate", "deflate"),
    (b"gzip;q=0.5, deflate;q=0.4", "gzip"),
    (b"identity;q=0.9, gzip;q=0.8", None),
    (b"gzip;q=0", None),
    (b" GZip ; Q=0.7 ", "gzip"),
    (b"br", None),
    (b"br, gzip;q=0.1", "gzip"),
    (b"*", None),
    (b"gzip;q=abc", None),  # a weight that cannot be read passes the coding over
    (b"gzip;q=2, deflate;q=0.1", "deflate"),
    (b"gzip;q=nan", None),
    (b"gzip;level=1", "gzip"),
    (b",,;,", None),
])
def test_chosen_coding(accept: bytes | None, coding: str | None) -> None:
    assert chosen_coding(accept) == coding


@pytest.mark.parametrize("size", [100, 1 << 20], ids=["inline", "worker-thread"])
@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_encode_response(size: int, coding: str) -> None:
    rng = np.random.default_rng(0)
    parts = [b'{"outputs": []}', rng.integers(0, 4, size, dtype=np.uint8).tobytes()]
    response = asyncio.run(encode_response(HttpResponse(200, parts, [(b"content-type", b"x")]), coding.encode()))
    assert response.headers == [(b"content-type", b"x"), (b"content-encoding", coding.encode())]
    (body,) = response.body
    inflate = gzip.decompress if coding == "gzip" else zlib.decompress
    assert inflate(body) == b"".join(parts)
    assert len(body) < size  # two bits of entropy a byte: compressed to about a quarter


def test_encode_response_leaves_a_response_not_asked_for_as_it_is() -> None:
    response = HttpResponse(200, [b"a", b"b"], [])
    assert asyncio.run(encode_response(response, b"identity")) is response
    assert response.body == [b"a", b"b"] and response.headers == []


def test_parts_that_are_views_of_arrays_compress_whole() -> None:
    scores = np.arange(1000, dtype=np.float32).reshape(500, 2)
    (body,) = asyncio.run(encode_response(HttpResponse(200, [b"{}", memoryview(scores)], []), b"gzip")).body
    assert gzip.decompress(body) == b"{}" + scores.tobytes()
