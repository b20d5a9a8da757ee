"""TorchServe 0.12 as a benchmark peer: the example repository's ONNX models run with onnxruntime.

    pip install 'torchserve==0.12.*' torch-model-archiver pyyaml    # and torch==2.13.0 (the CPU wheel)
    apt-get install -y openjdk-17-jre-headless                      # its front end is Java
    python benchmarks/side_by_side.py --check torchserve   # start, one checked inference per model, stop

Each model becomes a `.mar` made by torch-model-archiver from a handler (written here, see HANDLER_PY)
and the same model.onnx: the handler runs onnxruntime (no TorchScript) with the same thread count as
modelhost and the in-process limit (intra_op_num_threads = the machine's cores).

TorchServe has no KServe V2 binary tensor protocol of its own, so requests use its native APIs with raw
bytes, the closest thing to V2's binary extension: the body is the little-endian FP32 rows (`rows x
features`, shape from the model) and the answer the raw FP32 outputs.
- HTTP: POST /predictions/<model>, Content-Type application/octet-stream.
- gRPC: InferenceAPIsService/Predictions (inference.proto, package org.pytorch.serve.grpc.inference),
  the rows in `input["data"]`, the answer in `prediction`. Its messages are built here from a
  descriptor (`predictions_messages`), so no generated code or proto compiler is needed.
(Its Open Inference gRPC service carries FP32 as typed repeated floats re-encoded to JSON for the handler,
and its KServe HTTP wrapper is a separate Python process, so neither is TorchServe's fast path.)

Config, for a fair 2-core CPU comparison: one worker (one Python process) per model, batch size 1 (no
dynamic batching: neither modelhost's example configs nor Triton's here batch), netty threads = cores,
job queue 1024 (so 128 connections never meet a 503), system metrics off, logging at WARN to one
file (as shipped it logs about ten INFO/DEBUG lines per request, to the console and four files; the
other servers here log nothing per request). Request metrics stay as shipped. Ports: free ones on
127.0.0.1 for inference, management, metrics and both gRPC services; the workers' Unix sockets and the
launcher's pid file go to the work directory; token auth off. Tried with TorchServe 0.12.0, Java 17.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import requests
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.peers.logged_process import LoggedProcess  # noqa: E402
from tests.server import free_port  # noqa: E402

BIN = Path(sys.executable).parent
PREDICTIONS_METHOD = "/org.pytorch.serve.grpc.inference.InferenceAPIsService/Predictions"
GRPC_INPUT_KEY = "data"

HANDLER_PY = '''\
"""TorchServe handler: the archive's model.onnx with onnxruntime; raw FP32 rows in, raw FP32 out."""
import os

import numpy as np
import onnxruntime as ort


class OnnxRawHandler:
    def initialize(self, context):
        options = ort.SessionOptions()
        options.intra_op_num_threads = os.cpu_count() or 1
        path = os.path.join(context.system_properties["model_dir"], "model.onnx")
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        first = self.session.get_inputs()[0]
        self.input, self.features = first.name, first.shape[1]
        self.output = self.session.get_outputs()[0].name

    def handle(self, data, context):
        answers = []
        for index, request in enumerate(data):
            payload = request.get("body") or request.get("data")  # HTTP body, or the gRPC input["data"]
            rows = np.frombuffer(payload, dtype="<f4").reshape(-1, self.features)
            answers.append(self.session.run([self.output], {self.input: rows})[0].tobytes())
            context.set_response_content_type(index, "application/octet-stream")
        return answers
'''


def archive_models(repository: Path, models: Sequence[str], store: Path, workdir: Path) -> Path:
    """One `.mar` per model in `store`, from HANDLER_PY and the repository's model.onnx."""
    handler = workdir / "onnx_raw_handler.py"
    handler.write_text(HANDLER_PY)
    store.mkdir(parents=True, exist_ok=True)
    for model in models:
        subprocess.run([str(BIN / "torch-model-archiver"), "--model-name", model, "--version", "1",
                        "--handler", str(handler), "--extra-files", str(repository / model / "1" / "model.onnx"),
                        "--export-path", str(store), "--force"], check=True, capture_output=True)
    return store


def log_config(logs: Path) -> str:
    """log4j2: warnings and errors only, to one file (as shipped it logs about ten lines per request)."""
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<Configuration>
  <Appenders>
    <File name="file" fileName="{logs / 'ts_log.log'}"><PatternLayout pattern="%d{{ISO8601}} [%-5p] %c - %m%n"/></File>
  </Appenders>
  <Loggers>
    <Root level="warn"><AppenderRef ref="file"/></Root>
  </Loggers>
</Configuration>
"""


def config_properties(ports: dict[str, int], store: Path, models: Sequence[str]) -> str:
    threads = os.cpu_count() or 1
    settings = {
        "inference_address": f"http://127.0.0.1:{ports['http']}",
        "management_address": f"http://127.0.0.1:{ports['management']}",
        "metrics_address": f"http://127.0.0.1:{ports['metrics']}",
        "grpc_inference_address": "127.0.0.1", "grpc_inference_port": ports["grpc"],
        "grpc_management_address": "127.0.0.1", "grpc_management_port": ports["grpc_management"],
        "initial_worker_port": ports["worker"],
        "model_store": store, "load_models": ",".join(f"{m}.mar" for m in models),
        "default_workers_per_model": 1, "number_of_netty_threads": threads, "netty_client_threads": threads,
        "job_queue_size": 1024, "max_request_size": 64 << 20, "max_response_size": 64 << 20,
        "disable_system_metrics": "true", "disable_token_authorization": "true",
        "python": sys.executable,
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


class TorchServeServer:
    """TorchServe on 127.0.0.1 serving `models` of an ONNX example repository, on free ports.
    `base` is the HTTP inference base URL, `grpc_url` "127.0.0.1:PORT"."""

    def __init__(self, repository: Path, models: Sequence[str], workdir: Path | None = None) -> None:
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="torchserve-peer-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.models = list(models)
        # "worker" names the workers' Unix sockets (.ts.sock.<port> and on), not a TCP port.
        self.ports = {name: free_port() for name in ("http", "management", "metrics", "grpc", "grpc_management",
                                                     "worker")}
        self.base = f"http://127.0.0.1:{self.ports['http']}"
        self.management = f"http://127.0.0.1:{self.ports['management']}"
        self.grpc_url = f"127.0.0.1:{self.ports['grpc']}"
        self.log = self.workdir / "torchserve.log"
        store = archive_models(repository, self.models, self.workdir / "store", self.workdir)
        config = self.workdir / "config.properties"
        config.write_text(config_properties(self.ports, store, self.models))
        logging = self.workdir / "log4j2.xml"
        logging.write_text(log_config(self.workdir / "logs"))
        command = [str(BIN / "torchserve"), "--start", "--foreground", "--ncs", "--disable-token-auth",
                   "--ts-config", str(config), "--model-store", str(store), "--log-config", str(logging)]
        # Its own session: the launcher, Java and the Python workers stop together by process group.
        self.server = LoggedProcess("torchserve", command, self.log, self.workdir, self.environment(), own_group=True)

    def environment(self) -> dict[str, str]:
        """Temporary files (the launcher's pid file, Java's tmpdir with the worker sockets) and logs in the
        work directory, so two TorchServes never meet."""
        directory = str(self.workdir)
        return {**os.environ, "TMPDIR": directory, "TEMP": directory,
                "LOG_LOCATION": str(self.workdir / "logs"), "METRICS_LOCATION": str(self.workdir / "logs")}

    def start(self, timeout: float = 180.0) -> TorchServeServer:
        """Every model's workers READY (from the management API), or an error with the log's tail."""
        self.server.start(lambda: all(self._model_ready(model) for model in self.models), timeout, 0.5)
        return self

    def _model_ready(self, model: str) -> bool:
        try:
            response = requests.get(f"{self.management}/models/{model}", timeout=2)
        except (requests.ConnectionError, requests.Timeout):
            return False
        if response.status_code != 200:
            return False
        workers = response.json()[0].get("workers", [])
        return bool(workers) and all(worker.get("status") == "READY" for worker in workers)

    def output(self) -> str:
        return self.server.output()

    def stop(self, timeout: float = 30.0) -> str:
        """SIGTERM to the whole process group (launcher, Java, workers), SIGKILL past `timeout`."""
        return self.server.stop(timeout)

    def __enter__(self) -> TorchServeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@cache
def predictions_messages() -> tuple[type[Message], type[Message]]:
    """PredictionsRequest and PredictionResponse of TorchServe's inference.proto (the fields used here,
    same names and numbers), built from a descriptor in a private pool."""
    proto = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="torchserve_inference_subset.proto",
                                              package="org.pytorch.serve.grpc.inference", syntax="proto3")
    request = file.message_type.add(name="PredictionsRequest")
    request.field.add(name="model_name", number=1, type=proto.TYPE_STRING, label=proto.LABEL_OPTIONAL)
    request.field.add(name="model_version", number=2, type=proto.TYPE_STRING, label=proto.LABEL_OPTIONAL)
    entry = request.nested_type.add(name="InputEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=proto.TYPE_STRING, label=proto.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=proto.TYPE_BYTES, label=proto.LABEL_OPTIONAL)
    request.field.add(name="input", number=3, type=proto.TYPE_MESSAGE, label=proto.LABEL_REPEATED,
                      type_name=".org.pytorch.serve.grpc.inference.PredictionsRequest.InputEntry")
    response = file.message_type.add(name="PredictionResponse")
    response.field.add(name="prediction", number=1, type=proto.TYPE_BYTES, label=proto.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return (message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{file.package}.PredictionsRequest")),
            message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{file.package}.PredictionResponse")))


def predictions_request(model: str, payload: bytes) -> Message:
    request_class, _ = predictions_messages()
    return request_class(model_name=model, input={GRPC_INPUT_KEY: payload})
