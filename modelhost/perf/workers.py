"""Where a step's load comes from: this process (one background thread with its own event loop) or several
worker processes, each sent the requests once and then one StepPlan per step.

Worker processes are spawned (not forked: the parent holds gRPC and event-loop state) and live for the whole
sweep, so connections stay warm between steps.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from modelhost.client import AsyncClient
from modelhost.perf.load import Samples, StepPlan, run_step


def _event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency; other loops work too
        return asyncio.new_event_loop()


class LocalLoad:
    """The load from this process: a thread running an event loop with one AsyncClient."""

    def __init__(self, url: str, requests: Sequence[dict[str, np.ndarray]], client_options: dict[str, Any]) -> None:
        self._loop = _event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="modelhost-perf-load", daemon=True)
        self._thread.start()
        self._requests = requests
        self._client = AsyncClient(url, **client_options)

    def start(self, plan: StepPlan) -> Future[list[Samples]]:
        result: Future[list[Samples]] = Future()
        inner = asyncio.run_coroutine_threadsafe(run_step(self._client, plan, self._requests), self._loop)
        inner.add_done_callback(lambda done: _settle(result, done, lambda samples: [samples]))
        return result

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._client.close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


def _settle(result: Future[list[Samples]], done: Any, convert: Any) -> None:
    exc = done.exception()
    if exc is not None:
        result.set_exception(exc)
    else:
        result.set_result(convert(done.result()))


class ProcessLoad:
    """The load from `processes` worker processes; a step's load is shared out among them."""

    def __init__(self, processes: int, url: str, requests: Sequence[dict[str, np.ndarray]],
                 client_options: dict[str, Any]) -> None:
        context = multiprocessing.get_context("spawn")
        self._pipes: list[Connection] = []
        self._processes = []
        for _ in range(processes):
            parent, child = context.Pipe()
            process = context.Process(target=_worker, args=(child, url, list(requests), client_options),
                                      daemon=True)
            process.start()
            child.close()
            self._pipes.append(parent)
            self._processes.append(process)
        for pipe in self._pipes:
            if pipe.recv() != "ready":
                raise RuntimeError("a load worker process failed to start")

    def start(self, plan: StepPlan) -> Future[list[Samples]]:
        shares = share(plan.load, len(self._pipes), whole=plan.mode == "concurrency")
        used = [(pipe, load) for pipe, load in zip(self._pipes, shares) if load > 0]
        for index, (pipe, load) in enumerate(used):
            pipe.send(replace(plan, load=load, seed=plan.seed * 1000 + index))
        result: Future[list[Samples]] = Future()

        def collect() -> None:
            try:
                answers = [pipe.recv() for pipe, _ in used]
            except (EOFError, OSError) as exc:
                result.set_exception(RuntimeError(f"a load worker process died: {exc}"))
                return
            failures = [answer for answer in answers if isinstance(answer, str)]
            if failures:
                result.set_exception(RuntimeError(f"a load worker failed: {failures[0]}"))
            else:
                result.set_result(answers)

        threading.Thread(target=collect, daemon=True).start()
        return result

    def close(self) -> None:
        for pipe in self._pipes:
            try:
                pipe.send(None)
            except OSError:
                pass
        for process in self._processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()


def share(load: float, parts: int, whole: bool) -> list[float]:
    """`load` shared among `parts` (concurrency in whole requests, spread as evenly as it goes)."""
    if not whole:
        return [load / parts] * parts
    base, extra = divmod(int(load), parts)
    return [float(base + (index < extra)) for index in range(parts)]


def _worker(pipe: Connection, url: str, requests: list[dict[str, np.ndarray]], client_options: dict[str, Any]) -> None:
    loop = _event_loop()
    client = AsyncClient(url, **client_options)
    pipe.send("ready")
    try:
        while True:
            plan = pipe.recv()
            if plan is None:
                break
            try:
                pipe.send(loop.run_until_complete(run_step(client, plan, requests)))
            except Exception as exc:  # the parent reports it; the worker stays for the next step
                pipe.send(f"{type(exc).__name__}: {exc}")
    except (EOFError, KeyboardInterrupt):
        pass
    finally:
        loop.run_until_complete(client.close())
        loop.close()
