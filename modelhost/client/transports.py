"""The blocking transports, one per protocol, with one set of methods: what `Client` calls once per attempt.

Every method raises ClientError; `deadline` is a time.monotonic() instant or None.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import grpc
import numpy as np

from modelhost.client import grpc_calls, http_calls
from modelhost.client.errors import ClientError
from modelhost.client.http_connection import HttpPool
from modelhost.protocols.kserve_v2 import grpc_service_pb2 as pb


class Transport(Protocol):
    def infer(self, model: str, version: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None,
              parameters: Mapping[str, Any], request_id: str, deadline: float | None) -> dict[str, np.ndarray]: ...
    def model_config(self, model: str, version: str, deadline: float | None) -> dict[str, Any]: ...
    def model_metadata(self, model: str, version: str, deadline: float | None) -> dict[str, Any]: ...
    def statistics(self, model: str, version: str, deadline: float | None) -> dict[str, Any]: ...
    def load(self, model: str, config: Mapping[str, Any] | str | None, files: Mapping[str, bytes] | None,
             deadline: float | None) -> None: ...
    def unload(self, model: str, deadline: float | None) -> None: ...
    def ready(self, model: str, version: str, deadline: float | None) -> bool: ...
    def close(self) -> None: ...


class HttpTransport:
    def __init__(self, host: str, port: int, binary: bool = True, expect_bytes: int = 0) -> None:
        self._pool = HttpPool(host, port)
        self._binary = binary
        self._expect_bytes = expect_bytes

    def infer(self, model: str, version: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None,
              parameters: Mapping[str, Any], request_id: str, deadline: float | None) -> dict[str, np.ndarray]:
        parts, expect = http_calls.infer_parts(self._pool.authority, model, version, inputs, outputs, parameters,
                                               request_id, self._binary, self._expect_bytes)
        return http_calls.infer_answer(self._pool.exchange(parts, deadline, expect))

    def _json(self, method: str, path: str, deadline: float | None, document: Any = None) -> Any:
        parts = http_calls.json_parts(self._pool.authority, method, path, document)
        return http_calls.json_answer(self._pool.exchange(parts, deadline))

    def model_config(self, model: str, version: str, deadline: float | None) -> dict[str, Any]:
        return dict(self._json("GET", http_calls.model_path(model, version) + "/config", deadline))

    def model_metadata(self, model: str, version: str, deadline: float | None) -> dict[str, Any]:
        return dict(self._json("GET", http_calls.model_path(model, version), deadline))

    def statistics(self, model: str, version: str, deadline: float | None) -> dict[str, Any]:
        return dict(self._json("GET", http_calls.model_path(model, version) + "/stats", deadline))

    def load(self, model: str, config: Mapping[str, Any] | str | None, files: Mapping[str, bytes] | None,
             deadline: float | None) -> None:
        self._json("POST", http_calls.repository_path(model, "load"), deadline, http_calls.load_document(config, files))

    def unload(self, model: str, deadline: float | None) -> None:
        self._json("POST", http_calls.repository_path(model, "unload"), deadline, {})

    def ready(self, model: str, version: str, deadline: float | None) -> bool:
        parts = http_calls.json_parts(self._pool.authority, "GET", http_calls.ready_path(model, version))
        try:
            return self._pool.exchange(parts, deadline).status == 200
        except ClientError as exc:
            if exc.sent:
                raise
            return False  # nothing listening (yet)

    def close(self) -> None:
        self._pool.close()


class GrpcTransport:
    def __init__(self, target: str) -> None:
        self._channel = grpc.insecure_channel(target, options=grpc_calls.CHANNEL_OPTIONS)
        self._methods = grpc_calls.methods(self._channel)

    def _call(self, method: str, message: Any, deadline: float | None) -> Any:
        timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        try:
            return self._methods[method](message, timeout=timeout)
        except grpc.RpcError as exc:
            raise grpc_calls.error(exc) from None

    def infer(self, model: str, version: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None,
              parameters: Mapping[str, Any], request_id: str, deadline: float | None) -> dict[str, np.ndarray]:
        message = grpc_calls.infer_request(model, version, inputs, outputs, parameters, request_id)
        return grpc_calls.infer_answer(self._call("ModelInfer", message, deadline))

    def model_config(self, model: str, version: str, deadline: float | None) -> dict[str, Any]:
        answer = self._call("ModelConfig", pb.ModelConfigRequest(name=model, version=version), deadline)
        return grpc_calls.as_dict(answer.config)

    def model_metadata(self, model: str, version: str, deadline: float | None) -> dict[str, Any]:
        return grpc_calls.as_dict(
            self._call("ModelMetadata", pb.ModelMetadataRequest(name=model, version=version), deadline))

    def statistics(self, model: str, version: str, deadline: float | None) -> dict[str, Any]:
        return grpc_calls.as_dict(
            self._call("ModelStatistics", pb.ModelStatisticsRequest(name=model, version=version), deadline))

    def load(self, model: str, config: Mapping[str, Any] | str | None, files: Mapping[str, bytes] | None,
             deadline: float | None) -> None:
        self._call("RepositoryModelLoad", grpc_calls.load_request(model, config, files), deadline)

    def unload(self, model: str, deadline: float | None) -> None:
        self._call("RepositoryModelUnload", pb.RepositoryModelUnloadRequest(model_name=model), deadline)

    def ready(self, model: str, version: str, deadline: float | None) -> bool:
        try:
            if model:
                return bool(self._call("ModelReady", pb.ModelReadyRequest(name=model, version=version),
                                       deadline).ready)
            return bool(self._call("ServerReady", pb.ServerReadyRequest(), deadline).ready)
        except ClientError as exc:
            if exc.status == "UNAVAILABLE":
                return False
            raise

    def close(self) -> None:
        self._channel.close()
