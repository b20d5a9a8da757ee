"""TLS for every port: one certificate and key (and optionally a CA that client certificates must chain to).

HTTP sites get one shared `ssl.SSLContext` (the standard library does the TLS); gRPC gets grpcio's dynamic
credentials, whose fetcher hands gRPC the new certificate after a reload. `reload()` (on SIGHUP) re-reads
the files: new handshakes use them, connections already open keep the certificate they began with.
One certificate serves every port because X.509 names hosts, not ports: all ports share the host's name.
"""

from __future__ import annotations

import logging
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc

log = logging.getLogger("modelhost.tls")


class TlsError(Exception):
    """A certificate, key or CA file cannot be used; the message names the file and why."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert: str  # PEM: the server certificate, then any intermediates
    key: str  # PEM: its private key, unencrypted
    ca: str | None = None  # PEM: when set, clients must present a certificate issued by it (mutual TLS)


class ServerTls:
    """The server's TLS state. Built on the loop at start (TlsError if the files do not load);
    `reload()` runs on the loop too; the gRPC fetcher runs on gRPC's own threads (hence the lock)."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self.context = _ssl_context(files)
        self._grpc_initial = _grpc_configuration(files)
        self._grpc_pending: grpc.ServerCertificateConfiguration | None = None
        self._lock = threading.Lock()

    def reload(self) -> None:
        """Re-read the files into the live context (new handshakes use them); TlsError, with nothing
        changed, when they do not load. A CA is added to those trusted: dropping one needs a restart."""
        _ssl_context(self.files)  # checks the new pair first: a failed load_cert_chain can leave a context half-set
        grpc_configuration = _grpc_configuration(self.files)
        try:
            self.context.load_cert_chain(self.files.cert, self.files.key, password=_no_password)
            if self.files.ca is not None:
                self.context.load_verify_locations(self.files.ca)
        except (OSError, ssl.SSLError) as exc:  # the files changed again between the check and the load
            raise TlsError(f"reloading {self.files.cert}: {exc}") from None
        with self._lock:
            self._grpc_pending = grpc_configuration

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """Credentials for grpc's add_secure_port that follow `reload()`."""
        return grpc.dynamic_ssl_server_credentials(self._grpc_initial, self._fetch_grpc_configuration,
                                                   require_client_authentication=self.files.ca is not None)

    def _fetch_grpc_configuration(self) -> grpc.ServerCertificateConfiguration | None:
        # Called by gRPC before each new handshake: None keeps the configuration it has.
        with self._lock:
            pending, self._grpc_pending = self._grpc_pending, None
        return pending


def _ssl_context(files: TlsFiles) -> ssl.SSLContext:
    # PROTOCOL_TLS_SERVER, not create_default_context(CLIENT_AUTH): that one would also trust the
    # system's CAs for client certificates; with mutual TLS only the operator's CA may issue them.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_RENEGOTIATION  # client-initiated renegotiation costs the server handshakes
    context.set_alpn_protocols(["http/1.1"])  # a client asking for h2 gets HTTP/1.1, what these sites speak
    try:
        context.load_cert_chain(files.cert, files.key, password=_no_password)
    except (OSError, ssl.SSLError, TlsError) as exc:
        raise TlsError(f"--tls-cert-file {files.cert} / --tls-key-file {files.key}: {_reason(exc)}") from None
    if files.ca is not None:
        try:
            context.load_verify_locations(files.ca)
        except (OSError, ssl.SSLError) as exc:
            raise TlsError(f"--tls-ca-file {files.ca}: {_reason(exc)}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _grpc_configuration(files: TlsFiles) -> grpc.ServerCertificateConfiguration:
    try:
        key, chain = Path(files.key).read_bytes(), Path(files.cert).read_bytes()
        ca = Path(files.ca).read_bytes() if files.ca is not None else None
    except OSError as exc:
        raise TlsError(f"{exc.filename}: {exc.strerror}") from None
    return grpc.ssl_server_certificate_configuration([(key, chain)], root_certificates=ca)


def _no_password() -> bytes:
    # Without this, OpenSSL would prompt on the terminal for an encrypted key and block the server.
    raise TlsError("the private key is encrypted; give an unencrypted key (protect it with file permissions)")


def _reason(exc: Exception) -> str:
    if isinstance(exc, TlsError):
        return str(exc)
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)
