"""The modelhost client: KServe V2 inference over HTTP (binary tensors) and gRPC, sync and asyncio, for any V2
server (modelhost, Triton, KServe).

    from modelhost.client import Client
    with Client("127.0.0.1:8000") as client:            # "grpc://127.0.0.1:8001" for gRPC
        scores = client.infer("rank", {"features": x})["scores"]

Numpy in and out; pooled connections; retries with backoff on 503 / UNAVAILABLE / refused connections (a
request the server may have run is retried only when the call says it is idempotent); a per-call deadline the
server is told of; requests of many rows cut into parts sent concurrently (`split`).
"""

from modelhost.client.aio_client import AsyncClient
from modelhost.client.errors import ClientError, DeadlineExceeded
from modelhost.client.retry import RetryPolicy
from modelhost.client.sync_client import Client

__all__ = ["AsyncClient", "Client", "ClientError", "DeadlineExceeded", "RetryPolicy"]
