"""The same TorchServe archives served by `modelhost torchserve` and by TorchServe 0.12 itself, in the same run.

    python benchmarks/torchserve.py [--duration 5] [--rounds 2] [--concurrency 1,8,32] [--json results.json]

Two archives, made here by torch-model-archiver, their handlers unchanged between the servers:
- `tiny`: a module-level `handle` answering each request's few bytes with a small JSON object;
- `rank`: a BaseHandler subclass over a TorchScript DeepFM-style ranker (a 200,000 x 16 embedding table, 12.8 MB,
  plus a 429-256-128-1 MLP) scoring 500 candidates per request: a raw body of 500 x 26 int64 ids and 500 x 13
  float32 features (130 kB), answered with 500 float32 scores.
Both servers read one config.properties (free ports on 127.0.0.1, token authorization off, TorchServe's default
workers: one per core, batch size 1 as the archives leave it); TorchServe logs at WARN to a file (as shipped it
logs about ten lines per request), modelhost as it ships. The client is wrk (C) with keep-alive connections,
1 s of warm-up, then --duration seconds; each answer format is checked before timing. Every round runs both
servers one after the other, the order alternating; the table shows medians over rounds and the ratios of
those medians. The machine's 2 cores are shared by client and server: read the ratios.

Needs: wrk, Java 17 (openjdk-17-jre-headless) and `pip install torchserve==0.12.0` (modelhost's torchserve extra).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import requests
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.peers.logged_process import LoggedProcess  # noqa: E402
from benchmarks.peers.torchserve import log_config  # noqa: E402
from benchmarks.side_by_side import HttpRequest, wrk  # noqa: E402
from tests.server import free_port  # noqa: E402

BIN = Path(sys.executable).parent
CANDIDATES, FIELDS, DENSE, EMBEDDING, VOCABULARY = 500, 26, 13, 16, 200_000
TINY_HANDLER = '''
def handle(data, context):
    if data is None:
        return None
    return [{"ok": True, "length": len(row.get("body") or row.get("data") or b"")} for row in data]
'''
RANK_HANDLER = f'''
import numpy as np
import torch
from ts.torch_handler.base_handler import BaseHandler


class Ranker(BaseHandler):
    def preprocess(self, data):
        requests = []
        for row in data:
            body = bytes(row.get("body") or row.get("data"))
            ids = np.frombuffer(body, dtype="<i8", count={CANDIDATES * FIELDS}).reshape({CANDIDATES}, {FIELDS})
            dense = np.frombuffer(body, dtype="<f4", offset={CANDIDATES * FIELDS * 8}).reshape({CANDIDATES}, {DENSE})
            requests.append((torch.from_numpy(ids.copy()), torch.from_numpy(dense.copy())))
        return requests

    def inference(self, requests):
        with torch.inference_mode():
            return [self.model(ids, dense) for ids, dense in requests]

    def postprocess(self, scores):
        return [s.numpy().astype("<f4").tobytes() for s in scores]
'''


class DeepFM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.embedding = torch.nn.Parameter(torch.randn(VOCABULARY, EMBEDDING, generator=generator) * 0.05)
        self.linear = torch.nn.Parameter(torch.randn(VOCABULARY, 1, generator=generator) * 0.05)
        self.dense = torch.nn.Linear(DENSE, 1)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(FIELDS * EMBEDDING + DENSE, 256), torch.nn.ReLU(),
                                       torch.nn.Linear(256, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))

    def forward(self, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        vectors = self.embedding[ids]
        linear = self.linear[ids].sum(dim=(1, 2)) + self.dense(dense).squeeze(1)
        summed = vectors.sum(dim=1)
        fm = 0.5 * (summed * summed - (vectors * vectors).sum(dim=1)).sum(dim=1)
        hidden = torch.cat([vectors.flatten(1), dense], dim=1)
        return torch.sigmoid(linear + fm + self.mlp(hidden).squeeze(1))


def make_archives(work: Path) -> tuple[Path, dict[str, tuple[bytes, Any]]]:
    """The model store, and each model's request body and expected answer."""
    store = work / "store"
    store.mkdir()
    model = DeepFM().eval()
    torch.jit.script(model).save(str(work / "ranker.pt"))
    for name, handler, extra in (("tiny", TINY_HANDLER, []), ("rank", RANK_HANDLER,
                                                             ["--serialized-file", str(work / "ranker.pt")])):
        (work / f"{name}_handler.py").write_text(textwrap.dedent(handler))
        subprocess.run([str(BIN / "torch-model-archiver"), "--model-name", name, "--version", "1.0", "--handler",
                        str(work / f"{name}_handler.py"), "--export-path", str(store), *extra], check=True)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, VOCABULARY, (CANDIDATES, FIELDS), dtype=np.int64)
    dense = rng.random((CANDIDATES, DENSE), dtype=np.float32)
    with torch.inference_mode():
        scores = model(torch.from_numpy(ids), torch.from_numpy(dense)).numpy()
    return store, {"tiny": (b"hello", {"ok": True, "length": 5}),
                   "rank": (ids.astype("<i8").tobytes() + dense.astype("<f4").tobytes(), scores)}


def config_properties(ports: dict[str, int], store: Path) -> str:
    settings = {
        "inference_address": f"http://127.0.0.1:{ports['http']}",
        "management_address": f"http://127.0.0.1:{ports['management']}",
        "metrics_address": f"http://127.0.0.1:{ports['metrics']}",
        "grpc_inference_port": ports["grpc"], "grpc_management_port": ports["grpc_management"],
        "initial_worker_port": ports["worker"], "model_store": store, "load_models": "tiny.mar,rank.mar",
        "disable_token_authorization": "true", "disable_system_metrics": "true", "job_queue_size": 1024,
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


class Server:
    """`modelhost torchserve` or `torchserve` with one config.properties, in a work directory of its own."""

    def __init__(self, kind: str, store: Path, work: Path) -> None:
        self.kind = kind
        work.mkdir(parents=True)
        ports = {name: free_port() for name in ("http", "management", "metrics", "grpc", "grpc_management", "worker")}
        self.base = f"http://127.0.0.1:{ports['http']}"
        self.management = f"http://127.0.0.1:{ports['management']}"
        (work / "config.properties").write_text(config_properties(ports, store))
        env = {**os.environ, "TMPDIR": str(work), "TEMP": str(work), "LOG_LOCATION": str(work / "logs"),
               "METRICS_LOCATION": str(work / "logs")}
        if kind == "modelhost":
            command = [sys.executable, "-m", "modelhost", "torchserve", "--start", "--ts-config",
                       str(work / "config.properties")]
        else:
            (work / "log4j2.xml").write_text(log_config(work / "logs"))
            command = [str(BIN / "torchserve"), "--start", "--foreground", "--ncs", "--ts-config",
                       str(work / "config.properties"), "--log-config", str(work / "log4j2.xml")]
        self.process = LoggedProcess(kind, command, work / "server.log", work, env, own_group=True)

    def __enter__(self) -> Server:
        self.process.start(self._ready, 300.0, 0.5)
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.stop()

    def _ready(self) -> bool:
        try:
            return all(_workers_ready(requests.get(f"{self.management}/models/{model}", timeout=2))
                       for model in ("tiny", "rank"))
        except (requests.ConnectionError, requests.Timeout):
            return False


def _workers_ready(response: requests.Response) -> bool:
    if response.status_code != 200:
        return False
    workers = response.json()[0].get("workers", [])
    return bool(workers) and all(worker.get("status") == "READY" for worker in workers)


def check(server: Server, model: str, body: bytes, expected: Any) -> None:
    response = requests.post(f"{server.base}/predictions/{model}", data=body,
                             headers={"Content-Type": "application/octet-stream"}, timeout=60)
    response.raise_for_status()
    if model == "tiny":
        assert response.json() == expected, response.text
    else:
        np.testing.assert_allclose(np.frombuffer(response.content, "<f4"), expected, rtol=1e-4, atol=1e-6)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    concurrency = [int(c) for c in args.concurrency.split(",")]
    work = Path(tempfile.mkdtemp(prefix="torchserve-bench-"))
    store, cases = make_archives(work)
    results: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    for round_index in range(args.rounds):
        order = ["modelhost", "torchserve"] if round_index % 2 == 0 else ["torchserve", "modelhost"]
        for kind in order:
            with Server(kind, store, work / f"{kind}-{round_index}") as server:
                for model, (body, expected) in cases.items():
                    check(server, model, body, expected)
                    body_file = work / f"{model}.body"
                    body_file.write_bytes(body)
                    for c in concurrency:
                        request = HttpRequest(f"{server.base}/predictions/{model}", body, 0)
                        cell = wrk(request, body_file, c, args.duration)
                        results.setdefault((kind, model, c), []).append(cell)
                        print(f"round {round_index} {kind:10} {model:4} c={c:<3} {cell['rps']:8.1f} req/s "
                              f"p50 {cell['p50']:7.2f} ms p99 {cell['p99']:7.2f} ms", flush=True)
                    check(server, model, body, expected)
    rows = []
    print(f"\n{'model':5} {'c':>3} | {'modelhost req/s':>15} {'p50 ms':>7} {'p99 ms':>7} | {'TorchServe req/s':>16} "
          f"{'p50 ms':>7} {'p99 ms':>7} | {'req/s x':>7} {'p50 x':>6}")
    for model in cases:
        for c in concurrency:
            ours, theirs = ({key: statistics.median(cell[key] for cell in results[(kind, model, c)])
                             for key in ("rps", "p50", "p99")} for kind in ("modelhost", "torchserve"))
            row = {"model": model, "c": c, "modelhost": ours, "torchserve": theirs,
                   "rps_ratio": ours["rps"] / theirs["rps"], "p50_ratio": ours["p50"] / theirs["p50"]}
            rows.append(row)
            print(f"{model:5} {c:>3} | {ours['rps']:15.1f} {ours['p50']:7.2f} {ours['p99']:7.2f} | "
                  f"{theirs['rps']:16.1f} {theirs['p50']:7.2f} {theirs['p99']:7.2f} | "
                  f"{row['rps_ratio']:7.2f} {row['p50_ratio']:6.2f}")
    if args.json:
        args.json.write_text(json.dumps({"date": str(date.today()), "rounds": args.rounds, "duration": args.duration,
                                         "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
