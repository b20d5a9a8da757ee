"""`AsyncClient`: `Client`'s calls as coroutines on one event loop (the one it is first used on)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from modelhost.client import split as splitting
from modelhost.client.aio_transports import AioGrpcTransport, AioHttpTransport, AioTransport
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

_UNSET: Any = object()


class AsyncClient:
    """As `Client` (same arguments, same semantics); split parts run as concurrent tasks."""

    def __init__(self, url: str = "127.0.0.1:8000", *, protocol: str | None = None, binary: bool = True,
                 timeout: float | None = None, retry: RetryPolicy = DEFAULT_RETRY,
                 split_rows: int = splitting.DEFAULT_SPLIT_ROWS,
                 expect_continue_bytes: int = EXPECT_CONTINUE_BYTES) -> None:
        self.protocol, host, port = parse_address(url, protocol)
        if self.protocol == "http":
            self._transport: AioTransport = AioHttpTransport(host, port, binary, expect_continue_bytes)
        else:
            self._transport = AioGrpcTransport(f"{host}:{port}")
        self._timeout = timeout
        self._retry = retry
        self._split_rows = split_rows
        self._configs = ConfigCache()

    async def infer(self, model: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None, *,
                    version: str = "", parameters: Mapping[str, Any] | None = None, request_id: str = "",
                    timeout: float | None = _UNSET, idempotent: bool = False, split: int | None = None,
                    ) -> dict[str, np.ndarray]:
        """As `Client.infer`."""
        deadline = deadline_of(self._timeout if timeout is _UNSET else timeout)
        parts = await self._part_count(model, version, inputs, split, deadline)
        if parts == 1:
            return await self._attempts(model, version, inputs, outputs, parameters, request_id, deadline,
                                        idempotent)
        tasks = [
            asyncio.ensure_future(self._attempts(model, version, piece, outputs, parameters,
                                                 f"{request_id}.{index}" if request_id else "", deadline,
                                                 idempotent))
            for index, piece in enumerate(splitting.cut(inputs, parts))
        ]
        try:
            return splitting.merge(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()  # one part failed or the caller left: the others are not wanted

    async def _part_count(self, model: str, version: str, inputs: Mapping[str, np.ndarray], split: int | None,
                         deadline: float | None) -> int:
        rows = rows_to_split(inputs, split)
        if not rows:
            return 1
        shape = self._configs.get(model, version)
        if shape is None:
            try:
                shape = splitting.BatchShape.from_config(await self._transport.model_config(model, version, deadline))
            except ClientError:
                shape = UNSPLITTABLE  # the infer call will say what is wrong
            self._configs.put(model, version, shape)
        return splitting.part_count(rows, shape, split, self._split_rows)

    async def _attempts(self, model: str, version: str, inputs: Mapping[str, np.ndarray],
                        outputs: Sequence[str] | None, parameters: Mapping[str, Any] | None, request_id: str,
                        deadline: float | None, idempotent: bool) -> dict[str, np.ndarray]:
        retry = 0
        while True:
            try:
                return await self._transport.infer(model, version, inputs, outputs,
                                                   attempt_parameters(parameters, deadline), request_id, deadline)
            except ClientError as exc:
                wait = retry_wait(self._retry, exc, retry, deadline, idempotent)
                if wait is None:
                    raise
                await asyncio.sleep(wait)
                retry += 1

    async def model_config(self, model: str, version: str = "") -> dict[str, Any]:
        return await self._transport.model_config(model, version, deadline_of(self._timeout))

    async def model_metadata(self, model: str, version: str = "") -> dict[str, Any]:
        return await self._transport.model_metadata(model, version, deadline_of(self._timeout))

    async def statistics(self, model: str = "", version: str = "") -> dict[str, Any]:
        return await self._transport.statistics(model, version, deadline_of(self._timeout))

    async def load_model(self, model: str, config: Mapping[str, Any] | str | None = None,
                         files: Mapping[str, bytes] | None = None) -> None:
        self._configs.forget(model)
        await self._transport.load(model, config, files, deadline_of(self._timeout))

    async def unload_model(self, model: str) -> None:
        self._configs.forget(model)
        await self._transport.unload(model, deadline_of(self._timeout))

    async def is_ready(self, model: str = "", version: str = "") -> bool:
        return await self._transport.ready(model, version, deadline_of(self._timeout))

    async def wait_ready(self, timeout: float = 60.0, model: str = "") -> None:
        end = time.monotonic() + timeout
        while not await self.is_ready(model):
            if time.monotonic() > end:
                raise ClientError(0, f"not ready after {timeout:g} s")
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        await self._transport.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
