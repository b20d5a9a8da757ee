"""The server's own per-request cost, without sockets or a load generator: the ASGI app called in-process.

    python benchmarks/inprocess.py [--tasks 32] [--requests 200]

Sends a 1-row JSON request for `tiny` through the whole request path (routing, decode, checks,
scheduler, statistics, encode) from N concurrent asyncio tasks and reports requests/s (best of 3),
plus the sequential cost per request. No HTTP server counts requests in progress here, so tiny runs
on the event loop; with `--threads-only` (inline_max_microseconds 0) every request takes the
instance thread and back instead, the path a busy server's batching models take. Far less noisy than wrk on this
shared 2-core machine, so it is the tool for bisecting a regression in the server's own code.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from modelhost.app import Server  # noqa: E402
from modelhost.example_repository import ensure_example_repository  # noqa: E402
from modelhost.settings import ServerSettings  # noqa: E402

BODY = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}'
SCOPE = {"type": "http", "method": "POST", "path": "/v2/models/tiny/infer",
         "headers": [(b"content-length", str(len(BODY)).encode())]}


async def measure(server: Server, tasks: int, requests: int) -> tuple[float, float]:
    app = server.build_asgi()
    await server.manager.load_all()
    server.dataplane.mark_started()
    statuses: list[int] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async def worker(count: int) -> None:
        for _ in range(count):
            await app(SCOPE, receive, send)

    await worker(500)
    start = time.perf_counter()
    await worker(requests * 10)
    sequential_us = (time.perf_counter() - start) / (requests * 10) * 1e6
    best = 0.0
    for _ in range(3):
        start = time.perf_counter()
        await asyncio.gather(*(worker(requests) for _ in range(tasks)))
        best = max(best, tasks * requests / (time.perf_counter() - start))
    assert set(statuses) == {200}, set(statuses)
    await server.manager.stop()
    return sequential_us, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--requests", type=int, default=200, help="requests per task")
    parser.add_argument("--threads-only", action="store_true", help="tiny with inline_max_microseconds 0")
    args = parser.parse_args()
    repository = ensure_example_repository(Path(tempfile.gettempdir()) / "modelhost-bench-cache")
    if args.threads_only:
        copy = Path(tempfile.mkdtemp(prefix="modelhost-inprocess-")) / "repository"
        shutil.copytree(repository, copy)
        with (copy / "tiny" / "config.pbtxt").open("a") as config:
            config.write('\nparameters { key: "inline_max_microseconds" value: { string_value: "0" } }\n')
        repository = copy
    server = Server(ServerSettings(model_repository=str(repository)))
    sequential_us, rate = uvloop.run(measure(server, args.tasks, args.requests))
    print(f"sequential: {sequential_us:.1f} us per request")
    print(f"{args.tasks} concurrent tasks: {rate:.0f} requests/s (best of 3)")


if __name__ == "__main__":
    main()
