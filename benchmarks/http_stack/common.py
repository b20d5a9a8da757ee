"""Shared pieces of the trivial benchmark app (identical work for every stack)."""
import orjson

HEALTH = "/v2/health/live"
INFER = "/v2/models/tiny/infer"
CHUNKS = "/debug/chunks"  # probe only: reports how the request body arrived; not load-tested


def infer(body: bytes) -> bytes:
    """Parse the body if it is JSON (else just take len) and build the V2 response with orjson."""
    if body[:1] == b"{":
        orjson.loads(body)
    else:
        len(body)
    return orjson.dumps(
        {"model_name": "tiny", "outputs": [{"name": "y", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}
    )


def chunk_report(sizes, body_types) -> bytes:
    report = {"chunks": len(sizes), "sizes": sizes[:8], "total": sum(sizes), "types": sorted(set(body_types))}
    return orjson.dumps(report)
