"""The client's own cost per call: modelhost.client against tritonclient on the same server, same inputs.

    python benchmarks/client.py [--rounds 5] [--json results.json]

One `modelhost serve` on the example repository. Each client makes sequential calls (concurrency 1) to
`tiny` (1 x 4 FP32) and `rank` (500 x 1000 FP32, 2 MB a request); rounds interleave the clients so that the
shared machine's noise falls on all of them. Per call: the wall time (median of the rounds' means), and the
client process's CPU time (process_time: every thread of the client, nothing of the server's) — the
client's overhead proper. Beside them, requests built once and only sent: the standard library's http.client
with a pre-built body (HTTP; its own request and response handling is slow, so not a floor), and a gRPC
channel sent one pre-built message (what a client that encoded nothing would cost).
Every client's answer is checked against the others' before timing.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import numpy as np
import orjson
import tritonclient.grpc as triton_grpc
import tritonclient.grpc.aio as triton_grpc_aio
import tritonclient.http as triton_http
import tritonclient.http.aio as triton_http_aio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from modelhost.client import AsyncClient, Client  # noqa: E402
from modelhost.protocols.kserve_v2 import grpc_service_pb2 as pb  # noqa: E402
from tests.server import ServerProcess  # noqa: E402

MODELS = {"tiny": ("x", "y", (1, 4), 2000), "rank": ("features", "score", (500, 1000), 200)}
Call = Callable[[], np.ndarray]
AsyncCall = Callable[[], Awaitable[np.ndarray]]


def sync_calls(server: ServerProcess, model: str, x: np.ndarray) -> dict[str, Call]:
    name, output, _, _ = MODELS[model]
    ours_http, ours_grpc = Client(server.url), Client(f"grpc://{server.grpc_url}")
    th, tg = triton_http.InferenceServerClient(server.url), triton_grpc.InferenceServerClient(server.grpc_url)

    def triton_http_call() -> np.ndarray:
        tensor = triton_http.InferInput(name, list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        return th.infer(model, [tensor], outputs=[triton_http.InferRequestedOutput(output)]).as_numpy(output)

    def triton_grpc_call() -> np.ndarray:
        tensor = triton_grpc.InferInput(name, list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        return tg.infer(model, [tensor], outputs=[triton_grpc.InferRequestedOutput(output)]).as_numpy(output)

    return {
        "HTTP http.client, pre-built bytes": floor_http(server, model, x),
        "HTTP modelhost.client": lambda: ours_http.infer(model, {name: x}, [output], split=1)[output],
        "HTTP tritonclient": triton_http_call,
        "gRPC stub, pre-built message": floor_grpc(server, model, x),
        "gRPC modelhost.client": lambda: ours_grpc.infer(model, {name: x}, [output], split=1)[output],
        "gRPC tritonclient": triton_grpc_call,
    }


def floor_http(server: ServerProcess, model: str, x: np.ndarray) -> Call:
    name, output, _, _ = MODELS[model]
    header = orjson.dumps({"inputs": [{"name": name, "datatype": "FP32", "shape": list(x.shape),
                                       "parameters": {"binary_data_size": x.nbytes}}],
                           "outputs": [{"name": output, "parameters": {"binary_data": True}}]})
    body = header + x.tobytes()
    headers = {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"}
    connection = http.client.HTTPConnection(server.url.split(":")[0], int(server.url.split(":")[1]))

    def call() -> np.ndarray:
        connection.request("POST", f"/v2/models/{model}/infer", body, headers)
        answer = connection.getresponse()
        data = answer.read()
        length = int(answer.headers["Inference-Header-Content-Length"])
        return np.frombuffer(data[length:], np.float32)
    return call


def floor_grpc(server: ServerProcess, model: str, x: np.ndarray) -> Call:
    name, _, _, _ = MODELS[model]
    channel = grpc.insecure_channel(server.grpc_url, options=[("grpc.max_send_message_length", -1),
                                                              ("grpc.max_receive_message_length", -1)])
    method = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                 request_serializer=pb.ModelInferRequest.SerializeToString,
                                 response_deserializer=pb.ModelInferResponse.FromString)
    message = pb.ModelInferRequest(model_name=model)
    message.inputs.add(name=name, datatype="FP32", shape=x.shape)
    message.raw_input_contents.append(x.tobytes())
    return lambda: np.frombuffer(method(message).raw_output_contents[0], np.float32)


def async_calls(server: ServerProcess, model: str, x: np.ndarray) -> tuple[dict[str, AsyncCall], list]:
    """The calls, and the clients to close on the same loop."""
    name, output, _, _ = MODELS[model]
    ours_http, ours_grpc = AsyncClient(server.url), AsyncClient(f"grpc://{server.grpc_url}")
    th = triton_http_aio.InferenceServerClient(server.url)
    tg = triton_grpc_aio.InferenceServerClient(server.grpc_url)

    async def ours(client: AsyncClient) -> np.ndarray:
        return (await client.infer(model, {name: x}, [output], split=1))[output]

    async def triton_http_call() -> np.ndarray:
        tensor = triton_http_aio.InferInput(name, list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        answer = await th.infer(model, [tensor], outputs=[triton_http_aio.InferRequestedOutput(output)])
        return answer.as_numpy(output)

    async def triton_grpc_call() -> np.ndarray:
        tensor = triton_grpc_aio.InferInput(name, list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        answer = await tg.infer(model, [tensor], outputs=[triton_grpc_aio.InferRequestedOutput(output)])
        return answer.as_numpy(output)

    return {
        "HTTP asyncio modelhost.client": lambda: ours(ours_http),
        "HTTP asyncio tritonclient": triton_http_call,
        "gRPC asyncio modelhost.client": lambda: ours(ours_grpc),
        "gRPC asyncio tritonclient": triton_grpc_call,
    }, [ours_http, ours_grpc, th, tg]


def timed(call: Call, count: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(count):
        call()
    return (time.perf_counter() - wall) / count, (time.process_time() - cpu) / count


async def timed_async(call: AsyncCall, count: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(count):
        await call()
    return (time.perf_counter() - wall) / count, (time.process_time() - cpu) / count


def check_same(answers: dict[str, np.ndarray]) -> None:
    first = next(iter(answers.values())).reshape(-1)
    for label, answer in answers.items():
        np.testing.assert_allclose(answer.reshape(-1), first, rtol=1e-6, err_msg=label)


def measure(server: ServerProcess, rounds: int) -> dict[str, dict[str, dict[str, float]]]:
    results: dict[str, dict[str, dict[str, float]]] = {}
    for model, (_, _, shape, count) in MODELS.items():
        x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
        calls = sync_calls(server, model, x)
        check_same({label: call() for label, call in calls.items()})
        samples: dict[str, list[tuple[float, float]]] = {label: [] for label in calls}
        for _ in range(rounds):
            for label, call in calls.items():
                timed(call, count // 10)  # warm
                samples[label].append(timed(call, count))

        asyncio.run(measure_async(server, model, x, rounds, count, samples))
        results[model] = {label: {"wall_us": statistics.median(s[0] for s in runs) * 1e6,
                                  "cpu_us": statistics.median(s[1] for s in runs) * 1e6}
                          for label, runs in samples.items()}
    return results


async def measure_async(server: ServerProcess, model: str, x: np.ndarray, rounds: int, count: int,
                        samples: dict[str, list[tuple[float, float]]]) -> None:
    calls, clients = async_calls(server, model, x)
    check_same({label: await call() for label, call in calls.items()})
    samples.update({label: [] for label in calls})
    for _ in range(rounds):
        for label, call in calls.items():
            await timed_async(call, count // 10)
            samples[label].append(await timed_async(call, count))
    for client in clients:
        await client.close()


def print_table(results: dict[str, dict[str, dict[str, float]]]) -> None:
    print("| model | client | µs per call (wall) | client CPU µs per call | wall vs tritonclient "
          "| CPU vs tritonclient |")
    print("|---|---|---|---|---|---|")
    for model, rows in results.items():
        for label, row in rows.items():
            peer = label.replace("modelhost.client", "tritonclient")
            ratio = ("", "")
            if peer != label and peer in rows:
                ratio = (f"{row['wall_us'] / rows[peer]['wall_us']:.2f}x",
                         f"{row['cpu_us'] / rows[peer]['cpu_us']:.2f}x")
            print(f"| {model} | {label} | {row['wall_us']:.0f} | {row['cpu_us']:.0f} | {ratio[0]} | {ratio[1]} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    server = ServerProcess(None, cache_dir=Path(tempfile.mkdtemp())).wait_ready()
    try:
        results = measure(server, args.rounds)
    finally:
        server.stop()
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
