"""The application's ingress: the ASGI app Ray Serve's HTTP proxy hands every request to. It reads the model
the request names from its route (request_model.py) and forwards the request, unparsed, to a replica holding
that model through Ray Serve's model multiplexing; the replica's modelhost answers it. Failures of Ray itself
(a replica that died or is gone, a full queue) are 503 with Retry-After, which retrying clients retry. The
ingress's own answers are `{"error": ...}` as modelhost's, in the Runtime API's shape on its routes."""

from __future__ import annotations

import logging
from typing import Any

import orjson

from modelhost.protocols.sagemaker.runtime_errors import RUNTIME_PREFIX, runtime_error_for
from modelhost.ray_serve.forwarded import ForwardedRequest, ForwardedResponse
from modelhost.ray_serve.request_model import named_model
from modelhost.ray_serve.request_sequence import SEQUENCE_KWARG, http_sequence

log = logging.getLogger("modelhost.ray")

STREAMED_SUFFIX = "/generate_stream"  # Triton's generate extension: server-sent events, as they come
RETRY_AFTER_S = b"1"


class Ingress:
    """An ASGI app over the replicas' DeploymentHandle. `max_body_bytes`: the largest body it forwards.
    `affinity`: route by the model a request names (else every request to any replica)."""

    def __init__(self, replicas: Any, max_body_bytes: int, affinity: bool = True) -> None:
        self._replicas = replicas
        self._streaming = replicas.options(stream=True)
        self._max_body_bytes = max_body_bytes
        self._affinity = affinity

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        headers = dict(scope["headers"])
        try:
            body = await self._body(receive)
        except _Gone:
            return  # the client left before sending its whole body: nothing to forward, no one to answer
        path = scope["path"]
        if body is None:
            await _send(send, _error(413, f"request body exceeds the {self._max_body_bytes}-byte limit "
                                          "(--http-max-body-bytes)", path))
            return
        request = ForwardedRequest(scope["method"], scope["path"], scope.get("query_string", b""),
                                   list(scope["headers"]), body)
        named = named_model(request.method, request.path, headers)
        load = None if named is None else named.load
        try:
            if request.path.endswith(STREAMED_SUFFIX):
                await _send_stream(send, self._handle(self._streaming, named).stream.remote(request, load))
            else:
                sequence = http_sequence(path, headers, body) if named is not None and self._affinity else ""
                routing = {SEQUENCE_KWARG: sequence} if sequence else {}
                await _send(send, await self._handle(self._replicas, named).remote(request, load, **routing))
        except _Cut:
            return
        except Exception as exc:
            await _send(send, _failure(exc, path))

    def _handle(self, handle: Any, named: Any) -> Any:
        return handle if named is None or not self._affinity else handle.options(multiplexed_model_id=named.key)

    async def _body(self, receive: Any) -> bytes | None:
        """The whole body; None past the limit (read no further)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Gone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _failure(exc: Exception, path: str) -> ForwardedResponse:
    """Ray's failures to reach a replica: 503 + Retry-After; anything else is a fault of ours (500, logged)."""
    message = ray_failure(exc)
    if message is None:
        log.error("a forwarded request failed", exc_info=exc)
        return _error(500, f"internal error ({type(exc).__name__}); the server log has the details", path)
    response = _error(503, message, path)
    response.headers.append((b"retry-after", RETRY_AFTER_S))
    return response


def ray_failure(exc: Exception) -> str | None:
    """What the client is told when Ray could not get a request answered by a replica (to retry: the replica
    died or is gone, or every queue is full); None for any other exception."""
    from ray.exceptions import NodeDiedError, RayActorError, WorkerCrashedError
    from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError

    if isinstance(exc, (RayActorError, WorkerCrashedError, NodeDiedError, ReplicaUnavailableError,
                        DeploymentUnavailableError)):
        return "the replica serving this request stopped before answering; retry"
    if isinstance(exc, BackPressureError):
        return "every replica's queue is full; retry"
    return None


def _error(status: int, message: str, path: str) -> ForwardedResponse:
    if path.startswith(RUNTIME_PREFIX):
        answer = runtime_error_for(status, message)
        return ForwardedResponse(status, answer.headers, b"".join(answer.body))
    return ForwardedResponse(status, [(b"content-type", b"application/json")], orjson.dumps({"error": message}))


async def _send(send: Any, response: ForwardedResponse) -> None:
    """The replica's app set Content-Length (from the body it sent, which is this one); the ingress's own
    answers do not."""
    headers = response.headers
    if not any(name.lower() == b"content-length" for name, _ in headers):
        headers = [*headers, (b"content-length", str(len(response.body)).encode())]
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})


class _Gone(Exception):
    """The client disconnected before its request was whole."""


class _Cut(Exception):
    """A streamed response failed after its head was sent: the only way left to tell the client is to end it
    without its last chunk."""


async def _send_stream(send: Any, parts: Any) -> None:
    started = False
    try:
        async for part in parts:
            if isinstance(part, ForwardedResponse):
                await send({"type": "http.response.start", "status": part.status, "headers": part.headers})
                started = True
                part = part.body
            await send({"type": "http.response.body", "body": part, "more_body": True})
    except Exception as exc:
        if not started:
            raise
        log.warning("a streamed response was cut short: %s", type(exc).__name__)
        raise _Cut from exc
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
