"""`Client`: blocking KServe V2 calls over HTTP or gRPC, with retries, deadlines and splitting.

Thread-safe: threads share its pooled connections (each call takes its own) and its gRPC channel.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from modelhost.client import split as splitting
from modelhost.client.calls import (
    EXPECT_CONTINUE_BYTES,
    UNSPLITTABLE,
    ConfigCache,
    attempt_parameters,
    deadline_of,
    parse_address,
    retry_wait,
    rows_to_split,
)
from modelhost.client.errors import ClientError
from modelhost.client.retry import DEFAULT_RETRY, RetryPolicy
from modelhost.client.transports import GrpcTransport, HttpTransport, Transport

_UNSET: Any = object()


class Client:
    """A V2 server at `url` ("host:port" and `protocol`, or "http://host:port" / "grpc://host:port").

    `binary`: HTTP tensors as binary data (default) or JSON; `expect_continue_bytes`: HTTP bodies of this size or
    more ask `Expect: 100-continue` first (0: never). `timeout`: the default per-call deadline in seconds
    (None: none). `retry`: how transient failures are retried. `split_rows`: requests of more rows are
    split across the model's instances; `max_parallel`: parts in flight at once for one call.
    """

    def __init__(self, url: str = "127.0.0.1:8000", *, protocol: str | None = None, binary: bool = True,
                 timeout: float | None = None, retry: RetryPolicy = DEFAULT_RETRY,
                 split_rows: int = splitting.DEFAULT_SPLIT_ROWS, max_parallel: int = 16,
                 expect_continue_bytes: int = EXPECT_CONTINUE_BYTES) -> None:
        self.protocol, host, port = parse_address(url, protocol)
        if self.protocol == "http":
            self._transport: Transport = HttpTransport(host, port, binary, expect_continue_bytes)
        else:
            self._transport = GrpcTransport(f"{host}:{port}")
        self._timeout = timeout
        self._retry = retry
        self._split_rows = split_rows
        self._max_parallel = max_parallel
        self._configs = ConfigCache()
        self._parts_pool: ThreadPoolExecutor | None = None

    def infer(self, model: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None, *,
              version: str = "", parameters: Mapping[str, Any] | None = None, request_id: str = "",
              timeout: float | None = _UNSET, idempotent: bool = False, split: int | None = None,
              ) -> dict[str, np.ndarray]:
        """Run `model` on `inputs`; its outputs by name (all of them unless `outputs` names some).

        `timeout` (seconds) overrides the client's deadline for this call. `idempotent`: the request may run
        twice, so it is retried even after failures that leave its fate unknown. `split`: the number of
        parts (1: sent whole, the config unread); None lets the model's config decide.
        """
        deadline = deadline_of(self._timeout if timeout is _UNSET else timeout)
        parts = self._part_count(model, version, inputs, split, deadline)
        if parts == 1:
            return self._attempts(model, version, inputs, outputs, parameters, request_id, deadline, idempotent)
        if self._parts_pool is None:
            self._parts_pool = ThreadPoolExecutor(self._max_parallel, thread_name_prefix="modelhost-client")
        futures = [
            self._parts_pool.submit(self._attempts, model, version, piece, outputs, parameters,
                                    f"{request_id}.{index}" if request_id else "", deadline, idempotent)
            for index, piece in enumerate(splitting.cut(inputs, parts))
        ]
        try:
            return splitting.merge([future.result() for future in futures])
        finally:
            for future in futures:
                future.cancel()

    def _part_count(self, model: str, version: str, inputs: Mapping[str, np.ndarray], split: int | None,
                   deadline: float | None) -> int:
        rows = rows_to_split(inputs, split)
        if not rows:
            return 1
        shape = self._configs.get(model, version)
        if shape is None:
            try:
                shape = splitting.BatchShape.from_config(self._transport.model_config(model, version, deadline))
            except ClientError:
                shape = UNSPLITTABLE  # the infer call will say what is wrong
            self._configs.put(model, version, shape)
        return splitting.part_count(rows, shape, split, self._split_rows)

    def _attempts(self, model: str, version: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None,
                  parameters: Mapping[str, Any] | None, request_id: str, deadline: float | None,
                  idempotent: bool) -> dict[str, np.ndarray]:
        retry = 0
        while True:
            try:
                return self._transport.infer(model, version, inputs, outputs,
                                             attempt_parameters(parameters, deadline), request_id, deadline)
            except ClientError as exc:
                wait = retry_wait(self._retry, exc, retry, deadline, idempotent)
                if wait is None:
                    raise
                time.sleep(wait)
                retry += 1

    def model_config(self, model: str, version: str = "") -> dict[str, Any]:
        """The model's configuration as the server reports it (Triton's JSON)."""
        return self._transport.model_config(model, version, deadline_of(self._timeout))

    def model_metadata(self, model: str, version: str = "") -> dict[str, Any]:
        return self._transport.model_metadata(model, version, deadline_of(self._timeout))

    def statistics(self, model: str = "", version: str = "") -> dict[str, Any]:
        """The statistics extension's answer: {"model_stats": [...]}."""
        return self._transport.statistics(model, version, deadline_of(self._timeout))

    def load_model(self, model: str, config: Mapping[str, Any] | str | None = None,
                   files: Mapping[str, bytes] | None = None) -> None:
        """Load (or reload) `model` through the repository extension, optionally with a config override; the
        client forgets what it knew of the model's config."""
        self._configs.forget(model)
        self._transport.load(model, config, files, deadline_of(self._timeout))

    def unload_model(self, model: str) -> None:
        self._configs.forget(model)
        self._transport.unload(model, deadline_of(self._timeout))

    def is_ready(self, model: str = "", version: str = "") -> bool:
        """The server's readiness, or a model's; False while nothing listens."""
        return self._transport.ready(model, version, deadline_of(self._timeout))

    def wait_ready(self, timeout: float = 60.0, model: str = "") -> None:
        """Block until the server (or `model`) is ready; ClientError after `timeout` seconds."""
        end = time.monotonic() + timeout
        while not self.is_ready(model):
            if time.monotonic() > end:
                raise ClientError(0, f"not ready after {timeout:g} s")
            time.sleep(0.05)

    def close(self) -> None:
        if self._parts_pool is not None:
            self._parts_pool.shutdown(wait=False, cancel_futures=True)
        self._transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
