"""Run Triton's Python client examples against modelhost and print what passes.

    git --git-dir=<client mirror> archive HEAD src/python/examples | tar -x -C /tmp/triton-client
    PYTHONPATH=. python scripts/triton_client_examples.py /tmp/triton-client/src/python/examples

It generates the model repository the examples expect (scripts/triton_client_models.py), starts `modelhost
serve` on free ports (with --allow-client-shm; a server in explicit model-control mode per model-control example,
whose repository holds the number of models that example counts), runs every example with its -u pointing there
and a timeout, and prints one row per run: pass, FAIL or n/a (with why), and the last line of a failure.
An example that hard-codes localhost:8000/8001 runs only when those ports are free (the main server takes them).
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton_client_models as models  # noqa: E402

TIMEOUT_SECONDS = 30.0
CUDA = "CUDA shared memory: modelhost has none (a GPU host would run it and fail at registration)"


@dataclass
class Run:
    """One run of an example: its file, extra arguments, which server and protocol it talks to."""

    script: str
    args: list[str] = field(default_factory=list)
    protocol: str = "grpc"      # which of the server's ports -u gets
    server: str = "main"        # "main", "control7", "control8" or "default" (hard-coded ports)
    skip: str = ""              # why it is not applicable
    needs: str = ""             # a client-side package the example imports

    @property
    def label(self) -> str:
        return " ".join([self.script, *self.args]).replace(" IMAGE", "")


def runs() -> list[Run]:
    dyna = ["simple_grpc_sequence_sync_infer_client.py", "simple_grpc_sequence_stream_infer_client.py",
            "simple_grpc_aio_sequence_stream_infer_client.py"]
    grpc = ["grpc_client.py", "grpc_explicit_byte_content_client.py", "grpc_explicit_int8_content_client.py",
            "grpc_explicit_int_content_client.py", "simple_grpc_aio_infer_client.py", *dyna,
            "simple_grpc_async_infer_client.py", "simple_grpc_custom_args_client.py", "simple_grpc_custom_repeat.py",
            "simple_grpc_health_metadata.py", "simple_grpc_infer_client.py", "simple_grpc_keepalive_client.py",
            "simple_grpc_shm_client.py", "simple_grpc_shm_string_client.py", "simple_grpc_string_infer_client.py"]
    http = ["simple_http_aio_infer_client.py", "simple_http_async_infer_client.py", "simple_http_health_metadata.py",
            "simple_http_infer_client.py", "simple_http_sequence_sync_infer_client.py", "simple_http_shm_client.py",
            "simple_http_shm_string_client.py", "simple_http_string_infer_client.py", "reuse_infer_objects_client.py"]
    image = ["-m", "densenet_onnx", "-c", "3", "-s", "INCEPTION", "IMAGE"]
    return [*(Run(s) for s in grpc), *(Run(s, ["-d"]) for s in dyna),
            *(Run(s, protocol="http") for s in http), Run("simple_http_sequence_sync_infer_client.py", ["-d"], "http"),
            Run("reuse_infer_objects_client.py", ["-i", "grpc"]),
            Run("simple_grpc_model_control.py", server="control8"),
            Run("simple_http_model_control.py", protocol="http", server="control7"),
            Run("memory_growth_test.py", ["-i", "http", "-r", "20"], "http", "default"),
            Run("memory_growth_test.py", ["-i", "grpc", "-r", "20"], "grpc", "default"),
            *compression(), *tls(), Run("image_client.py", image, "http", needs="attrdict"),
            Run("image_client.py", ["-a", *image], "http", needs="attrdict"),
            Run("image_client.py", ["-i", "grpc", *image]),
            Run("image_client.py", ["-i", "grpc", "--streaming", *image]),
            Run("grpc_image_client.py", image), Run("grpc_image_client.py", ["-a", *image]),
            Run("grpc_image_client.py", ["--streaming", *image]),
            Run("ensemble_image_client.py", ["-m", "preprocess_resnet50_ensemble", "IMAGE"], "http"),
            Run("ensemble_image_client.py", ["-i", "grpc", "-m", "preprocess_resnet50_ensemble", "IMAGE"]),
            Run("simple_grpc_cudashm_client.py", skip=CUDA),
            Run("simple_http_cudashm_client.py", protocol="http", skip=CUDA)]


def compression() -> list[Run]:
    """The infer examples again with each compression algorithm they offer, both ways."""
    grpc = [Run(s, ["-C", algorithm]) for s in ("simple_grpc_infer_client.py", "simple_grpc_aio_infer_client.py")
            for algorithm in ("gzip", "deflate")]
    http = [Run(s, [f"--{way}-compression-algorithm", algorithm], "http")
            for s in ("simple_http_infer_client.py", "simple_http_aio_infer_client.py")
            for way in ("request", "response") for algorithm in ("gzip", "deflate")]
    return grpc + http


def tls() -> list[Run]:
    """The infer examples over mutual TLS (a server of their own with --tls-*-file; the client's certificate from
    the same test CA)."""
    grpc = ["-s", "-r", "CA", "-p", "CLIENT_KEY", "-x", "CLIENT_CERT"]
    http = ["--ssl", "--ca-certs", "CA", "--key-file", "CLIENT_KEY", "--cert-file", "CLIENT_CERT"]
    return [*(Run(s, grpc, server="tls") for s in ("simple_grpc_infer_client.py", "simple_grpc_aio_infer_client.py")),
            *(Run(s, http, "http", "tls") for s in ("simple_http_infer_client.py", "simple_http_aio_infer_client.py"))]


def write_certificates(work: Path) -> dict[str, Path]:
    """A test CA, a server certificate for localhost and a client certificate: {placeholder: file}."""
    import trustme

    ca = trustme.CA()
    files = {"CA": work / "ca.pem", "SERVER_CERT": work / "server.pem", "SERVER_KEY": work / "server-key.pem",
             "CLIENT_CERT": work / "client.pem", "CLIENT_KEY": work / "client-key.pem"}
    ca.cert_pem.write_to_path(str(files["CA"]))
    for role, leaf in (("SERVER", ca.issue_cert("localhost", "127.0.0.1")), ("CLIENT", ca.issue_cert("client"))):
        leaf.private_key_pem.write_to_path(str(files[f"{role}_KEY"]))
        files[f"{role}_CERT"].write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    return files


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """`modelhost serve` in a subprocess, its log in a file."""

    def __init__(self, repo: Path, log: Path, *flags: str, http: int = 0, grpc: int = 0) -> None:
        self.http, self.grpc = http or free_port(), grpc or free_port()
        self.log = log
        self.tls: ssl.SSLContext | None = None  # set for a server that serves TLS
        args = [sys.executable, "-m", "modelhost", "serve", "--model-repository", str(repo),
                "--http-port", str(self.http), "--grpc-port", str(self.grpc), "--metrics-port", "0",
                "--sagemaker-port", "0", *flags]
        self.process = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT)

    def url(self, protocol: str) -> str:
        return f"localhost:{self.http if protocol == 'http' else self.grpc}"

    def wait_ready(self, timeout: float = 60.0) -> Server:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: see {self.log}")
            try:
                scheme = "https" if self.tls else "http"
                with urllib.request.urlopen(f"{scheme}://localhost:{self.http}/v2/health/ready", timeout=1,
                                            context=self.tls):
                    return self
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"server not ready after {timeout}s: see {self.log}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_servers(work: Path, files: dict[str, Path]) -> dict[str, Server]:
    repo = models.build_repository(work / "repo")
    defaults = port_free(8000) and port_free(8001)
    ports = {"http": 8000, "grpc": 8001} if defaults else {}
    servers = {"main": Server(repo, work / "main.log", "--allow-client-shm", "--server-name", "triton", **ports)}
    if defaults:
        servers["default"] = servers["main"]
    for count in (7, 8):
        control = models.control_repository(repo, work / f"control{count}", count)
        servers[f"control{count}"] = Server(control, work / f"control{count}.log", "--model-control-mode",
                                            "explicit")
    servers["tls"] = Server(repo, work / "tls.log", "--tls-cert-file", str(files["SERVER_CERT"]), "--tls-key-file",
                            str(files["SERVER_KEY"]), "--tls-ca-file", str(files["CA"]))
    servers["tls"].tls = ssl.create_default_context(cafile=str(files["CA"]))
    servers["tls"].tls.load_cert_chain(files["CLIENT_CERT"], files["CLIENT_KEY"])
    for server in servers.values():
        server.wait_ready()
    return servers


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:160] if lines else ""


def run_one(run: Run, examples: Path, servers: dict[str, Server], files: dict[str, Path]) -> tuple[str, str]:
    """(result, detail) of one run: "pass", "FAIL" or "n/a"."""
    if run.skip:
        return "n/a", run.skip
    if run.needs and importlib.util.find_spec(run.needs) is None:
        return "n/a", f"the example needs the Python package {run.needs!r} (pip install {run.needs})"
    server = servers.get(run.server)
    if server is None:
        return "n/a", "hard-codes localhost:8000/8001, which were taken"
    args = [str(files.get(a, a)) for a in run.args]
    if run.server != "default":
        args += ["-u", server.url(run.protocol)]
    try:
        done = subprocess.run([sys.executable, str(examples / run.script), *args], capture_output=True, text=True,
                              timeout=TIMEOUT_SECONDS, cwd=examples)
    except subprocess.TimeoutExpired:
        return "FAIL", f"timed out after {TIMEOUT_SECONDS:.0f} s"
    if done.returncode == 0:
        return "pass", ""
    return "FAIL", f"exit {done.returncode}: {last_line(done.stderr) or last_line(done.stdout)}"


def write_image(path: Path) -> Path:
    from PIL import Image

    Image.new("RGB", (320, 240), (200, 120, 40)).save(path)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("examples", type=Path, help="Triton client's src/python/examples directory")
    parser.add_argument("--only", default="", help="run only the examples whose file name contains this")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (repositories, server logs)")
    flags = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="triton-examples-"))
    files = {**write_certificates(work), "IMAGE": write_image(work / "image.png")}
    servers = start_servers(work, files)
    results = []
    try:
        for run in (r for r in runs() if flags.only in r.script):
            result, detail = run_one(run, flags.examples.resolve(), servers, files)
            results.append(result)
            print(f"{run.label:<72} {result:<5} {detail}", flush=True)
    finally:
        for server in {id(s): s for s in servers.values()}.values():
            server.stop()
    passed, applicable = results.count("pass"), len(results) - results.count("n/a")
    print(f"\n{passed} passed / {applicable} applicable / {len(results)} runs (work directory: {work})")
    if not flags.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if passed == applicable else 1


if __name__ == "__main__":
    sys.exit(main())
