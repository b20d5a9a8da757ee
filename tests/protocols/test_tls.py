"""TLS on every port (--tls-cert-file/--tls-key-file), mutual TLS (--tls-ca-file) and reload on SIGHUP,
with real clients: tritonclient.http and .grpc, requests, and raw ssl sockets where a test must see the
certificate itself. Certificates come from a CA made here with trustme (127.0.0.1 is in the server's).
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import trustme
from tritonclient.utils import InferenceServerException

from tests.onnx_models import ADD_SUB_CONFIG, add_sub_model, write_model
from tests.server import ServerProcess, wait_for


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "add_sub", add_sub_model(), 'name: "add_sub"\n' + ADD_SUB_CONFIG)
    return repo


def _write_cert(ca: trustme.CA, directory: Path) -> tuple[Path, Path, str]:
    """A fresh server certificate for 127.0.0.1, written over cert.pem/key.pem atomically; its fingerprint."""
    cert = ca.issue_cert("127.0.0.1", "localhost")
    for name, blob in (("cert.pem", b"".join(b.bytes() for b in cert.cert_chain_pems)),
                       ("key.pem", cert.private_key_pem.bytes())):
        (directory / f".{name}").write_bytes(blob)
        os.replace(directory / f".{name}", directory / name)
    return directory / "cert.pem", directory / "key.pem", _fingerprint(ssl.PEM_cert_to_DER_cert(
        cert.cert_chain_pems[0].bytes().decode()))


def _fingerprint(der: bytes) -> str:
    return hashlib.sha256(der).hexdigest()


def _client_context(ca_file: Path, alpn: str = "http/1.1", client: trustme.LeafCert | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca_file))
    context.set_alpn_protocols([alpn])
    if client is not None:
        client.configure_cert(context)
    return context


def _connect(port: int, context: ssl.SSLContext) -> ssl.SSLSocket:
    return context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname="127.0.0.1")


def _peer_fingerprint(port: int, context: ssl.SSLContext) -> str:
    with _connect(port, context) as sock:
        der = sock.getpeercert(binary_form=True)
        assert der is not None
        return _fingerprint(der)


def _get(sock: ssl.SSLSocket, path: str) -> bytes:
    """One keep-alive GET on an open connection; the status line."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, "the server closed the connection"
        head += chunk
    return head.split(b"\r\n", 1)[0]


def _start(repository: Path, *args: str, verify: str, cert: tuple[str, str] | None = None) -> ServerProcess:
    server = ServerProcess(repository, *args)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited:\n{server.stop()}")
        try:
            if requests.get(f"https://{server.url}/v2/health/ready", verify=verify, cert=cert, timeout=1).ok:
                return server
        except requests.RequestException:
            pass
        time.sleep(0.05)
    raise TimeoutError(server.stop())


@pytest.fixture(scope="module")
def tls_server(ca: trustme.CA, repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        tuple[ServerProcess, Path, Path]]:
    """TLS on all four ports; yields the server, its certificate directory and the CA file."""
    directory = tmp_path_factory.mktemp("tls")
    cert, key, _ = _write_cert(ca, directory)
    ca_file = directory / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    server = _start(repository, "--tls-cert-file", str(cert), "--tls-key-file", str(key), verify=str(ca_file))
    yield server, directory, ca_file
    server.stop()


def test_tritonclient_http_and_grpc_infer_over_tls(tls_server: tuple[ServerProcess, Path, Path]) -> None:
    server, _, ca_file = tls_server
    a, b = np.arange(16, dtype=np.float32).reshape(1, 16), np.ones((1, 16), np.float32)
    http = httpclient.InferenceServerClient(server.url, ssl=True, ssl_options={"ca_certs": str(ca_file)})
    inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a, binary_data=True)  # the binary body: read into one buffer through TLS too
    inputs[1].set_data_from_numpy(b, binary_data=False)
    np.testing.assert_array_equal(http.infer("add_sub", inputs).as_numpy("OUTPUT0"), a + b)
    http.close()
    grpc_client = grpcclient.InferenceServerClient(server.grpc_url, ssl=True, root_certificates=str(ca_file))
    inputs = [grpcclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    np.testing.assert_array_equal(grpc_client.infer("add_sub", inputs).as_numpy("OUTPUT1"), a - b)
    grpc_client.close()


def test_sagemaker_and_metrics_ports_speak_tls(tls_server: tuple[ServerProcess, Path, Path]) -> None:
    server, _, ca_file = tls_server
    assert requests.get(f"https://127.0.0.1:{server.sagemaker_port}/ping", verify=str(ca_file), timeout=5).ok
    metrics = requests.get(f"https://127.0.0.1:{server.metrics_port}/metrics", verify=str(ca_file), timeout=5)
    assert metrics.ok and "nv_inference" in metrics.text
    # A client that does not trust the CA is refused by its own verification.
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"https://{server.url}/v2/health/live", timeout=5)


def test_a_large_binary_body_arrives_whole_over_tls(tls_server: tuple[ServerProcess, Path, Path]) -> None:
    """A body of many TLS records (16 KiB each) lands in the request's one buffer, as over plain HTTP."""
    server, _, ca_file = tls_server
    rows = 4096  # 2 x 256 KiB of FP32 in one binary request
    a = np.random.default_rng(0).random((rows, 16), dtype=np.float32)
    http = httpclient.InferenceServerClient(server.url, ssl=True, ssl_options={"ca_certs": str(ca_file)})
    inputs = [httpclient.InferInput(n, [rows, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a, binary_data=True)
    with pytest.raises(InferenceServerException, match="batch size"):  # > max_batch_size 8: decoded, then checked
        http.infer("add_sub", inputs)
    small = [httpclient.InferInput(n, [8, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor in small:
        tensor.set_data_from_numpy(a[:8], binary_data=True)
    np.testing.assert_array_equal(http.infer("add_sub", small).as_numpy("OUTPUT0"), a[:8] * 2)
    http.close()


def test_plain_clients_on_tls_ports_fail_cleanly_and_the_server_stays_up(
        tls_server: tuple[ServerProcess, Path, Path]) -> None:
    server, _, ca_file = tls_server
    for _ in range(20):
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://{server.url}/v2/health/live", timeout=5)
    plain_grpc = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException):
        plain_grpc.is_server_live(client_timeout=5)
    plain_grpc.close()
    assert requests.get(f"https://{server.url}/v2/health/live", verify=str(ca_file), timeout=5).ok
    assert "Traceback" not in server.printed  # failed handshakes are not logged one traceback each


def test_sighup_swaps_the_certificate_for_new_connections_only(ca: trustme.CA,
                                                               tls_server: tuple[ServerProcess, Path, Path]) -> None:
    server, directory, ca_file = tls_server
    http_context, grpc_context = _client_context(ca_file), _client_context(ca_file, "h2")
    old = _peer_fingerprint(server.port, http_context)
    assert _peer_fingerprint(server.grpc_port, grpc_context) == old
    with _connect(server.port, http_context) as kept:
        assert _get(kept, "/v2/health/live") == b"HTTP/1.1 200 OK"
        _, _, new = _write_cert(ca, directory)
        server.signal(signal.SIGHUP)
        wait_for(lambda: _peer_fingerprint(server.port, http_context) == new, 10, "the new certificate over HTTP")
        for port in (server.sagemaker_port, server.metrics_port):
            assert _peer_fingerprint(port, http_context) == new
        wait_for(lambda: _peer_fingerprint(server.grpc_port, grpc_context) == new, 10, "the new certificate over gRPC")
        # The connection opened before the reload goes on, with the certificate it began with.
        assert _get(kept, "/v2/health/live") == b"HTTP/1.1 200 OK"
        kept_der = kept.getpeercert(binary_form=True)
        assert kept_der is not None and _fingerprint(kept_der) == old
    client = grpcclient.InferenceServerClient(server.grpc_url, ssl=True, root_certificates=str(ca_file))
    assert client.is_server_live()
    client.close()
    assert "reloaded the TLS certificate" in server.printed


def test_a_reload_of_broken_files_keeps_the_old_certificate(ca: trustme.CA, repository: Path,
                                                            tmp_path: Path) -> None:
    cert, key, fingerprint = _write_cert(ca, tmp_path)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    server = _start(repository, "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--grpc-port", "0",
                    "--tls-off", "sagemaker", verify=str(ca_file))
    try:
        assert requests.get(f"http://127.0.0.1:{server.sagemaker_port}/ping", timeout=5).ok  # --tls-off: plain
        other = ca.issue_cert("127.0.0.1")
        key.write_bytes(other.private_key_pem.bytes())  # a key that is not the certificate's
        server.signal(signal.SIGHUP)
        wait_for(lambda: "not reloaded" in server.printed, 10, "the failed reload in the log")
        assert server.process.poll() is None
        assert _peer_fingerprint(server.port, _client_context(ca_file)) == fingerprint
    finally:
        output = server.stop()
    assert "KEY_VALUES_MISMATCH" in output or "key values mismatch" in output


def test_bad_certificate_files_stop_the_server_at_start(repository: Path, tmp_path: Path) -> None:
    (tmp_path / "cert.pem").write_text("not a certificate")
    server = ServerProcess(repository, "--tls-cert-file", str(tmp_path / "cert.pem"), "--tls-key-file",
                           str(tmp_path / "missing.pem"))
    assert server.process.wait(timeout=60) != 0
    assert "--tls-cert-file" in server.stop()


@pytest.fixture(scope="module")
def mtls_server(ca: trustme.CA, repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        tuple[ServerProcess, Path, trustme.LeafCert]]:
    directory = tmp_path_factory.mktemp("mtls")
    cert, key, _ = _write_cert(ca, directory)
    client_ca = trustme.CA()  # client certificates come from a CA of their own
    client_ca_file = directory / "client-ca.pem"
    client_ca.cert_pem.write_to_path(str(client_ca_file))
    ca_file = directory / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    client = client_ca.issue_cert("client@example.com")
    client.private_key_pem.write_to_path(str(directory / "client-key.pem"))
    client.cert_chain_pems[0].write_to_path(str(directory / "client.pem"))
    server = _start(repository, "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-file",
                    str(client_ca_file), verify=str(ca_file),
                    cert=(str(directory / "client.pem"), str(directory / "client-key.pem")))
    yield server, directory, client
    server.stop()


def test_mutual_tls_needs_a_client_certificate(ca: trustme.CA,
                                               mtls_server: tuple[ServerProcess, Path, trustme.LeafCert]) -> None:
    server, directory, client = mtls_server
    ca_file, pair = str(directory / "ca.pem"), (str(directory / "client.pem"), str(directory / "client-key.pem"))
    assert requests.get(f"https://{server.url}/v2/health/live", verify=ca_file, cert=pair, timeout=5).ok
    with pytest.raises(requests.ConnectionError):  # SSLError or a reset, depending on when the alert arrives
        requests.get(f"https://{server.url}/v2/health/live", verify=ca_file, timeout=5)
    stranger = ca.issue_cert("someone@example.com")  # a certificate, but not from the client CA
    stranger.private_key_pem.write_to_path(str(directory / "stranger-key.pem"))
    stranger.cert_chain_pems[0].write_to_path(str(directory / "stranger.pem"))
    with pytest.raises(requests.ConnectionError):
        requests.get(f"https://{server.url}/v2/health/live", verify=ca_file, timeout=5,
                     cert=(str(directory / "stranger.pem"), str(directory / "stranger-key.pem")))
    good = grpcclient.InferenceServerClient(server.grpc_url, ssl=True, root_certificates=ca_file,
                                            private_key=pair[1], certificate_chain=pair[0])
    assert good.is_server_live()
    good.close()
    anonymous = grpcclient.InferenceServerClient(server.grpc_url, ssl=True, root_certificates=ca_file)
    with pytest.raises(InferenceServerException):
        anonymous.is_server_live(client_timeout=5)
    anonymous.close()
    # The server is still serving the client that has a certificate.
    channel = grpc.secure_channel(server.grpc_url, grpc.ssl_channel_credentials(
        Path(ca_file).read_bytes(), Path(pair[1]).read_bytes(), Path(pair[0]).read_bytes()))
    grpc.channel_ready_future(channel).result(timeout=10)
    channel.close()
