"""NVIDIA Triton Inference Server on the CPU, from the `nvidia-pytriton` wheel, as a benchmark peer.

    python benchmarks/peers/triton.py --install   # once: the venv below
    python benchmarks/side_by_side.py --check triton   # start, one checked inference per model, stop

The wheel ships a real `tritonserver` binary (pytriton/tritonserver/bin) with its libraries
(nvidia_pytriton.libs), but only the *python* backend: no onnxruntime backend. So each model is
served by a python-backend `model.py` (written into a temporary Triton repository, next to a copy of
the same model.onnx) that runs onnxruntime with the same thread count as modelhost and the in-process
limit (intra_op_num_threads = the machine's cores). Triton's own HTTP/gRPC front ends, scheduler and
V2 protocol handling are real; the model runs in the python backend's stub process, so every request
also crosses Triton's shared-memory hop to that process (side_by_side.py's table says so in a footnote).
Config: the example repository's config.pbtxt (max_batch_size 1024, one KIND_CPU instance, no dynamic
batching) with `backend: "python"` in place of the ONNX platform. Tried with nvidia-pytriton 0.7.0
(tritonserver 2.51.0) on Python 3.11.

Triton lives in its own venv (MODELHOST_TRITON_VENV, default ~/.cache/modelhost-benchmarks/triton-venv):

    python -m venv ~/.cache/modelhost-benchmarks/triton-venv
    ~/.cache/modelhost-benchmarks/triton-venv/bin/pip install nvidia-pytriton onnxruntime

because the wheel pins numpy<2, and the stub's numpy bindings need numpy 1.x at run time (under
numpy 2, `as_numpy()` of a request tensor reads every element as the first one and output tensors
come back empty); installed beside modelhost it would downgrade modelhost's numpy. The stub embeds
the venv interpreter's libpython, found through that interpreter's LIBDIR put first on
LD_LIBRARY_PATH (else the system's libpython of the same version may be picked up), and imports
numpy and onnxruntime from the venv's site-packages (the venv's bin first on PATH).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.peers.logged_process import LoggedProcess  # noqa: E402
from tests.server import free_port  # noqa: E402

VENV = Path(os.environ.get("MODELHOST_TRITON_VENV", "~/.cache/modelhost-benchmarks/triton-venv")).expanduser()
VENV_PACKAGES = ["nvidia-pytriton", "onnxruntime"]
SHM_BYTES = 16 * 1024 * 1024  # the stub's shared-memory pool: a 500 x 1000 FP32 request fits without growth

MODEL_PY = '''\
"""Triton python backend: the model.onnx beside this file, run with onnxruntime (benchmark peer)."""
import os

import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        options = ort.SessionOptions()
        options.intra_op_num_threads = os.cpu_count() or 1
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]

    def execute(self, requests):
        responses = []
        for request in requests:
            feeds = {name: pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name in self.inputs}
            results = self.session.run(self.outputs, feeds)
            tensors = [pb_utils.Tensor(name, array) for name, array in zip(self.outputs, results)]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
'''


@dataclass(frozen=True)
class VenvPython:
    """What the stub needs to know of the venv's interpreter."""

    version: str  # "3.11"
    libdir: Path  # where its libpython is
    site_packages: Path


def install_venv(venv: Path = VENV) -> None:
    """Create the venv and pip-install Triton's wheel and onnxruntime into it (log in the venv)."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    with (venv / "install.log").open("wb") as log:
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", *VENV_PACKAGES],
                       stdout=log, stderr=subprocess.STDOUT, check=True)


@cache
def venv_python(venv: Path = VENV) -> VenvPython:
    python = venv / "bin" / "python"
    if not python.exists():
        raise RuntimeError(f"no Triton venv at {venv}: python benchmarks/peers/triton.py --install")
    probe = ("import json, sys, sysconfig; print(json.dumps([f'{sys.version_info[0]}.{sys.version_info[1]}', "
             "sysconfig.get_config_var('LIBDIR'), sysconfig.get_path('purelib')]))")
    version, libdir, site_packages = json.loads(subprocess.run([str(python), "-c", probe], capture_output=True,
                                                               text=True, check=True).stdout)
    return VenvPython(version, Path(libdir), Path(site_packages))


def pytriton_root() -> Path:
    """The `pytriton` package directory in the venv (located, never imported)."""
    root = venv_python().site_packages / "pytriton"
    if not root.is_dir():
        raise RuntimeError(f"nvidia-pytriton is not installed in {VENV}: python benchmarks/peers/triton.py --install")
    return root


def server_binary() -> Path:
    return pytriton_root() / "tritonserver" / "bin" / "tritonserver"


def python_stub() -> Path:
    """The python backend stub built for the venv interpreter's version."""
    version = venv_python().version
    stub = pytriton_root() / "tritonserver" / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise RuntimeError(f"nvidia-pytriton has no python backend stub for Python {version}")
    return stub


def write_backend_directory(dest: Path) -> Path:
    """A backend directory whose python backend has the venv interpreter's stub beside it (where the
    backend looks for it), made of links into the wheel so the installed package is left untouched."""
    backend = dest / "python"
    backend.mkdir(parents=True, exist_ok=True)
    shipped = pytriton_root() / "tritonserver" / "backends" / "python"
    links = {"libtriton_python.so": shipped / "libtriton_python.so",
             "triton_python_backend_utils.py": shipped / "triton_python_backend_utils.py",
             "triton_python_backend_stub": python_stub()}
    for name, target in links.items():
        link = backend / name
        if not link.exists():
            link.symlink_to(target)
    return dest


def write_model_repository(source: Path, models: Sequence[str], dest: Path) -> Path:
    """A Triton repository serving each ONNX model of `source` through the python backend."""
    for model in models:
        version = dest / model / "1"
        version.mkdir(parents=True, exist_ok=True)
        (version / "model.onnx").write_bytes((source / model / "1" / "model.onnx").read_bytes())
        (version / "model.py").write_text(MODEL_PY)
        config = (source / model / "config.pbtxt").read_text()
        if 'platform: "onnxruntime_onnx"' not in config:
            raise ValueError(f"{model}: expected an onnxruntime_onnx config.pbtxt")
        (dest / model / "config.pbtxt").write_text(config.replace('platform: "onnxruntime_onnx"', 'backend: "python"'))
    return dest


def server_environment() -> dict[str, str]:
    """LD_LIBRARY_PATH: the venv interpreter's libpython first (for the stub), then the wheel's
    libraries. PATH: the venv's bin first, since the stub's embedded interpreter ignores PYTHONPATH
    and takes its prefix (so its site-packages) from the `python3` it finds on PATH."""
    python = venv_python()
    env = dict(os.environ)
    libraries = [str(python.libdir), str(python.site_packages / "nvidia_pytriton.libs")]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [*libraries, env.get("LD_LIBRARY_PATH")]))
    env["PATH"] = os.pathsep.join(filter(None, [str(VENV / "bin"), env.get("PATH")]))
    return env


class TritonServer:
    """`tritonserver` on 127.0.0.1 serving `models` of an ONNX example repository, on free ports.
    `url` and `grpc_url` are "127.0.0.1:PORT" (as tritonclient wants them), `base` the HTTP base URL."""

    def __init__(self, repository: Path, models: Sequence[str], workdir: Path | None = None) -> None:
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="triton-peer-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.models = list(models)
        self.port, self.grpc_port = free_port(), free_port()
        self.url, self.grpc_url = f"127.0.0.1:{self.port}", f"127.0.0.1:{self.grpc_port}"
        self.base = f"http://{self.url}"
        self.log = self.workdir / "tritonserver.log"
        self.command = [
            str(server_binary()),
            "--model-repository", str(write_model_repository(repository, self.models, self.workdir / "models")),
            "--backend-directory", str(write_backend_directory(self.workdir / "backends")),
            "--backend-config", f"python,shm-default-byte-size={SHM_BYTES}",
            "--http-address", "127.0.0.1", "--http-port", str(self.port),
            "--grpc-address", "127.0.0.1", "--grpc-port", str(self.grpc_port),
            "--allow-metrics", "false", "--exit-timeout-secs", "3",
        ]
        self.server = LoggedProcess("tritonserver", self.command, self.log, self.workdir, server_environment())

    def start(self, timeout: float = 120.0) -> TritonServer:
        self.server.start(self._ready, timeout)
        return self

    def _ready(self) -> bool:
        try:
            return requests.get(f"{self.base}/v2/health/ready", timeout=1).status_code == 200
        except (requests.ConnectionError, requests.Timeout):
            return False

    def output(self) -> str:
        return self.server.output()

    def stop(self, timeout: float = 30.0) -> str:
        """SIGTERM (Triton unloads its models and exits), SIGKILL past `timeout`; returns the log's tail."""
        return self.server.stop(timeout)

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--install", action="store_true", help=f"create the venv ({VENV}) if missing")
    if parser.parse_args().install and not (VENV / "bin" / "python").exists():
        install_venv()
    print(f"Triton venv: {VENV}; check it with: python benchmarks/side_by_side.py --check triton")


if __name__ == "__main__":
    main()
