"""Statistics and metrics for the whole server under --workers N: each worker answers for its own on a Unix
socket, and a statistics request or a scrape to any worker sums every worker's. The same sockets carry the
repository changes a worker made for a client to the others (worker_control.py).

Each worker process keeps its own counters (it batches and runs its own requests); a client's statistics
request or Prometheus scrape lands on whichever worker accepted its connection. Summed, the answer is the
same whichever worker gives it, so perf_analyzer's before/after deltas and a scrape's counters only grow.
The sockets live in a directory the parent process made for this server alone (mode 0700), named by
worker index.

The exchange: the asking worker sends one line, `stats\\t<model>\\t<version>\\n` (empty for all) or
`metrics\\n`, and reads until EOF a JSON list of Triton `model_stat` objects or a Prometheus text
exposition; or `control\\t<length>\\n` and that many bytes of a repository change it made
(worker_control.py), and reads what went wrong applying it ("" for nothing). A worker that does not answer
within ANSWER_TIMEOUT_S makes the request fail (UNAVAILABLE) rather than return a sum that would go backwards.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import orjson

from modelhost.errors import ModelhostError, unavailable

ANSWER_TIMEOUT_S = 5.0
CHANGE_TIMEOUT_S = 300.0  # another worker applying a load loads the model: as long as a load may take
MAX_QUERY_BYTES = 1024
Statistics = list[dict[str, Any]]
DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit",
             "cache_miss")


class StatisticsPeers(Protocol):
    """The other processes serving the same models, whose counters a statistics request or a scrape adds to this
    process's: the workers of --workers (WorkerStatistics), or a Ray Serve deployment's other replicas."""

    async def gather(self, name: str, version: str) -> list[Statistics]: ...

    async def gather_metrics(self) -> list[str]: ...


class WorkerStatistics:
    """One worker's side: its socket (serve) and the other workers' (gather)."""

    def __init__(self, directory: Path, index: int, workers: int) -> None:
        self._directory = directory
        self._index = index
        self._others = [i for i in range(workers) if i != index]
        self._server: asyncio.AbstractServer | None = None

    def socket_path(self, index: int) -> Path:
        return self._directory / f"{index}.sock"

    async def serve(self, local: Callable[[str, str], Statistics], metrics: Callable[[], Awaitable[bytes]],
                    adopt: Callable[[bytes], Awaitable[str]] | None = None) -> None:
        """Answer the other workers with this worker's own: `local(model, version)`, and `metrics()`; and apply
        the repository changes they made (`adopt(change)`, worker_control.py: what went wrong, or "")."""

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                line = await asyncio.wait_for(reader.readline(), ANSWER_TIMEOUT_S)
                kind, _, query = line[:MAX_QUERY_BYTES].decode().rstrip("\n").partition("\t")
                name, _, version = query.partition("\t")
                if kind == "metrics":
                    body = await metrics()
                elif kind == "control" and adopt is not None:
                    change = await asyncio.wait_for(reader.readexactly(int(query)), ANSWER_TIMEOUT_S)
                    body = (await adopt(change)).encode()
                else:
                    try:
                        body = orjson.dumps(local(name, version))
                    except ModelhostError:  # a model this worker does not have (yet): nothing to add
                        body = b"[]"
                writer.write(body)
                await writer.drain()
            except (OSError, ValueError, asyncio.TimeoutError, asyncio.IncompleteReadError):
                pass  # ValueError: undecodable or over-long lines
            finally:
                writer.close()

        path = self.socket_path(self._index)
        path.unlink(missing_ok=True)
        self._server = await asyncio.start_unix_server(answer, path)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self.socket_path(self._index).unlink(missing_ok=True)

    async def gather(self, name: str, version: str) -> list[Statistics]:
        """The other workers' statistics for the same query; UNAVAILABLE if one of them does not answer."""
        answers = await asyncio.gather(*(self._ask(i, f"stats\t{name}\t{version}") for i in self._others))
        try:
            return [orjson.loads(answer) for answer in answers]
        except orjson.JSONDecodeError:
            raise unavailable("a worker answered the server's statistics query with a broken document") from None

    async def gather_metrics(self) -> list[str]:
        """The other workers' Prometheus expositions; UNAVAILABLE if one of them does not answer."""
        answers = await asyncio.gather(*(self._ask(i, "metrics") for i in self._others))
        return [answer.decode() for answer in answers]

    async def tell(self, change: bytes) -> list[str]:
        """Have every other worker apply a repository change this one made (worker_control.py), and wait for them
        (a load takes as long as it takes, up to CHANGE_TIMEOUT_S): what went wrong in each, "" where nothing."""
        answers = await asyncio.gather(*(self._ask(i, f"control\t{len(change)}", change, CHANGE_TIMEOUT_S,
                                                   "a load or unload") for i in self._others))
        return [answer.decode() for answer in answers]

    async def _ask(self, index: int, query: str, body: bytes = b"", timeout: float = ANSWER_TIMEOUT_S,
                   purpose: str = "the server's statistics") -> bytes:
        try:
            return await asyncio.wait_for(self._exchange(index, query, body), timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            raise unavailable(f"worker {index} did not answer for {purpose} ({type(exc).__name__}); retry") from None

    async def _exchange(self, index: int, query: str, body: bytes) -> bytes:
        reader, writer = await asyncio.open_unix_connection(self.socket_path(index))
        try:
            writer.write(f"{query}\n".encode() + body)
            await writer.drain()
            return await reader.read()
        finally:
            writer.close()


def merge(parts: Iterable[Statistics]) -> Statistics:
    """Sum Triton `model_stat` lists by (name, version): counts and durations add, last_inference is the latest,
    batch_stats add by batch size. The order is the first list's, then models only later lists have."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for part in parts:
        for stat in part:
            key = (stat["name"], stat["version"])
            if key not in merged:
                merged[key] = orjson.loads(orjson.dumps(stat))  # a copy the sums may change
            else:
                _add(merged[key], stat)
    return list(merged.values())


def _add(into: dict[str, Any], stat: dict[str, Any]) -> None:
    into["last_inference"] = max(into["last_inference"], stat["last_inference"])
    into["inference_count"] += stat["inference_count"]
    into["execution_count"] += stat["execution_count"]
    for name in DURATIONS:
        _add_duration(into["inference_stats"][name], stat["inference_stats"][name])
    batches = {batch["batch_size"]: batch for batch in into["batch_stats"]}
    for batch in stat["batch_stats"]:
        mine = batches.get(batch["batch_size"])
        if mine is None:
            into["batch_stats"].append(orjson.loads(orjson.dumps(batch)))
            continue
        for name in ("compute_input", "compute_infer", "compute_output"):
            _add_duration(mine[name], batch[name])
    into["batch_stats"].sort(key=lambda batch: batch["batch_size"])


def _add_duration(into: dict[str, int], duration: dict[str, int]) -> None:
    into["count"] += duration["count"]
    into["ns"] += duration["ns"]
