"""Start a real modelhost server in a subprocess on a free port, for tests and benchmarks."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import requests

_handed_out: set[int] = set()
# Under pytest-xdist each worker hands out ports of its own range, below the kernel's ephemeral ports (32768 and up,
# which bind(0) and client sockets take): two workers probing with bind(0) could each be offered the same port
# between one's probe and its server's bind, a second or so later.
_WORKER_PORTS = 4000
_FIRST_WORKER_PORT = 12000
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
_ports = (range(_FIRST_WORKER_PORT + int(_worker[2:]) * _WORKER_PORTS,
                _FIRST_WORKER_PORT + (int(_worker[2:]) + 1) * _WORKER_PORTS)
          if _worker[:2] == "gw" and _worker[2:].isdigit() and int(_worker[2:]) < 5 else None)
_next_port = [random.randrange(_WORKER_PORTS)]


def free_port() -> int:
    """A port free now and not handed out before in this process: the kernel may offer a port again once
    its probe socket closes, before the server it was meant for has bound it."""
    for _ in range(_WORKER_PORTS if _ports is not None else 0):
        port = _ports[_next_port[0] % _WORKER_PORTS]  # type: ignore[index]
        _next_port[0] += 1
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:  # in use
                continue
        _handed_out.add(port)
        return port
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


class ServerProcess:
    """`modelhost serve` on 127.0.0.1; `url` and `grpc_url` are "127.0.0.1:PORT" as tritonclient wants them."""

    def __init__(self, repository: Path | str | None, *extra_args: str, cache_dir: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"127.0.0.1:{self.port}"
        self.base = f"http://{self.url}"
        self.grpc_port = free_port()  # every server its own: tests never meet on the default 8001
        self.grpc_url = f"127.0.0.1:{self.grpc_port}"
        self.metrics_port = free_port()
        self.sagemaker_port = free_port()
        self.sagemaker = f"http://127.0.0.1:{self.sagemaker_port}"
        args = [sys.executable, "-m", "modelhost", "serve", "--http-port", str(self.port),
                "--grpc-port", str(self.grpc_port),
                "--metrics-port", str(self.metrics_port), "--sagemaker-port", str(self.sagemaker_port), *extra_args]
        if repository is not None:
            args += ["--model-repository", str(repository)]
        self.cache_dir = cache_dir
        env = {**os.environ, **(env or {})}
        if cache_dir is not None:
            env["MODELHOST_CACHE_DIR"] = str(cache_dir)
        self._spawn(args, env)

    def _spawn(self, args: list[str], env: dict[str, str] | None = None) -> None:
        """Start `args` as the server (subclasses with their own command line call it too)."""
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
        self.output = ""
        # Read the log as it comes: a server that logs more than a pipe holds would block on a full pipe.
        self._lines: list[str] = []
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()

    def _read_log(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.append(line)

    @property
    def printed(self) -> str:
        """What the server has printed so far (its log), while it runs."""
        return "".join(self._lines)

    @property
    def example_repository(self) -> Path:
        """The built-in example repository this server serves (started with no repository and a cache_dir)."""
        from modelhost.example_repository import repository_tag

        assert self.cache_dir is not None, "started without a cache_dir"
        return self.cache_dir / repository_tag()

    def wait_ready(self, timeout: float = 60.0, path: str = "/v2/health/ready") -> ServerProcess:
        """Wait for `path` (on the HTTP port, or a whole URL) to answer 200."""
        url = path if path.startswith("http") else self.base + path

        def answers() -> bool:
            try:
                return requests.get(url, timeout=1).status_code == 200
            except (requests.ConnectionError, requests.Timeout):  # not listening yet, or a busy machine
                return False

        return self._wait_until(answers, timeout, "server not ready")

    def wait_listening(self, port: int, timeout: float = 60.0) -> ServerProcess:
        """Wait until `port` accepts connections: the SageMaker site and the metrics port bind once the models at
        start have loaded, after the HTTP port has answered liveness."""
        def accepts() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False

        return self._wait_until(accepts, timeout, f"port {port} not listening")

    def _wait_until(self, check: Callable[[], bool], timeout: float, what: str) -> ServerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.stop()}")
            if check():
                return self
            time.sleep(0.05)
        raise TimeoutError(f"{what} after {timeout}s:\n{self.stop()}")

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.process.send_signal(signum)

    def stop(self, timeout: float = 30.0) -> str:
        """Stop the server (SIGTERM) if it runs, and return everything it printed."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._reader.join(timeout=10)
        self.output = "".join(self._lines)
        return self.output


class TfServingProcess(ServerProcess):
    """`modelhost tfserving` with TF Serving's flags: gRPC (`--port`) on `grpc_port`, REST on `port`."""

    def __init__(self, *flags: str) -> None:  # noqa: D107 - the attributes are ServerProcess's
        self.port = free_port()
        self.url = f"127.0.0.1:{self.port}"
        self.base = f"http://{self.url}"
        self.grpc_port = free_port()
        self.grpc_url = f"127.0.0.1:{self.grpc_port}"
        self.cache_dir = None
        args = [sys.executable, "-m", "modelhost", "tfserving", f"--port={self.grpc_port}",
                f"--rest_api_port={self.port}", *flags]
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.output = ""
        self._lines = []
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()


class TorchServeProcess(ServerProcess):
    """`modelhost torchserve --start` with a config.properties of free ports (`inference`, `management`, `metrics`
    are their base URLs) and its own temporary directory (for its pid file), in `directory`."""

    def __init__(self, directory: Path, *flags: str, properties: str = "") -> None:  # noqa: D107
        self.port, self.management_port, self.metrics_port = free_port(), free_port(), free_port()
        self.url = f"127.0.0.1:{self.port}"
        self.base = self.inference = f"http://{self.url}"
        self.management = f"http://127.0.0.1:{self.management_port}"
        self.metrics = f"http://127.0.0.1:{self.metrics_port}"
        self.grpc_inference_port, self.grpc_management_port = free_port(), free_port()
        self.cache_dir = None
        self.temporary = directory / "tmp"
        self.temporary.mkdir(parents=True, exist_ok=True)
        self.config_file = directory / "config.properties"
        self.config_file.write_text(
            f"inference_address=http://127.0.0.1:{self.port}\n"
            f"management_address=http://127.0.0.1:{self.management_port}\n"
            f"metrics_address=http://127.0.0.1:{self.metrics_port}\n"
            f"grpc_inference_port={self.grpc_inference_port}\ngrpc_management_port={self.grpc_management_port}\n"
            + properties)
        args = [sys.executable, "-m", "modelhost", "torchserve", "--start", "--ts-config", str(self.config_file),
                *flags]
        env = {**os.environ, "TMPDIR": str(self.temporary)}
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                        cwd=directory)
        self.output = ""
        self._lines = []
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()

    def wait_ready(self, timeout: float = 60.0, path: str = "") -> TorchServeProcess:
        """Wait until the models registered at start are registered and healthy."""
        super().wait_ready(timeout, path or f"{self.inference}/ping")
        wait_for(lambda: "ready:" in self.printed, timeout, "the models registered at start")
        return self


def pending(server: ServerProcess, model: str) -> int:
    """Requests queued for `model` (not running), from the Prometheus endpoint."""
    text = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).text
    match = re.search(rf'^nv_inference_pending_request_count{{[^}}]*model="{model}"[^}}]*}} (\S+)$', text, re.M)
    assert match, f"no pending count for {model} in /metrics"
    return int(float(match.group(1)))


def in_progress(server: ServerProcess) -> int:
    """Requests the server has and has not answered, from the Prometheus endpoint."""
    text = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    match = re.search(r"^modelhost_requests_in_progress (\S+)$", text, re.M)
    assert match, "no modelhost_requests_in_progress in /metrics"
    return int(float(match.group(1)))


def wait_for(predicate: Callable[[], bool], timeout: float = 3.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.005)
