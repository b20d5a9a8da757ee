"""The asyncio transports, one per protocol: transports.py's methods as coroutines, for `AsyncClient`.

A transport belongs to the event loop it was first used on (its connections and channel do).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import grpc
import grpc.aio
import numpy as np

from modelhost.client import grpc_calls, http_calls
from modelhost.client.aio_http_connection import AioHttpPool
from modelhost.client.errors import ClientError
from modelhost.protocols.kserve_v2 import grpc_service_pb2 as pb


class AioTransport(Protocol):
    async def infer(self, model: str, version: str, inputs: Mapping[str, np.ndarray],
                    outputs: Sequence[str] | None, parameters: Mapping[str, Any], request_id: str,
                    deadline: float | None) -> dict[str, np.ndarray]: ...
    async def model_config(self, model: str, version: str, deadline: float | None) -> dict[str, Any]: ...
    async def model_metadata(self, model: str, version: str, deadline: float | None) -> dict[str, Any]: ...
    async def statistics(self, model: str, version: str, deadline: float | None) -> dict[str, Any]: ...
    async def load(self, model: str, config: Mapping[str, Any] | str | None, files: Mapping[str, bytes] | None,
                   deadline: float | None) -> None: ...
    async def unload(self, model: str, deadline: float | None) -> None: ...
    async def ready(self, model: str, version: str, deadline: float | None) -> bool: ...
    async def close(self) -> None: ...


class AioHttpTransport:
    def __init__(self, host: str, port: int, binary: bool = True, expect_bytes: int = 0) -> None:
        self._pool = AioHttpPool(host, port)
        self._binary = binary
        self._expect_bytes = expect_bytes

    async def infer(self, model: str, version: str, inputs: Mapping[str, np.ndarray],
                    outputs: Sequence[str] | None, parameters: Mapping[str, Any], request_id: str,
                    deadline: float | None) -> dict[str, np.ndarray]:
        parts, expect = http_calls.infer_parts(self._pool.authority, model, version, inputs, outputs, parameters,
                                               request_id, self._binary, self._expect_bytes)
        return http_calls.infer_answer(await self._pool.exchange(parts, deadline, expect))

    async def _json(self, method: str, path: str, deadline: float | None, document: Any = None) -> Any:
        parts = http_calls.json_parts(self._pool.authority, method, path, document)
        return http_calls.json_answer(await self._pool.exchange(parts, deadline))

    async def model_config(self, model: str, version: str, deadline: float | None) -> dict[str, Any]:
        return dict(await self._json("GET", http_calls.model_path(model, version) + "/config", deadline))

    async def model_metadata(self, model: str, version: str, deadline: float | None) -> dict[str, Any]:
        return dict(await self._json("GET", http_calls.model_path(model, version), deadline))

    async def statistics(self, model: str, version: str, deadline: float | None) -> dict[str, Any]:
        return dict(await self._json("GET", http_calls.model_path(model, version) + "/stats", deadline))

    async def load(self, model: str, config: Mapping[str, Any] | str | None, files: Mapping[str, bytes] | None,
                   deadline: float | None) -> None:
        await self._json("POST", http_calls.repository_path(model, "load"), deadline,
                         http_calls.load_document(config, files))

    async def unload(self, model: str, deadline: float | None) -> None:
        await self._json("POST", http_calls.repository_path(model, "unload"), deadline, {})

    async def ready(self, model: str, version: str, deadline: float | None) -> bool:
        parts = http_calls.json_parts(self._pool.authority, "GET", http_calls.ready_path(model, version))
        try:
            return (await self._pool.exchange(parts, deadline)).status == 200
        except ClientError as exc:
            if exc.sent:
                raise
            return False

    async def close(self) -> None:
        self._pool.close()


class AioGrpcTransport:
    def __init__(self, target: str) -> None:
        self._target = target
        self._channel: grpc.aio.Channel | None = None
        self._methods: dict[str, Any] = {}

    def _method(self, name: str) -> Any:
        if self._channel is None:  # made on first use, inside the loop that will use it
            self._channel = grpc.aio.insecure_channel(self._target, options=grpc_calls.CHANNEL_OPTIONS)
            self._methods = grpc_calls.methods(self._channel)
        return self._methods[name]

    async def _call(self, method: str, message: Any, deadline: float | None) -> Any:
        timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        try:
            return await self._method(method)(message, timeout=timeout)
        except grpc.RpcError as exc:
            raise grpc_calls.error(exc) from None

    async def infer(self, model: str, version: str, inputs: Mapping[str, np.ndarray],
                    outputs: Sequence[str] | None, parameters: Mapping[str, Any], request_id: str,
                    deadline: float | None) -> dict[str, np.ndarray]:
        message = grpc_calls.infer_request(model, version, inputs, outputs, parameters, request_id)
        return grpc_calls.infer_answer(await self._call("ModelInfer", message, deadline))

    async def model_config(self, model: str, version: str, deadline: float | None) -> dict[str, Any]:
        answer = await self._call("ModelConfig", pb.ModelConfigRequest(name=model, version=version), deadline)
        return grpc_calls.as_dict(answer.config)

    async def model_metadata(self, model: str, version: str, deadline: float | None) -> dict[str, Any]:
        return grpc_calls.as_dict(
            await self._call("ModelMetadata", pb.ModelMetadataRequest(name=model, version=version), deadline))

    async def statistics(self, model: str, version: str, deadline: float | None) -> dict[str, Any]:
        return grpc_calls.as_dict(
            await self._call("ModelStatistics", pb.ModelStatisticsRequest(name=model, version=version), deadline))

    async def load(self, model: str, config: Mapping[str, Any] | str | None, files: Mapping[str, bytes] | None,
                   deadline: float | None) -> None:
        await self._call("RepositoryModelLoad", grpc_calls.load_request(model, config, files), deadline)

    async def unload(self, model: str, deadline: float | None) -> None:
        await self._call("RepositoryModelUnload", pb.RepositoryModelUnloadRequest(model_name=model), deadline)

    async def ready(self, model: str, version: str, deadline: float | None) -> bool:
        try:
            if model:
                answer = await self._call("ModelReady", pb.ModelReadyRequest(name=model, version=version), deadline)
            else:
                answer = await self._call("ServerReady", pb.ServerReadyRequest(), deadline)
            return bool(answer.ready)
        except ClientError as exc:
            if exc.status == "UNAVAILABLE":
                return False
            raise

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
