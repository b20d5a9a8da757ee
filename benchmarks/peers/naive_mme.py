"""A naive SageMaker multi-model peer: aiohttp + onnxruntime, an LRU of sessions by count.

What a team writes in an afternoon for the multi-model benchmark (benchmarks/multi_model.py):
`POST /invocations` with `X-Amzn-SageMaker-Target-Model: <archive>.tar.gz` and a `text/csv` body of
float rows, answered `{"predictions": [[...]]}` like modelhost. On a miss it untars the archive into a
temp directory and creates the session in the default thread pool, with no de-duplication of
concurrent loads of the same model; it keeps the CAPACITY most recently used sessions
(collections.OrderedDict) and drops the oldest. No validation, no memory accounting. `GET /loaded`
counts sessions, hits, misses and evictions for the benchmark.
Sessions get modelhost's options (intra-op threads = cores, no spinning) so that the comparison is
of the servers, not of onnxruntime settings.

    python naive_mme.py ARCHIVE_DIR PORT [CAPACITY]
"""

import asyncio
import io
import os
import shutil
import sys
import tarfile
import tempfile
from collections import OrderedDict
from pathlib import Path

import numpy as np
import onnxruntime as ort
import orjson
from aiohttp import web


def options() -> ort.SessionOptions:
    result = ort.SessionOptions()
    result.intra_op_num_threads = os.cpu_count() or 1
    result.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return result


def load(archive: Path) -> ort.InferenceSession:
    directory = tempfile.mkdtemp(prefix="naive-mme-")
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(directory, filter="data")
        return ort.InferenceSession(os.path.join(directory, "model.onnx"), options(),
                                    providers=["CPUExecutionProvider"])
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    root, port = Path(sys.argv[1]), int(sys.argv[2])
    capacity = int(sys.argv[3]) if len(sys.argv) > 3 else 50
    sessions: OrderedDict[str, ort.InferenceSession] = OrderedDict()
    counts = {"hits": 0, "misses": 0, "evictions": 0}  # for the benchmark only (GET /loaded)

    async def invocations(request: web.Request) -> web.Response:
        target = request.headers.get("X-Amzn-SageMaker-Target-Model", "")
        loop = asyncio.get_running_loop()
        if target not in sessions:
            archive = root / target
            if ".." in target or not archive.is_file():
                return web.json_response({"error": f"no model {target}"}, status=404)
            counts["misses"] += 1
            sessions[target] = await loop.run_in_executor(None, load, archive)
            while len(sessions) > capacity:
                sessions.popitem(last=False)
                counts["evictions"] += 1
        else:
            counts["hits"] += 1
        sessions.move_to_end(target)
        session = sessions[target]
        rows = np.loadtxt(io.BytesIO(await request.read()), delimiter=",", dtype=np.float32, ndmin=2)
        feeds = {session.get_inputs()[0].name: rows}
        outputs = await loop.run_in_executor(None, session.run, None, feeds)
        body = orjson.dumps({"predictions": outputs[0]}, option=orjson.OPT_SERIALIZE_NUMPY)
        return web.Response(body=body, content_type="application/json")

    async def ping(request: web.Request) -> web.Response:
        return web.Response()

    async def loaded(request: web.Request) -> web.Response:
        return web.json_response({"loaded": len(sessions), **counts})

    app = web.Application()
    app.router.add_post("/invocations", invocations)
    app.router.add_get("/ping", ping)
    app.router.add_get("/loaded", loaded)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


if __name__ == "__main__":
    main()
