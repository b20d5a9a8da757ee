"""A minimal KServe V2 peer: aiohttp + onnxruntime, single-input models, no validation.

The "80-line aiohttp server" the foundation issue compares against: what a team writes
by hand. Usage: python aiohttp_v2.py REPOSITORY PORT [inline]
With `inline`, onnxruntime runs on the event loop itself (the scheduler issue's naive baseline);
otherwise in aiohttp's default thread pool.
"""

import asyncio
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import orjson
from aiohttp import web

DTYPES = {"FP32": np.float32, "INT64": np.int64}


def load(repository: Path) -> dict[str, ort.InferenceSession]:
    sessions = {}
    for model in repository.iterdir():
        path = model / "1" / "model.onnx"
        if path.is_file():
            sessions[model.name] = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sessions


def decode(body: bytes, header_length: str | None) -> tuple[dict, dict]:
    n = int(header_length) if header_length else len(body)
    request = orjson.loads(body[:n])
    feeds, offset = {}, n
    for tensor in request["inputs"]:
        dtype = DTYPES[tensor["datatype"]]
        size = (tensor.get("parameters") or {}).get("binary_data_size")
        if size is None:
            feeds[tensor["name"]] = np.asarray(tensor["data"], dtype=dtype).reshape(tensor["shape"])
        else:
            count = size // np.dtype(dtype).itemsize
            feeds[tensor["name"]] = np.frombuffer(body, dtype, count, offset).reshape(tensor["shape"])
            offset += size
    return request, feeds


def main() -> None:
    sessions = load(Path(sys.argv[1]))
    inline = sys.argv[3:] == ["inline"]

    async def infer(request: web.Request) -> web.Response:
        session = sessions[request.match_info["model"]]
        body = await request.read()
        parsed, feeds = decode(body, request.headers.get("Inference-Header-Content-Length"))
        names = [o.name for o in session.get_outputs()]
        if inline:
            results = session.run(names, feeds)
        else:
            results = await asyncio.get_running_loop().run_in_executor(None, session.run, names, feeds)
        binary = bool(parsed.get("outputs")) and all(
            (o.get("parameters") or {}).get("binary_data") for o in parsed["outputs"])
        outputs, chunks = [], []
        for name, array in zip(names, results):
            entry = {"name": name, "datatype": "FP32", "shape": list(array.shape)}
            if binary:
                chunks.append(array.tobytes())
                entry["parameters"] = {"binary_data_size": len(chunks[-1])}
            else:
                entry["data"] = array.reshape(-1)
            outputs.append(entry)
        header = orjson.dumps({"model_name": request.match_info["model"], "outputs": outputs},
                              option=orjson.OPT_SERIALIZE_NUMPY)
        if not binary:
            return web.Response(body=header, content_type="application/json")
        return web.Response(body=header + b"".join(chunks), content_type="application/octet-stream",
                            headers={"Inference-Header-Content-Length": str(len(header))})

    async def ready(request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v2/models/{model}/infer", infer)
    app.router.add_get("/v2/health/ready", ready)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[2]), access_log=None, print=None)


if __name__ == "__main__":
    main()
